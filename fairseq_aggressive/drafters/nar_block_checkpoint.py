"""Loading a ``block_nat`` drafter checkpoint for GAD and checking that it can
draft for the verifier (same vocabularies, a block drafter at all)."""
import os

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary


class DrafterMismatchError(ValueError):
    pass


def check_drafter(drafter_model, verifier_model, tgt_dict) -> None:
    """Clear errors for a drafter that cannot draft for this verifier."""
    name = type(drafter_model).__name__
    if not getattr(drafter_model, "is_block_drafter", False):
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
