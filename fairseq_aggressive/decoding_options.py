"""What ``--decoding`` and its options mean, each declared once.

Every decoding option is one :class:`Option` row of :data:`OPTIONS`: its name,
its command-line type, default and help (the task's configuration,
``tasks/config.py``, is made from these rows) and how its value is read and
checked (the functions of :mod:`fairseq_aggressive.options`, whose messages
name the flags).  :class:`DecodingOptions` has a field per row;
:meth:`DecodingOptions.read` takes every option through one ``option(name)``
callable (the task's: per-call generation arguments of the hub API win over
the task configuration), reads each with its row, checks the options that
constrain each other, and returns a frozen description;
:mod:`fairseq_aggressive.decoding` builds the drafter, the acceptance rule and
the generator from it.  The task reads its configuration this way when it is
created, so a bad value stops ``fairseq-train`` and ``fairseq-generate``
before anything loads.  The module loads neither torch nor fairseq (a choice's
type is a tuple of its choices, fairseq's ``ChoiceEnum`` only in the task's
field), so the command lines build their parsers at once."""
import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from .constants import DEFAULT_MAX_DRAFT_LEN, ENGINES, PRECISION_CHOICES, PRECISIONS
from .drafters import DECODINGS
from .options import (check_block_size, check_confidence, check_draft_cost, check_iad_branches, check_isa,
                      check_max_draft_len, check_positive_int, check_shortlist)
from .runtime.threads import parse_threads


def _one_of(flag: str, choices):
    def read(value):
        value = str(value)
        if value not in choices:
            raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
        return str(value)
    return read


def _draft_cost(value):
    if value not in (None, "off", "auto"):
        check_draft_cost(value)
    return value


def _optional_positive(flag: str):
    return lambda value: None if value is None else check_positive_int(value, flag)


def _decoding(value):
    value = str(value)
    if value != "beam" and value not in DECODINGS:
        raise ValueError(f"unknown --decoding {value!r}; choose from beam, {', '.join(DECODINGS)}")
    return str(value)


@dataclass(frozen=True)
class Option:
    """One decoding option: its command-line ``type`` (a tuple of its choices
    for a choice), ``default`` and ``help`` (``metadata``: more of the
    field's metadata), and ``read``: its value in :class:`DecodingOptions`
    from the command line's (the default where unset), checked."""

    name: str
    type: object
    default: object
    help: str
    read: Callable[[object], object] = lambda value: value
    metadata: dict = dataclasses.field(default_factory=dict)

    def task_field(self):
        """(name, type, field) of the task's configuration dataclass (a choice's type
        fairseq's ``ChoiceEnum``)."""
        kind = self.type
        if isinstance(kind, tuple):
            from fairseq.dataclass import ChoiceEnum

            kind = ChoiceEnum(list(kind))
        return self.name, kind, dataclasses.field(default=self.default,
                                                       metadata={"help": self.help, **self.metadata})


OPTIONS = (
    Option("decoding", ("beam", *DECODINGS), "beam",
           "decoder: beam = fairseq's SequenceGenerator (beam search / greedy); iad = input-guided aggressive "
           "decoding; gad = a block_nat drafter (--drafter-path) proposes --block-size tokens per pass (both "
           "greedy-exact unless --gad-beta > 1, need --beam 1); blockwise = the proposal heads of a "
           "transformer_blockwise model (exact unless --blockwise-topk/--min-block-size); feature-ar = a "
           "block_nat --feature-ar drafter (--drafter-path) drafts --block-size tokens one after the other "
           "from the verifier's features (greedy-exact)", _decoding),
    Option("max_draft_len", Optional[int], None,
           f"longest draft verified in one pass (Lmax); unset: {DEFAULT_MAX_DRAFT_LEN['engine']} under the native "
           f"engine's draft-length policy, {DEFAULT_MAX_DRAFT_LEN['native']} with --draft-cost off, "
           f"{DEFAULT_MAX_DRAFT_LEN['budget']} with --draft-cost FIXED,PER_POSITION, unlimited with the torch "
           f"verifier, {DEFAULT_MAX_DRAFT_LEN['beam']} for drafted beam search", check_max_draft_len),
    Option("iad_ngram_min", int, 1, "IAD: shortest output suffix used to re-find the place in the source", int),
    Option("iad_ngram_max", int, 4, "IAD: longest output suffix used to re-find the place in the source", int),
    Option("iad_branches", int, 1,
           "IAD: after an edit, verify up to N copies of the source in one pass, one per alignment of the edit "
           "(substitution, insertion or deletion of 1-2 tokens, the unique suffix match), and keep the one that "
           "accepts most (native engine; exact). 1 = the paper's single draft", check_iad_branches),
    Option("draft_cost", Optional[str], None,
           "cost-aware draft lengths (native engine, IAD). unset/auto: the engine's loop chooses each pass's "
           "lengths from its measured pass cost and the acceptance it learns (with --iad-branches > 1, auto "
           "measures the cost on the first batch for the generator's loop); FIXED,PER_POSITION: a given cost in "
           "ms for the generator's loop; off: the drafts as made (--max-draft-len)", _draft_cost),
    Option("drafter_path", Optional[str], None, "GAD: checkpoint of the block_nat drafter"),
    Option("block_size", Optional[int], None,
           "block_nat: tokens drafted per block (k); training default 25, decoding default = the drafter's "
           "training value", check_block_size),
    Option("drafter_bf16", PRECISION_CHOICES, "off",
           "GAD: run the drafter in bfloat16: auto (the bare flag) = only where the CPU has native bf16 "
           "(AVX-512 BF16, AMX), else float32 with a warning; on = always; off. The verifier stays fp32, so "
           "exact GAD still equals greedy", _one_of("--drafter-bf16", PRECISION_CHOICES),
           {"argparse_const": "auto"}),
    Option("draft_confidence", float, 0.0,
           "feature-ar: a draft ends after its first token whose probability under the drafter is below this "
           "(0 = off: drafts of --block-size tokens); shorter drafts where the drafter is unsure, fewer drafting "
           "steps and verified positions; the output stays greedy's", check_confidence),
    Option("drafter_precision", PRECISIONS, "float32",
           "GAD, feature-ar: int8 = the drafter's linear layers in int8 (the arithmetic of --inference-precision "
           "int8), cheaper drafting steps; proposals only: the verifier (any precision) decides, so exact "
           "decoding still gives the verifier's greedy output", _one_of("--drafter-precision", PRECISIONS)),
    Option("drafter_shortlist", Optional[int], None,
           "GAD: the drafter proposes only among the special symbols, the N most frequent tokens and the "
           "sentence's source tokens, and projects to those only (cheaper drafting passes). Proposals only: the "
           "verifier's choices, and exact GAD's output, stay greedy's", _optional_positive("--drafter-shortlist")),
    Option("gad_beta", int, 1, "GAD++: accept a drafted token in the verifier's top-beta (1 = exact)", int),
    Option("gad_tau", Optional[float], None,
           "GAD++: ... whose log-prob is within tau of the top-1's; needed with --gad-beta > 1 (the GAD paper's "
           "base settings: 3 and 1.0 for high quality, 5 and 3.0 for high efficiency)",
           lambda value: 0.0 if value is None else float(value)),
    Option("blockwise_topk", int, 1, "blockwise: accept a proposed token in the verifier's top-K (1 = exact)", int),
    Option("min_block_size", int, 1, "blockwise: every pass emits at least this many tokens (1 = exact)", int),
    Option("engine", ENGINES, "auto",
           "verifier of --decoding iad/gad/blockwise: native = the compiled CPU engine (fairseq_aggressive/native, "
           "compiled into the package per instruction set; standard Transformers; exact, GAD++ and top-k "
           "acceptance); torch = the torch verifier; auto = native where it runs, else torch (the output is the "
           "same either way). A GAD drafter follows: torch with torch, else native where it runs. With "
           "--decoding beam, native runs fairseq's beam search (--beam, --nbest, --lenpen, --unkpen, --min-len, "
           "...) in the engine, with the same output; auto and torch keep fairseq's own generator",
           _one_of("--engine", ENGINES)),
    Option("native_threads", str, "auto",
           "threads of the native engine (and a native GAD drafter): auto = the CPUs this process may use (its "
           "CPU affinity within a cgroup CPU quota), or a number; FAIRSEQ_AGGRESSIVE_NATIVE_THREADS sets it for "
           "every model. A service running W decoder processes on N cores gives each N/W "
           "(docs/threads-and-load.md)", parse_threads),
    Option("python_loop", bool, False,
           "run the draft -> verify -> accept loop in Python, one engine call per pass, also where the native "
           "engine runs it itself (IAD with one branch unless --draft-cost FIXED,PER_POSITION, greedy with "
           "--max-draft-len 0: one call per batch); the output is the same either way", bool),
    Option("native_isa", str, "auto",
           "the native engine's build target: auto = the best this CPU runs (avx512amx, avx512vnni, avx512, "
           "avx2, generic on x86-64; neon-dotprod, neon, generic on aarch64), or one of them by name; every target gives the same "
           "output, only the speed differs. FAIRSEQ_AGGRESSIVE_ISA sets it for every model "
           "(docs/exactness-and-portability.md)", check_isa),
    Option("vocab_shortlist", Optional[int], None,
           "approximate: each sentence chooses among the special symbols, the N most frequent tokens and its "
           "source tokens (Devlin 2017), and the verifier projects to those only; aggressive decoding then gives "
           "greedy's output of this shortlisted model (greedy: --decoding iad --max-draft-len 0), not of the "
           "full one", _optional_positive("--vocab-shortlist")),
)


def _read(cls, option: Callable[[str], object]) -> "DecodingOptions":
    """Every option through ``option(name)`` (None: its default), read and checked."""
    from .acceptance import build_acceptance, build_blockwise_acceptance

    raw = {o.name: option(o.name) for o in OPTIONS}
    given = {o.name: (o.default if raw[o.name] is None else raw[o.name]) for o in OPTIONS}
    values = {o.name: o.read(given[o.name]) for o in OPTIONS}
    lo, hi = values["iad_ngram_min"], values["iad_ngram_max"]
    if lo < 1 or hi < lo:
        raise ValueError(f"--iad-ngram-min/--iad-ngram-max must satisfy 1 <= min <= max, got {lo}..{hi}")
    if values["drafter_precision"] == "int8" and values["drafter_bf16"] == "on":
        raise ValueError("--drafter-precision int8 and --drafter-bf16 on: choose one precision for the drafter")
    if raw["gad_tau"] is None and values["gad_beta"] > 1:
        raise ValueError(f"--gad-beta {values['gad_beta']} needs --gad-tau: the GAD paper's base settings are "
                         "--gad-beta 3 --gad-tau 1.0 (high quality) and --gad-beta 5 --gad-tau 3.0 "
                         "(high efficiency), tuned per direction (Ge et al. 2022, Table 14)")
    build_acceptance(values["gad_beta"], values["gad_tau"])  # the rules check their own parameters
    build_blockwise_acceptance(values["blockwise_topk"], values["min_block_size"])
    check_shortlist(values["vocab_shortlist"], values["decoding"])
    return cls(**values)


DecodingOptions = dataclasses.make_dataclass(
    "DecodingOptions",
    [(o.name, object, dataclasses.field(default=o.read(o.default))) for o in OPTIONS],
    frozen=True,
    namespace={
        "__doc__": "The decoding options of :data:`OPTIONS`, read and checked (:meth:`read`); "
                   "``decoding`` is ``beam`` or an aggressive decoding.",
        "__module__": __name__,
        "aggressive": property(lambda self: self.decoding != "beam",
                               doc="Whether the decoding is aggressive (not fairseq's own beam search)."),
        "read": classmethod(_read),
    },
)
