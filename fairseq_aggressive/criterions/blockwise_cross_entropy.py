"""``blockwise_cross_entropy``: label-smoothed cross entropy over the k heads of
a ``transformer_blockwise`` model (Stern et al. 2018).

Head 1 is the base model's prediction of ``y_{t+1}`` at position t; head i
predicts ``y_{t+i}`` (positions whose target lies past the end are ignored).
``--blockwise-loss mean`` averages the k per-head losses;
``--blockwise-loss sampled`` trains one head chosen uniformly per batch (the
paper's memory-saving estimator: the same gradient in expectation, up to the
factor k).  Validation always reports the mean and every head's accuracy.
"""
import math
import random
from dataclasses import dataclass, field

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

MAX_LOGGED_HEADS = 16


@dataclass
class BlockwiseCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing epsilon"})
    blockwise_loss: ChoiceEnum(["mean", "sampled"]) = field(
        default="mean", metadata={"help": "mean of the k head losses, or one random head per batch"}
    )


@register_criterion("blockwise_cross_entropy", dataclass=BlockwiseCrossEntropyConfig)
class BlockwiseCrossEntropy(FairseqCriterion):
    def __init__(self, task, label_smoothing=0.1, blockwise_loss="mean"):
        super().__init__(task)
        self.eps = label_smoothing
        self.mode = str(blockwise_loss)

    def head_loss(self, logits, target):
        """Summed label-smoothed loss, nll and correct count of one head over non-pad targets."""
        keep = target.ne(self.padding_idx)
        lprobs = utils.log_softmax(logits[keep], dim=-1).float()
        tgt = target[keep]
        loss, nll = label_smoothed_nll_loss(lprobs, tgt, self.eps, ignore_index=None, reduce=True)
        correct = lprobs.argmax(-1).eq(tgt).sum()
        return loss, nll, int(tgt.numel()), correct

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
