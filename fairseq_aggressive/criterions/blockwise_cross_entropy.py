"""``blockwise_cross_entropy``: label-smoothed cross entropy over the k heads of
a ``transformer_blockwise`` model (Stern et al. 2018).

Head 1 is the base model's prediction of ``y_{t+1}`` at position t; head i
predicts ``y_{t+i}`` (positions whose target lies past the end are ignored).
``--blockwise-loss mean`` averages the k per-head losses;
``--blockwise-loss sampled`` trains one head chosen uniformly per batch (the
paper's memory-saving estimator: the same gradient in expectation, up to the
factor k).  ``--blockwise-loss per-position`` keeps the base's loss at every
position and draws one of heads 2..k per position: ``(base + (k-1) x drawn
head) / k`` is the mean's value in expectation at two vocabulary projections per
position instead of k, and the base is trained on every batch (with
``--freeze-base``: the drawn heads only); ``--blockwise-base-weight W`` makes it
``W x base + (1 - W) x drawn head`` (the mean's weights are W = 1/k): a larger W
keeps a base trained together with its heads closer to what it was.  Validation
always reports the mean and every head's accuracy.
"""
import math
import random
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

MAX_LOGGED_HEADS = 16


@dataclass
class BlockwiseCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing epsilon"})
    blockwise_loss: ChoiceEnum(["mean", "sampled", "per-position"]) = field(
        default="mean",
        metadata={"help": "mean of the k head losses; one random head per batch; or the base's loss "
                          "plus one random head 2..k per position (the mean in expectation)"},
    )
    blockwise_base_weight: Optional[float] = field(
        default=None,
        metadata={"help": "with --blockwise-loss per-position and a base that trains: the base's share W of "
                          "each token's loss, the drawn head's 1 - W (default 1/k, the mean's)"},
    )


@register_criterion("blockwise_cross_entropy", dataclass=BlockwiseCrossEntropyConfig)
class BlockwiseCrossEntropy(FairseqCriterion):
    def __init__(self, task, label_smoothing=0.1, blockwise_loss="mean", blockwise_base_weight=None):
        super().__init__(task)
        self.eps = label_smoothing
        self.mode = str(blockwise_loss)
        self.base_weight = blockwise_base_weight
        if blockwise_base_weight is not None:
            if self.mode != "per-position":
                raise ValueError("--blockwise-base-weight weighs the base against the drawn head of "
                                 f"--blockwise-loss per-position, not of {self.mode}")
            if not 0.0 < blockwise_base_weight < 1.0:
                raise ValueError(f"--blockwise-base-weight must lie strictly between 0 and 1, got "
                                 f"{blockwise_base_weight}")

    def head_loss(self, logits, target, hits=False):
        """Summed label-smoothed loss, nll and correct count of one head over non-pad targets
        (``hits``: instead of the count, whether each non-pad position was right)."""
        keep = target.ne(self.padding_idx)
        lprobs = utils.log_softmax(logits[keep], dim=-1).float()
        tgt = target[keep]
        loss, nll = label_smoothed_nll_loss(lprobs, tgt, self.eps, ignore_index=None, reduce=True)
        right = lprobs.detach().argmax(-1).eq(tgt)
        return loss, nll, int(tgt.numel()), (right if hits else right.sum())

    def forward(self, model, sample, reduce=True):
        if not getattr(model, "has_blockwise_heads", False):
            raise ValueError("--criterion blockwise_cross_entropy trains --arch transformer_blockwise models")
        net_input = sample["net_input"]
        target = sample["target"]
        B, T = target.shape
        k = model.blockwise_k
        # through the model's forward: under DistributedDataParallel that call is what makes
        # the backward pass average the gradients across processes (the heads run after it)
        feats, _ = model(net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"],
                         features_only=True)
        frozen_base = getattr(model.args, "freeze_base", False)
        if self.mode == "per-position" and model.training and k > 1:
            return self._per_position(model, feats, target, frozen_base)
        if self.mode == "sampled" and model.training:
            heads = [random.randrange(1 if frozen_base else 0, k)]
        else:
            heads = list(range(k))
        pad = target.new_full((B, k), self.padding_idx)
        shifted = torch.cat([target, pad], dim=1)
        head_in = None
        total_loss, logs = 0.0, {}
        n_heads_in_loss = 0
        for h in heads:  # h = 0 is the base model's head
            tgt_h = shifted[:, h : h + T]
            if h == 0:
                logits = model.decoder.output_layer(feats)
            else:
                if head_in is None:
                    head_in = model.blockwise_heads(feats)  # (B, T, k-1, d)
                logits = model.decoder.output_layer(head_in[:, :, h - 1])
            loss, nll, n, correct = self.head_loss(logits, tgt_h)
            if not (frozen_base and h == 0 and model.training):
                total_loss = total_loss + loss / max(n, 1)
                n_heads_in_loss += 1
            if h < MAX_LOGGED_HEADS:
                logs[f"head{h + 1}_correct"] = int(correct)
                logs[f"head{h + 1}_n"] = n
            logs.setdefault("loss_sum", 0.0)
            logs["loss_sum"] += float(loss.detach()) / max(n, 1)
            logs.setdefault("nll_sum", 0.0)
            logs["nll_sum"] += float(nll.detach()) / max(n, 1)
        n_tok = int(target.ne(self.padding_idx).sum())
        # per-token mean over heads, scaled back to a sum over tokens (fairseq divides by sample_size)
        loss = total_loss / max(n_heads_in_loss, 1) * n_tok
        logging_output = {
            "loss": float(logs["loss_sum"]) / len(heads) * n_tok,
            "nll_loss": float(logs["nll_sum"]) / len(heads) * n_tok,
            "ntokens": n_tok,
            "nsentences": B,
            "sample_size": n_tok,
        }
        logging_output.update({k_: v for k_, v in logs.items() if k_.startswith("head")})
        return loss, n_tok, logging_output

    def _per_position(self, model, feats, target, frozen_base):
        """The base's loss at every position plus, at each position, one of heads 2..k drawn
        uniformly; the training loss is ``(base + (k-1) x drawn) / k`` per token (``drawn`` only
        with a frozen base).  The logged accuracy of head h counts the positions that drew it."""
        B, T = target.shape
        k = model.blockwise_k
        pad = self.padding_idx
        shifted = torch.cat([target, target.new_full((B, k), pad)], dim=1)
        drawn = torch.randint(1, k, (B, T), device=target.device)  # head index 1..k-1 per position
        head_in = model.blockwise_heads(feats)  # (B, T, k-1, d)
        picked = head_in.gather(2, (drawn - 1)[:, :, None, None].expand(B, T, 1, head_in.size(-1))).squeeze(2)
        idx = torch.arange(T, device=target.device)[None, :] + drawn
        tgt_drawn = shifted.gather(1, idx)
        drawn_loss, drawn_nll, n_drawn, hits = self.head_loss(model.decoder.output_layer(picked), tgt_drawn,
                                                             hits=True)
        n_tok = int(target.ne(pad).sum())
        logs = {}
        heads_kept = drawn[tgt_drawn.ne(pad)]
        for h in range(1, min(k, MAX_LOGGED_HEADS)):
            sel = heads_kept.eq(h)
            logs[f"head{h + 1}_correct"] = int(hits[sel].sum())
            logs[f"head{h + 1}_n"] = int(sel.sum())
        per_tok_drawn = drawn_loss / max(n_drawn, 1)
        if frozen_base:
            loss = per_tok_drawn * n_tok
            shown, shown_nll = per_tok_drawn, drawn_nll / max(n_drawn, 1)
        else:
            base_loss, base_nll, n_base, base_correct = self.head_loss(model.decoder.output_layer(feats), target)
            logs["head1_correct"], logs["head1_n"] = int(base_correct), n_base
            per_tok_base = base_loss / max(n_base, 1)
            w = 1.0 / k if self.base_weight is None else self.base_weight
            loss = (w * per_tok_base + (1 - w) * per_tok_drawn) * n_tok
            shown = w * per_tok_base + (1 - w) * per_tok_drawn
            shown_nll = w * base_nll / max(n_base, 1) + (1 - w) * drawn_nll / max(n_drawn, 1)
        logging_output = {
            "loss": float(shown.detach()) * n_tok,
            "nll_loss": float(shown_nll.detach()) * n_tok,
            "ntokens": n_tok,
            "nsentences": B,
            "sample_size": n_tok,
        }
        logging_output.update(logs)
        return loss, n_tok, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)  # noqa: E731
        ntokens = total("ntokens")
        metrics.log_scalar("loss", total("loss") / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda m: utils.get_perplexity(m["nll_loss"].avg))
        for h in range(1, MAX_LOGGED_HEADS + 1):
            n = total(f"head{h}_n")
            if n:
                metrics.log_scalar(f"acc_h{h}", total(f"head{h}_correct") / n, n, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
