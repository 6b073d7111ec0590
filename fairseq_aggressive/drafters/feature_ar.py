"""The autoregressive feature drafter (``--decoding feature-ar``): a
``block_nat --feature-ar`` model drafts k tokens one after the other.

The drafter's decoder reads the sentence so far, each token with the
verifier's features that chose it (:meth:`observe_emitted`), and chooses the
next token from its output at the last position; each drafted token is then
read with the drafter's own output there in place of the verifier's features
(which the verifier computes only when it checks the draft), and so on k
times.  The verifier checks the k tokens in one pass with greedy's rule, so
the output is greedy's whatever the drafter proposes.  The drafter runs in
the native engine where it can (one call per pass: the new tokens, then k
one-token steps), else in torch (here: the whole row per drafted token).
With the native verifier too, the engine runs the whole loop, one call per
batch (:meth:`FeatureARDrafter.decode_in_engine`).
"""
from typing import List, Optional

import torch

from ..options import check_confidence, check_positive_int
from .base import Branch, EngineDrafter, drafts_as, single_drafts
from .nar_block import NARBlockDrafter


class FeatureARDrafter(NARBlockDrafter):
    def __init__(self, model, tgt_dict, draft_len: int, engine: str = "auto", threads=None, isa=None,
                 shortlist=None, min_prob: float = 0.0):
        """``engine``: where it drafts (auto: the native engine where it runs, else torch);
        ``threads``, ``isa``: the native engine's, as the verifier's; ``shortlist``: a
        :class:`~fairseq_aggressive.shortlist.VocabShortlist` it drafts from
        (``--drafter-shortlist``: cheaper draft steps, the output still greedy's);
        ``min_prob`` (``--draft-confidence``): a draft ends after its first token whose
        probability under the drafter is below it (0: drafts of ``draft_len``)."""
        if not getattr(model, "feature_ar", False):
            raise ValueError("--decoding feature-ar needs a --feature-ar drafter "
                             "(trained with --arch block_nat --feature-ar --criterion feature_ar_loss)")
        super().__init__(model, tgt_dict, check_positive_int(draft_len, "--block-size"), engine=engine,
                         threads=threads, isa=isa, shortlist=shortlist)
        self.min_prob = check_confidence(min_prob)

    def engine_drafter(self, verifier) -> Optional[EngineDrafter]:
        # the engine's feature drafter makes the drafts of propose() and observe_emitted() as written here
        if self.native is None or not drafts_as(self, FeatureARDrafter, ("propose", "observe_emitted", "update")):
            return None
        # (a shortlist of the drafter's is set up per batch by begin(): rows that join one by one have none)
        return EngineDrafter("feature", dict(bos=self.bos, k=self.k, room=self.max_positions - 1,
                                             min_prob=self.min_prob, shared_encoder=self.caps.encoder_out),
                             engine=self.native.engine, joins=self.shortlist is None)

    @torch.no_grad()
    def propose(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        if self.encoder_out is None:  # the native engine drafts this batch (csrc/loop/block_drafter.cpp)
            return super().propose(sents, outputs, caps)
        # bos + prefix + drafted tokens must fit the drafter's positions
        ks = [max(0, min(self.k, c, self.max_positions - 1 - len(o))) for c, o in zip(caps, outputs)]
        if max(ks) == 0:
            return single_drafts([[] for _ in sents])
        enc = self._encoder_rows(sents)
        rows = [[self.bos] + out for out in outputs]
        idx = torch.tensor(sents, dtype=torch.long, device=self._feats.device)
        width = max(len(r) for r in rows) + max(ks)
        feats = self._feats.index_select(0, idx)[:, :width].clone()  # row position i: what chose token i
        for s, r in zip(sents, rows):
            if len(r) > self._n_feats[s]:
                raise RuntimeError(f"drafter: sentence {s} has {self._n_feats[s] - 1} emitted tokens' features, "
                                   f"its row {len(r) - 1} tokens (the generator must call observe_emitted)")
        drafts: List[List[int]] = [[] for _ in sents]
        device = enc["encoder_out"][0].device
        # a drafter narrower than its verifier reads its own outputs through a projection of their own
        own = None
        if self.model.decoder.own_feature_proj is not None:
            own = (torch.zeros(feats.shape[:2], dtype=torch.bool, device=device),
                   torch.zeros(*feats.shape[:2], self.model.decoder.embed_dim, device=device))
        ended = [False] * len(sents)  # at an EOS or a token below min_prob
        for step in range(max(ks)):
            live = [b for b, k in enumerate(ks) if len(drafts[b]) < k and not ended[b]]
            if not live:
                break
            w = max(len(rows[b]) for b in live)
            tokens = torch.full((len(sents), w), self.pad, dtype=torch.long, device=device)
            for b, r in enumerate(rows):
                tokens[b, : min(len(r), w)] = torch.tensor(r[:w], dtype=torch.long)
            none = torch.zeros_like(tokens, dtype=torch.bool)
            h = self.model.decoder.extract_block_features(
                tokens, none, enc, block=none, prefix_feats=feats[:, :w].to(device),
                own=None if own is None else (own[0][:, :w], own[1][:, :w]))
            last = torch.tensor([len(rows[b]) - 1 for b in live], device=device)
            at = h[torch.tensor(live, device=device), last]  # (live, C): what chooses each next token
            logits = self.model.decoder.output_layer(at)
            logits[:, self.pad] = -float("inf")
            if self._allowed is not None:  # the drafter shortlist
                allowed = self._allowed[torch.tensor([sents[b] for b in live], device=self._allowed.device)]
                logits = logits.masked_fill(~allowed.to(logits.device), -float("inf"))
            choice = logits.argmax(-1).tolist()
            if self.min_prob > 0:
                unsure = (logits.float().softmax(-1).amax(-1) < self.min_prob).tolist()
            for j, b in enumerate(live):
                rows[b].append(choice[j])
                drafts[b].append(choice[j])
                ended[b] = choice[j] == self.eos or (self.min_prob > 0 and unsure[j])
                if own is None:  # the drafter's own output in place of the verifier's features
                    feats[b, len(rows[b]) - 1] = at[j].to(feats.dtype)
                else:
                    own[0][b, len(rows[b]) - 1] = True
                    own[1][b, len(rows[b]) - 1] = at[j].to(own[1].dtype)
        return single_drafts(drafts)


def build_feature_ar(opts, task, models):
    """``--decoding feature-ar``: (the feature drafter from ``--drafter-path``, greedy's exact rule);
    ``--block-size``: tokens drafted per pass (default 8)."""
    from ..acceptance import build_acceptance
    from ..engines import drafter_engine
    from ..runtime.threads import engine_threads
    from .nar_block_checkpoint import check_drafter, drafter_shortlist

    if not opts.drafter_path:
        raise ValueError("--decoding feature-ar needs a drafter: pass --drafter-path DRAFTER.pt")
    drafter_model, _ = task.load_drafter(opts.drafter_path, like=models[0], precision=opts.drafter_precision)
    check_drafter(drafter_model, models[0], task.target_dictionary, feature_ar=True)
    drafter = FeatureARDrafter(drafter_model, task.target_dictionary, opts.block_size or 8,
                               engine=drafter_engine(opts.engine), threads=engine_threads(opts.native_threads),
                               isa=opts.native_isa, shortlist=drafter_shortlist(opts, task),
                               min_prob=opts.draft_confidence)
    return drafter, build_acceptance(1, 0.0)
