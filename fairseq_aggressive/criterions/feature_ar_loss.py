"""``feature_ar_loss``: training of a ``--feature-ar`` drafter (an
autoregressive drafter of the verifier's features, ``block_nat`` with
``--feature-ar``; see :mod:`fairseq_aggressive.models.block_nat`).

The frozen verifier runs teacher-forced over the target (the verifier's own
greedy outputs, for a drafter whose drafts must match them): ``f_i``, its
features at position ``i``, choose token ``i + 1``.  The drafter reads at
position ``i`` the token ``i`` and ``f_{i-1}`` (zeros at BOS) and its output
``h_i`` is trained to choose token ``i + 1`` through the shared output
projection (label-smoothed cross-entropy) and to equal ``f_i`` (smooth L1
averaged over the feature's dimensions, weight ``--feature-loss-weight``): at decoding time ``h_i`` stands in for
``f_i`` at the drafted positions, where the verifier has not run yet.

With ``--own-feature-rate r`` > 0 a second pass in training reads, at a share
``r`` of the positions, the drafter's own output of the first pass (detached)
in place of the verifier's features, as it does at every drafted position
after the first; its loss is added (the metrics ``acc`` and ``acc_own``: the
next-token accuracy with the verifier's features and with its own).
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass


@dataclass
class FeatureARLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing epsilon"})
    feature_loss_weight: float = field(
        default=1.0, metadata={"help": "weight of the smooth L1 loss between the drafter's outputs and the "
                               "verifier's features"})
    own_feature_rate: float = field(
        default=0.5, metadata={"help": "share of positions that read the drafter's own features in a second "
                               "training pass (0: no second pass)"})


def shift_right(feats: torch.Tensor) -> torch.Tensor:
    """Position ``i`` gets what position ``i - 1`` holds (zeros at 0)."""
    return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)


@register_criterion("feature_ar_loss", dataclass=FeatureARLossConfig)
class FeatureARLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing=0.1, feature_loss_weight=1.0, own_feature_rate=0.5):
        super().__init__(task)
        self.eps = label_smoothing
        self.feature_weight = feature_loss_weight
        if not 0.0 <= own_feature_rate <= 1.0:
            raise ValueError(f"--own-feature-rate must be in [0, 1], got {own_feature_rate}")
        self.own_rate = own_feature_rate

    def forward(self, model, sample, reduce=True):
        if not getattr(model, "feature_ar", False):
            raise ValueError("--criterion feature_ar_loss trains a --feature-ar drafter "
                             "(--arch block_nat --feature-ar --block-causal-prefix --verifier-features)")
        if model.decoder.own_feature_proj is not None:
            raise ValueError(
                "--criterion feature_ar_loss regresses the drafter's output onto the verifier's features: it "
                f"trains a drafter as wide as its verifier (this one is {model.decoder.embed_dim} wide, the "
                f"verifier's features {model.decoder.feature_proj.in_features})")
        net_input, target = sample["net_input"], sample["target"]
        prev = net_input["prev_output_tokens"]
        encoder_out = model.encode(net_input["src_tokens"], net_input["src_lengths"])
        verifier_feats = model.verifier_features(prev, encoder_out)  # f_i chooses target[:, i]
        mask = target.ne(self.padding_idx)
        none = torch.zeros_like(prev, dtype=torch.bool)

        def run(inputs):
            # through the model's forward (under DistributedDataParallel it averages the gradients)
            h, _ = model(net_input["src_tokens"], net_input["src_lengths"], prev, slots=none,
                         encoder_out=encoder_out, block=none, prefix_feats=inputs, features_only=True)
            return h

        def losses(h):
            lprobs = utils.log_softmax(model.decoder.output_layer(h[mask]), dim=-1).float()
            loss, nll = label_smoothed_nll_loss(lprobs, target[mask], self.eps, ignore_index=None, reduce=True)
            # per token, the mean over the feature's dimensions (summed over tokens, as the cross-entropy)
            feat = F.smooth_l1_loss(h[mask].float(), verifier_feats[mask].float(), reduction="sum") / h.size(-1)
            hits = lprobs.argmax(-1).eq(target[mask]).sum()
            return loss, nll, feat, hits

        h = run(shift_right(verifier_feats))
        loss, nll, feat, hits = losses(h)
        total = loss + self.feature_weight * feat
        hits_own = torch.zeros_like(hits)
        if self.own_rate > 0 and model.training:
            own = shift_right(h.detach())
            pick = torch.rand(prev.shape, device=prev.device) < self.own_rate
            h2 = run(torch.where(pick.unsqueeze(-1), own, shift_right(verifier_feats)))
            loss2, _, feat2, hits_own = losses(h2)
            total = total + loss2 + self.feature_weight * feat2
        n = int(mask.sum())
        logging_output = {
            "loss": total.data, "nll_loss": nll.data, "feature_loss": feat.data, "ntokens": n,
            "nsentences": target.size(0), "sample_size": n, "n_correct": int(hits), "n_correct_own": int(hits_own),
            "own_pass": int(self.own_rate > 0 and model.training),
        }
        return total, n, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)  # noqa: E731
        ntokens, sample_size = total("ntokens"), max(total("sample_size"), 1)
        metrics.log_scalar("loss", total("loss") / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda m: utils.get_perplexity(m["nll_loss"].avg))
        metrics.log_scalar("feature_loss", total("feature_loss") / sample_size, sample_size, round=4)
        metrics.log_scalar("acc", total("n_correct") / max(ntokens, 1), ntokens, round=3)
        own_tokens = sum(log.get("ntokens", 0) for log in logging_outputs if log.get("own_pass"))
        if own_tokens:
            metrics.log_scalar("acc_own", total("n_correct_own") / own_tokens, own_tokens, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
