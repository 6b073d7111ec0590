"""The benchmark's mode names: a base (``beam5``, ``greedy``, ``iad[@L][-bN][-cost]``,
``gad[++][-bf16][@K]``, ``feature-ar[@K]``, ``blockwise[-topK][-minL]``, a CTranslate2 mode) and
suffixes (``-native``/``-torch``, ``-int8``, ``-sl``, ``-dsl``, ``-dint8``, ``-pyloop``, ``-stream``,
``:TARGET``), each turned into the generation options it stands for
(:func:`mode_overrides`), and the greedy mode whose outputs another must equal
(:func:`reference_mode`).  The grammar is described in the command's help
(:mod:`fairseq_aggressive.bench.cli`) and docs/benchmark.md."""
import re
from typing import Dict

from ..options import check_isa
from .ct2 import COMPUTE_TYPES


# mode -> generation-arg overrides
MODES = {
    "beam5": dict(beam=5, decoding="beam"),
    "greedy": dict(beam=1, decoding="beam"),
    "iad": dict(beam=1, decoding="iad"),
}


GADPP_DEFAULT = dict(gad_beta=3, gad_tau=1.0)  # the paper's high-quality setting


SHORTLIST_DEFAULT = 1000  # -sl modes: the 1,000 most frequent tokens + the source tokens

# the mode names, as the command's help and the error for an unknown name say them
GRAMMAR = (
    "beam5, greedy, iad; beamN (fairseq's beam search of width N), beamN-native (the same in the engine), "
    "iad-beamN (the same drafted from the source, iad@L-beamN: drafts of at most L tokens); "
    "iad@L (drafts of at most L tokens), iad-bN (N branches after an edit), iad-cost "
    "(cost-aware draft lengths; combine as iad@L-bN-cost); gad, gad++ (GAD with --drafter-path; gad@K sets the "
    "block size, gad-bf16@K a bfloat16 drafter, a final -dsl the drafter shortlist, a final -dint8 an int8 "
    "drafter); feature-ar, feature-ar@K "
    "(the autoregressive feature drafter of --bench-feature-drafter or --drafter-path, K tokens per pass; "
    "feature-ar@K-cP: drafts end after a token the drafter gives less than P, --draft-confidence; "
    "-dsl and -dint8 as for gad); "
    "blockwise[-topK][-minL]; "
    "ct2, ct2-int8 (CTranslate2 greedy, float32 and int8, in a process of its own), ct2-best (CTranslate2 at "
    "its fastest compute type and thread count on this machine, timed on the first 40 sentences); each with "
    "-beamN (2, 3, 4, 5, 6, 8) for CTranslate2's beam search (ct2-best-beam5); "
    "-native / -torch pick the verifier of an aggressive mode (greedy-native: the engine's greedy); a final "
    "-int8 decodes an int8 copy of the model (iad-int8, greedy-int8); a final -sl decodes with the vocabulary "
    "shortlist of --bench-shortlist (approximate; greedy-sl is greedy on it); -pyloop after an IAD, GAD, feature-ar, "
    "blockwise or greedy-native mode runs the generator's loop in Python (iad-pyloop); :TARGET after a native mode runs that "
    "build target of the engine (iad:avx2); a final -stream after a native IAD, greedy-native, GAD, feature-ar or "
    "blockwise mode streams every sentence through --batch-size rows of the engine's running batch, a row that "
    "ends refilled at the next pass (iad-stream)"
)


def mode_overrides(name: str, args) -> Dict:
    """Generation overrides for a mode name (``beam5``, ``iad``, ``gad@8``, ``gad++`` ...).
    An aggressive mode may end in ``-native`` or ``-torch`` (the verifier engine,
    default ``--engine``); ``greedy-native`` is greedy search in the native
    engine (IAD with empty drafts).  A final ``:TARGET`` runs a native mode on
    that build target of the engine (``iad:avx2``, ``greedy-native-int8:avx512``)."""
    if ":" in name:  # a native mode on one build target of the engine (iad:avx2)
        base, isa = name.rsplit(":", 1)
        ov = mode_overrides(base, args)
        if ov.get("decoding", "beam") == "beam" or ov.get("engine") == "torch" or base in COMPUTE_TYPES:
            raise SystemExit(f"benchmark mode {name}: :TARGET applies to modes on the native engine")
        try:
            return dict(ov, native_isa=check_isa(isa) or "auto")
        except ValueError as e:
            raise SystemExit(f"benchmark mode {name}: {e}")
    if name.endswith("-stream"):  # every sentence through --batch-size rows of the engine's running batch
        ov = mode_overrides(name[: -len("-stream")], args)
        if ov.get("decoding") not in ("iad", "gad", "feature-ar", "blockwise") or ov.get("engine") == "torch" \
                or ov.get("python_loop"):
            raise SystemExit(f"benchmark mode {name}: -stream applies to native IAD, greedy-native, GAD, "
                             "feature-ar and blockwise modes")
        return dict(ov, bench_stream=True)
    if name.endswith("-pyloop"):  # the generator's loop in Python where the engine would run it
        ov = mode_overrides(name[: -len("-pyloop")], args)
        if ov.get("decoding") not in ("iad", "gad", "feature-ar", "blockwise") or ov.get("engine") == "torch":
            raise SystemExit(f"benchmark mode {name}: -pyloop applies to IAD, GAD, feature-ar, blockwise and "
                             "greedy-native modes")
        return dict(ov, python_loop=True)
    if name.endswith("-dsl"):  # GAD with the drafter shortlist (proposals only: still exact)
        ov = mode_overrides(name[: -len("-dsl")], args)
        if ov.get("decoding") not in ("gad", "feature-ar"):
            raise SystemExit(f"benchmark mode {name}: -dsl applies to gad and feature-ar modes")
        return dict(ov, drafter_shortlist=getattr(args, "bench_shortlist", None) or SHORTLIST_DEFAULT)
    if name.endswith("-dint8"):  # an int8 copy of the drafter (proposals only: still exact)
        ov = mode_overrides(name[: -len("-dint8")], args)
        if ov.get("decoding") not in ("gad", "feature-ar"):
            raise SystemExit(f"benchmark mode {name}: -dint8 applies to gad and feature-ar modes")
        return dict(ov, drafter_precision="int8")
    if name.endswith("-sl"):  # approximate: the vocabulary shortlist (greedy-sl: greedy on it)
        base = name[: -len("-sl")]
        if base in COMPUTE_TYPES or base in ("beam5", "beam5-int8"):
            raise SystemExit(f"benchmark mode {name}: -sl applies to aggressive modes and greedy")
        ov = mode_overrides(base, args)
        if base in ("greedy", "greedy-int8"):
            ov.update(decoding="iad", max_draft_len=0)
        return dict(ov, vocab_shortlist=getattr(args, "bench_shortlist", None) or SHORTLIST_DEFAULT)
    if name.endswith("-int8") and name not in COMPUTE_TYPES:
        return dict(mode_overrides(name[: -len("-int8")], args), inference_precision="int8")
    beam = re.fullmatch(r"beam(\d+)-native", name)
    if beam:  # fairseq's beam search in the engine
        if int(beam.group(1)) < 1:
            raise SystemExit(f"benchmark mode {name}: the beam must be >= 1")
        return dict(beam=int(beam.group(1)), decoding="beam", engine="native")
    drafted = re.fullmatch(r"iad(?:@(\d+))?-beam(\d+)", name)
    if drafted:  # the engine's beam search drafted from the source (--decoding iad --beam N)
        if int(drafted.group(2)) < 2:
            raise SystemExit(f"benchmark mode {name}: the beam must be >= 2 (iad is IAD's greedy search)")
        ov = dict(beam=int(drafted.group(2)), decoding="iad", engine="native")
        if drafted.group(1):
            ov["max_draft_len"] = int(drafted.group(1))
        return ov
    for engine in ("native", "torch"):
        if name.endswith("-" + engine) and name != "greedy-torch":
            base = name[: -len(engine) - 1]
            ov = dict(beam=1, decoding="iad", max_draft_len=0) if base == "greedy" else mode_overrides(base, args)
            if ov.get("decoding", "beam") == "beam" or base in COMPUTE_TYPES:
                raise SystemExit(f"benchmark mode {name}: -{engine} applies to aggressive modes and greedy")
            return dict(ov, engine=engine)
    if name in MODES:
        return dict(MODES[name])
    beam = re.fullmatch(r"beam(\d+)", name)
    if beam and int(beam.group(1)) >= 1:  # fairseq's beam search of that width
        return dict(beam=int(beam.group(1)), decoding="beam")
    if name in COMPUTE_TYPES:
        return {}
    m = re.fullmatch(r"iad(?:@(\d+))?(?:-b(\d+))?(-cost|-fixed)?", name)
    if m:  # IAD with a draft length cap (the SAD paper's Lmax), branches after an edit, a cost budget or fixed drafts
        ov = dict(beam=1, decoding="iad")
        if m.group(1):
            ov["max_draft_len"] = int(m.group(1))
        if m.group(2):
            ov["iad_branches"] = int(m.group(2))
        if m.group(3):
            ov["draft_cost"] = "auto" if m.group(3) == "-cost" else "off"
        return ov
    m = re.fullmatch(r"feature-ar(?:@(\d+))?(?:-c(0?\.\d+))?", name)
    if m:  # the autoregressive feature drafter (--decoding feature-ar), -cP: --draft-confidence P
        path = getattr(args, "bench_feature_drafter", None) or getattr(args, "drafter_path", None)
        if not path:
            raise SystemExit(f"benchmark mode {name} needs --bench-feature-drafter or --drafter-path DRAFTER.pt")
        ov = dict(beam=1, decoding="feature-ar", drafter_path=path, block_size=int(m.group(1) or 8))
        if m.group(2):
            ov["draft_confidence"] = float(m.group(2))
        return ov
    m = re.fullmatch(r"blockwise(?:-top(\d+))?(?:-min(\d+))?", name)
    if m:  # blockwise, blockwise-top3, blockwise-min2, blockwise-top3-min2
        return dict(beam=1, decoding="blockwise", blockwise_topk=int(m.group(1) or 1),
                    min_block_size=int(m.group(2) or 1))
    base, _, k = name.partition("@")
    bf16 = base.endswith("-bf16")
    base = base[: -len("-bf16")] if bf16 else base
    if base not in ("gad", "gad++") or (k and not k.isdigit()):
        raise SystemExit(
            f"unknown benchmark mode {name!r}; the modes: {GRAMMAR}")
    if not getattr(args, "drafter_path", None):
        raise SystemExit(f"benchmark mode {name} needs --drafter-path DRAFTER.pt")
    ov = dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=int(k) if k else None,
              drafter_bf16="auto" if bf16 else (getattr(args, "drafter_bf16", None) or "off"))
    if base == "gad++":
        user_beta = getattr(args, "gad_beta", 1)
        ov.update(GADPP_DEFAULT if user_beta == 1 else dict(gad_beta=user_beta, gad_tau=args.gad_tau))
    return ov


def without_target(mode: str) -> str:
    """The mode without its ``:TARGET`` (the engine's build target)."""
    return mode.rsplit(":", 1)[0]


def verifier_mode(mode: str) -> str:
    """``mode`` without what leaves its verifier's model as it is: the build target, the
    drafter's settings and the loop's (``feature-ar@8-int8-dint8`` -> ``feature-ar@8-int8``)."""
    mode = without_target(mode)
    drafter_only = ("-pyloop", "-dsl", "-dint8", "-stream")
    while mode.endswith(drafter_only):
        mode = mode.rsplit("-", 1)[0]
    return mode


def reference_mode(mode: str, modes) -> str:
    """The mode whose outputs ``mode`` must equal: greedy of the same model
    (int8: ``greedy-int8``; shortlist: ``greedy-sl`` / ``greedy-int8-sl``);
    the engine's beam search: fairseq's of the same width (``beam5-native``:
    ``beam5``; ``beam5-native-int8``: ``beam5-int8``) where the run has it;
    drafted beam search: the engine's (``iad-beam5``: ``beam5-native``), else fairseq's."""
    mode = verifier_mode(mode)
    beam = re.fullmatch(r"(beam\d+)-native(-int8)?", mode)
    if beam and beam.group(1) + (beam.group(2) or "") in modes:
        return beam.group(1) + (beam.group(2) or "")
    drafted = re.fullmatch(r"iad(?:@\d+)?-(beam\d+)(-int8)?", mode)
    if drafted:
        for ref in (drafted.group(1) + "-native", drafted.group(1)):
            if ref + (drafted.group(2) or "") in modes:
                return ref + (drafted.group(2) or "")
    sl = mode.endswith("-sl")
    base = mode[: -len("-sl")] if sl else mode
    int8 = base.endswith("-int8") and base not in COMPUTE_TYPES
    ref = "greedy" + ("-int8" if int8 else "") + ("-sl" if sl else "")
    return ref if ref in modes else "greedy"
