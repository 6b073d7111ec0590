"""Loading a ``block_nat`` drafter checkpoint for GAD, checking that it can
draft for the verifier (same vocabularies, a block drafter at all), and
building GAD's drafter and rule from the decoding options (:func:`build_gad`)."""
import os

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary


class DrafterMismatchError(ValueError):
    pass


def check_drafter(drafter_model, verifier_model, tgt_dict, feature_ar: bool = False) -> None:
    """Clear errors for a drafter that cannot draft for this verifier
    (``feature_ar``: for ``--decoding feature-ar``, else for GAD)."""
    name = type(drafter_model).__name__
    if getattr(drafter_model, "feature_ar", False) != feature_ar and getattr(drafter_model, "shared_encoder", None) \
            is not None:
        raise DrafterMismatchError(
            "this drafter drafts autoregressively (--feature-ar): decode with --decoding feature-ar"
            if not feature_ar else
            "--decoding feature-ar needs a --feature-ar drafter (trained with --arch block_nat --feature-ar "
            "--criterion feature_ar_loss); this one is GAD's block drafter: decode with --decoding gad")
    if not feature_ar and not getattr(drafter_model, "is_block_drafter", False):
        raise DrafterMismatchError(
            f"--drafter-path must be a block_nat drafter (trained with --arch block_nat "
            f"--criterion glat_block_loss), got a {name}"
        )
    v_drafter = drafter_model.decoder.output_projection.out_features
    v_verifier = len(tgt_dict)
    if v_drafter != v_verifier:
        raise DrafterMismatchError(
            f"drafter and verifier dictionaries differ: the drafter predicts {v_drafter} "
            f"target symbols, the verifier's dictionary has {v_verifier}; train both on the "
            "same binarized data (same dict.*.txt)"
        )
    v_src = drafter_model.encoder.embed_tokens.num_embeddings
    v_src_verifier = verifier_model.encoder.embed_tokens.num_embeddings
    if v_src != v_src_verifier:
        raise DrafterMismatchError(
            f"drafter and verifier source dictionaries differ ({v_src} vs {v_src_verifier} symbols)"
        )
    proj = getattr(drafter_model.decoder, "feature_proj", None)
    width = getattr(getattr(verifier_model.decoder, "output_projection", None), "in_features", None)
    if getattr(drafter_model, "reads_verifier_features", False) and proj is not None and width is not None \
            and proj.in_features != width:
        raise DrafterMismatchError(
            f"this drafter reads verifier features of width {proj.in_features}, the verifier's are {width} "
            "wide: decode with the verifier the drafter was trained for")
    if getattr(drafter_model, "shared_encoder", False):
        check_shared_encoder(drafter_model, verifier_model)


def check_shared_encoder(drafter_model, verifier_model) -> None:
    """A ``--shared-encoder`` drafter reads the verifier's encoder output: that
    encoder must be the one it was trained on (its frozen copy).  Weights the
    verifier holds in another form (int8 layers) are not compared."""
    theirs = verifier_model.encoder.state_dict()
    compared, differ = 0, []
    for name, w in drafter_model.encoder.state_dict().items():
        v = theirs.get(name)
        if v is None or v.shape != w.shape or not w.is_floating_point() or not v.is_floating_point():
            continue
        compared += 1
        if not torch.equal(v.to(w.dtype), w):
            differ.append(name)
    if differ or compared == 0:
        src = getattr(getattr(drafter_model, "args", None), "encoder_initialized_from", None)
        raise DrafterMismatchError(
            "this drafter was trained on another encoder (--shared-encoder"
            + (f", from {src}" if src else "") + f"); the verifier's encoder differs in "
            f"{', '.join(differ[:3]) or 'every weight'}: decode with the verifier the drafter was trained for"
        )


def check_checkpoint_dictionaries(path: str, state, task) -> None:
    """Same target vocabulary size as ``task``'s, and the same symbols if the
    drafter's training data directory is on this machine."""
    emb = state["model"].get("decoder.embed_tokens.weight")
    if emb is not None and emb.size(0) != len(task.target_dictionary):
        raise DrafterMismatchError(
            f"drafter and verifier dictionaries differ: {path} has {emb.size(0)} target "
            f"symbols, the verifier's dictionary {len(task.target_dictionary)}; train both on "
            "the same binarized data (same dict.*.txt)"
        )
    task_cfg = state["cfg"].get("task")
    data = getattr(task_cfg, "data", None) if task_cfg is not None else None
    if not data:
        return
    for lang, ours in ((task.cfg.source_lang, task.source_dictionary),
                       (task.cfg.target_lang, task.target_dictionary)):
        f = os.path.join(data.split(os.pathsep)[0], f"dict.{lang}.txt")
        if lang and os.path.isfile(f) and Dictionary.load(f).symbols != ours.symbols:
            raise DrafterMismatchError(
                f"drafter and verifier dictionaries differ: {f} (the drafter's) is not the "
                f"verifier's {lang} dictionary; train both on the same binarized data"
            )


def load_block_drafter(task, path: str, device=None, dtype=None):
    """The block_nat model at ``path`` built by ``task``, on ``device`` in
    ``dtype``, in eval mode, and the block size it was trained with (or None)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--drafter-path: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state["cfg"]
    check_checkpoint_dictionaries(path, state, task)
    model = task.build_model(cfg["model"])
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg["model"])
    if device is not None:
        model = model.to(device=device)
    if dtype is not None:
        model = model.to(dtype=dtype)
    trained_k = getattr(cfg["task"], "block_size", None) if cfg.get("task") else None
    return model.eval(), trained_k


def drafter_shortlist(opts, task):
    """The vocabulary shortlist a drafter proposes from (``--drafter-shortlist``), or None."""
    if opts.drafter_shortlist is None:
        return None
    from ..shortlist import VocabShortlist

    return VocabShortlist(task.source_dictionary, task.target_dictionary, opts.drafter_shortlist)


def build_gad_drafter(task, models, opts):
    """GAD's NAR block drafter from ``--drafter-path``, checked against the verifier."""
    from ..engines import drafter_engine
    from ..runtime.cpu_features import use_bf16
    from ..runtime.threads import engine_threads
    from .nar_block import NARBlockDrafter

    if not opts.drafter_path:
        raise ValueError("--decoding gad needs a drafter: pass --drafter-path DRAFTER.pt")
    int8 = opts.drafter_precision == "int8"
    dtype = torch.bfloat16 if not int8 and use_bf16(opts.drafter_bf16, "--drafter-bf16") else None
    drafter_model, trained_k = task.load_drafter(opts.drafter_path, like=models[0], dtype=dtype,
                                                 precision=opts.drafter_precision)
    check_drafter(drafter_model, models[0], task.target_dictionary)
    k = opts.block_size
    if k is None:
        k = trained_k or 25
    # the drafter's engine runs on the verifier's threads
    return NARBlockDrafter(drafter_model, task.target_dictionary, k, engine=drafter_engine(opts.engine),
                           shortlist=drafter_shortlist(opts, task), threads=engine_threads(opts.native_threads), isa=opts.native_isa)


def build_gad(opts, task, models):
    """``--decoding gad``: (the block drafter, exact or GAD++ acceptance)."""
    from ..acceptance import build_acceptance

    return build_gad_drafter(task, models, opts), build_acceptance(opts.gad_beta, opts.gad_tau)
