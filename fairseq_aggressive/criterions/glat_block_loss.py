"""``glat_block_loss``: block training of the ``block_nat`` drafter with
glancing (GLAT, Qian et al. 2021).  A ``--verifier-features`` drafter also
reads the verifier's features of the prefix (teacher-forced, frozen).

Per target sentence a random cut point ``c`` (0 <= c < length, EOS counted):
the decoder reads ``[bos, y_1 .. y_c]`` followed by ``k`` mask slots and
predicts ``y_{c+1} .. y_{c+k}`` (slots past EOS are padding and ignored).
Glancing: a no-grad pass predicts every slot; of the wrongly predicted slots a
share ``ratio * n_wrong`` (rounded down, ratio annealed linearly from
``--glat-start`` to ``--glat-end`` over ``--glat-anneal-updates``) is revealed
(the slot gets the reference token's embedding), and the label-smoothed loss is
taken on the slots still masked.  Validation uses no glancing and counts all
block positions.
"""
import math
from dataclasses import dataclass, field
from typing import Tuple

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from torch import Tensor

from ..options import check_block_size

DEFAULT_BLOCK_SIZE = 25


@dataclass
class GlatBlockLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing epsilon"})
    glat_start: float = field(default=0.5, metadata={"help": "glancing ratio at update 0"})
    glat_end: float = field(default=0.3, metadata={"help": "glancing ratio after the anneal"})
    glat_anneal_updates: int = field(
        default=100000, metadata={"help": "updates over which the ratio goes start -> end"}
    )


def make_blocks(prev_output_tokens: Tensor, target: Tensor, pad: int, k: int, cut: Tensor
                ) -> Tuple[Tensor, Tensor, Tensor]:
    """Decoder inputs for block training, vectorised over the batch.

    ``prev_output_tokens``/``target`` (B, L) are fairseq's right-padded
    teacher-forcing pair; ``cut`` (B,) the prefix lengths.  Returns ``tokens``
    (B, W) = ``[bos, y_1..y_c, slot x k, pad..]`` (slot ids are the reference
    tokens, for glancing), ``slots`` (B, W) bool and ``block_target`` (B, W)
    (reference at slot positions inside the sentence, ``pad`` elsewhere)."""
    B, L = target.shape
    lengths = target.ne(pad).sum(1)
    W = int(cut.max()) + 1 + k
    idx = torch.arange(W, device=target.device).unsqueeze(0)  # (1, W)
    c = cut.unsqueeze(1)
    prefix = idx <= c
    slots = (idx > c) & (idx <= c + k)
    prev = prev_output_tokens.gather(1, idx.clamp(max=L - 1).expand(B, W))
    ref_pos = (idx - 1).clamp(min=0)
    inside = slots & (ref_pos < lengths.unsqueeze(1))
    ref = target.gather(1, ref_pos.clamp(max=L - 1).expand(B, W))
    block_target = torch.where(inside, ref, torch.full_like(ref, pad))
    # slots past EOS still need a non-pad id so they get positions; their
    # embedding is the mask embedding anyway
    slot_ids = torch.where(inside, ref, torch.full_like(ref, pad + 1 if pad == 0 else 0))
    tokens = torch.where(prefix, prev, torch.where(slots, slot_ids, torch.full_like(prev, pad)))
    return tokens, slots, block_target


MAX_SLOTS_LOGGED = 8


def slot_counts(hit: Tensor, counted: Tensor, cut: Tensor, k: int, leading: bool) -> dict:
    """Logging counts of block predictions: ``hit`` (B, W) correct predictions
    among the ``counted`` positions, the block of row ``b`` starting at
    ``cut[b] + 1``.  ``n_correct``; per slot ``i`` (1-based, up to
    ``MAX_SLOTS_LOGGED``) ``n_slot{i}``/``n_correct{i}``; with ``leading`` the
    rows and their runs of correct slots from the first (``n_leading``), which is
    how many drafted tokens exact GAD would accept (all of a block that ends the
    sentence when every slot is correct)."""
    W = hit.size(1)
    slot = torch.arange(W, device=hit.device).unsqueeze(0) - cut.unsqueeze(1)  # 1 = first slot
    out = {"n_correct": int(hit.sum())}
    for i in range(1, min(k, MAX_SLOTS_LOGGED) + 1):
        at = counted & slot.eq(i)
        out[f"n_slot{i}"] = int(at.sum())
        out[f"n_correct{i}"] = int((hit & at).sum())
    if leading:
        miss = counted & ~hit  # first wrong slot ends the run
        in_block = (slot >= 1) & (slot <= k)
        first_miss = torch.where(miss & in_block, slot, torch.full_like(slot, k + 1)).min(1).values
        n_counted = (counted & in_block).sum(1)
        out["n_leading"] = int(torch.minimum(first_miss - 1, n_counted).sum())
        out["n_rows"] = int(hit.size(0))
    return out


def reveal(wrong: Tensor, ratio: float, generator=None) -> Tensor:
    """Choose ``floor(ratio * n_wrong)`` of each row's wrong slots at random."""
    n_reveal = (wrong.sum(1).float() * ratio).floor().long()
    noise = torch.rand(wrong.shape, device=wrong.device, generator=generator)
    noise = noise.masked_fill(~wrong, -1.0)
    order = noise.argsort(dim=1, descending=True)
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(wrong.size(1), device=wrong.device).expand_as(order)
    )
    return wrong & (rank < n_reveal.unsqueeze(1))


@register_criterion("glat_block_loss", dataclass=GlatBlockLossConfig)
class GlatBlockLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing=0.1, glat_start=0.5, glat_end=0.3,
                 glat_anneal_updates=100000):
        super().__init__(task)
        if not 0 <= glat_end <= 1 or not 0 <= glat_start <= 1:
            raise ValueError("--glat-start and --glat-end must lie in [0, 1]")
        if glat_anneal_updates < 0:
            raise ValueError("--glat-anneal-updates must be >= 0")
        self.eps = label_smoothing
        self.glat_start, self.glat_end = glat_start, glat_end
        self.glat_anneal_updates = glat_anneal_updates
        k = getattr(getattr(task, "cfg", None), "block_size", None)
        self.block_size = check_block_size(k) or DEFAULT_BLOCK_SIZE

    def glat_ratio(self, num_updates: int) -> float:
        if self.glat_anneal_updates == 0:
            return self.glat_end
        t = min(1.0, num_updates / self.glat_anneal_updates)
        return self.glat_start + (self.glat_end - self.glat_start) * t

    def forward(self, model, sample, reduce=True):
        if not getattr(model, "is_block_drafter", False):
            raise ValueError("--criterion glat_block_loss trains --arch block_nat models")
        net_input = sample["net_input"]
        target = sample["target"]
        lengths = target.ne(self.padding_idx).sum(1)
        # Cut points and glancing are drawn from the batch's own sentence ids (and, in training,
        # the update number): the same draws whichever process or accumulation step gets the
        # batch, so 2 processes train what one process with --update-freq 2 trains; and the
        # same cut points at every validation
        num_updates = getattr(model, "num_updates", 0)
        gen = torch.Generator(device=target.device)
        gen.manual_seed(int(sample["id"].sum()) + 1 + (1_000_003 * (num_updates + 1) if model.training else 0))
        u = torch.rand(lengths.shape, device=target.device, generator=gen)
        cut = torch.minimum((u * lengths.float()).floor().long(), lengths - 1).clamp(min=0)
        tokens, slots, block_target = make_blocks(
            net_input["prev_output_tokens"], target, self.padding_idx, self.block_size, cut
        )
        encoder_out = model.encode(net_input["src_tokens"], net_input["src_lengths"])
        prefix_feats = None
        if getattr(model, "reads_verifier_features", False):  # what the verifier knows of each prefix token
            full = model.verifier_prefix_features(net_input["prev_output_tokens"], encoder_out)
            cols = torch.arange(tokens.size(1), device=full.device).clamp(max=full.size(1) - 1)
            prefix_feats = full[:, cols]  # row positions are target positions; the block's are not read
        valid = block_target.ne(self.padding_idx)
        block = slots  # the positions after the prefix (glancing reveals some, they stay block positions)

        ratio = self.glat_ratio(num_updates) if model.training else 0.0
        n_revealed = 0
        loss_mask = valid
        if ratio > 0:
            with torch.no_grad():
                pred = model.block_logits(tokens, slots, encoder_out, block=block,
                                          prefix_feats=prefix_feats).argmax(-1)
            wrong = torch.zeros_like(slots)
            wrong[slots] = pred.ne(block_target[slots])
            shown = reveal(wrong & valid, ratio, generator=gen)
            n_revealed = int(shown.sum())
            slots = slots & ~shown
            loss_mask = valid & ~shown

        # through the model's forward: under DistributedDataParallel that call is what makes
        # the backward pass average the gradients across processes
        feats, _ = model(net_input["src_tokens"], net_input["src_lengths"], tokens, slots=slots,
                         encoder_out=encoder_out, block=block, prefix_feats=prefix_feats, features_only=True)
        logits = model.decoder.output_layer(feats[loss_mask])
        lprobs = utils.log_softmax(logits, dim=-1, onnx_trace=False).float()
        tgt = block_target[loss_mask]
        loss, nll_loss = label_smoothed_nll_loss(lprobs, tgt, self.eps, ignore_index=None, reduce=True)
        n_tokens = int(tgt.numel())
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": n_tokens,
            "nsentences": target.size(0),
            "sample_size": n_tokens,
            "n_revealed": n_revealed,
            "glat_ratio": ratio,
        }
        with torch.no_grad():
            hit = torch.zeros_like(loss_mask)
            hit[loss_mask] = lprobs.argmax(-1).eq(tgt)
            logging_output.update(slot_counts(hit, loss_mask, cut, self.block_size, leading=ratio == 0))
        return loss, n_tokens, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)  # noqa: E731
        loss, nll = total("loss"), total("nll_loss")
        ntokens, sample_size = total("ntokens"), total("sample_size")
        denom = max(sample_size, 1) * math.log(2)
        metrics.log_scalar("loss", loss / denom, sample_size, round=3)
        metrics.log_scalar("nll_loss", nll / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda m: utils.get_perplexity(m["nll_loss"].avg))
        metrics.log_scalar("block_acc", total("n_correct") / max(ntokens, 1), ntokens, round=3)
        for i in range(1, MAX_SLOTS_LOGGED + 1):  # accuracy of slot i (the i-th drafted token)
            n = total(f"n_slot{i}")
            if n:
                metrics.log_scalar(f"acc{i}", total(f"n_correct{i}") / n, n, round=3)
        n_rows = total("n_rows")
        if n_rows:  # no glancing (validation): the mean run of correct slots from the first
            metrics.log_scalar("lead", total("n_leading") / n_rows, n_rows, round=2)
        n_logs = max(len(logging_outputs), 1)
        metrics.log_scalar("glat_ratio", total("glat_ratio") / n_logs, round=3)
        metrics.log_scalar("revealed", total("n_revealed") / max(total("nsentences"), 1), round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
