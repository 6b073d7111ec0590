"""NAR block drafter (GAD, Ge et al. 2022): a ``block_nat`` model proposes
the next ``k`` tokens after the current prefix in one parallel pass.

The drafter encodes the source once per batch with its own encoder, or reads
the verifier's encoder output (a ``--shared-encoder`` drafter: one encoder run
per sentence); per iteration it runs its decoder over ``[bos, prefix, M x k]``
for all still-active sentences at once and projects only the ``k`` slots.
On a CPU the drafter runs in the native engine where it can
(:class:`~fairseq_aggressive.native.block_drafter.NativeBlockDrafter`; a
``--block-causal-prefix`` drafter then runs only the new prefix tokens and the
slots each pass), else in torch.  A ``--verifier-features`` drafter keeps, per
sentence, the verifier's features that chose each emitted token
(:meth:`observe_emitted`) and reads them at its prefix positions.
"""
import logging
import time
from typing import List, Optional

import torch

from ..options import check_positive_int
from ..engines import build_block_drafter_engine
from .base import Branch, Drafter, DrafterCaps, EngineDrafter, LoopResult, drafts_as, single_drafts

logger = logging.getLogger(__name__)


class NARBlockDrafter(Drafter):
    def __init__(self, model, tgt_dict, block_size: int, fast: bool = True, engine: str = "auto",
                 shortlist=None, threads: Optional[int] = None, isa: Optional[str] = None):
        """``shortlist``: a :class:`~fairseq_aggressive.shortlist.VocabShortlist` the
        drafter proposes from (``--drafter-shortlist``; proposals only, the
        verifier's choices are unaffected).  ``threads``: the native engine's
        threads (None: :func:`~fairseq_aggressive.runtime.threads.engine_threads`' policy);
        ``isa``: its build target (None: the best this CPU runs)."""
        self.k = check_positive_int(block_size, "--block-size")
        self.min_prob = 0.0  # a feature drafter's --draft-confidence
        self.model = model.eval()
        self.pad, self.eos = tgt_dict.pad(), tgt_dict.eos()
        self.bos = self.eos
        self.slot_id = tgt_dict.unk()  # any non-pad id: slot embeddings are replaced
        self.max_positions = model.decoder.max_positions()
        # fused inference path for real block_nat decoders (stand-ins use block_logits)
        self.fast = hasattr(model.decoder, "fast_block_features") and fast
        self.encoder_out = None
        self._rows: Optional[List[int]] = None
        self._enc_rows = None
        self.shortlist = shortlist
        # a --shared-encoder drafter reads the verifier's encoder output (the generator passes it);
        # a --verifier-features drafter, per sentence, the features at each row position
        self.caps = DrafterCaps(encoder_out=bool(getattr(model, "shared_encoder", False)),
                                emitted_features=bool(getattr(model, "reads_verifier_features", False)))
        self._feats: Optional[torch.Tensor] = None  # (B, positions, C); row position 0 (BOS) stays zero
        self._n_feats: List[int] = []
        self.native = build_block_drafter_engine(engine, model, tgt_dict, threads, isa) if fast else None

    @torch.no_grad()
    def begin(self, sample, max_len: int, encoder_out=None) -> None:
        net_input = sample["net_input"]
        if self.caps.encoder_out and encoder_out is None:
            raise ValueError("this drafter reads the verifier's encoder output (--shared-encoder): "
                             "the generator must pass it to begin()")
        self.encoder_out = None
        if self.caps.emitted_features:
            proj = self.model.decoder.feature_proj
            n = max_len + self.k + 2
            self._feats = proj.weight.new_zeros(net_input["src_tokens"].size(0), n, proj.in_features)
            self._n_feats = [1] * net_input["src_tokens"].size(0)
        if self.native is not None:
            src = net_input["src_tokens"]
            if src.device.type == "cpu" and max_len + self.k + 1 <= min(self.max_positions, self.native.positions()):
                self.native.begin(src, encoder_out if self.caps.encoder_out else None, max_len, self.k,
                                  self.shortlist)
                return
        self._torch_begin(net_input, encoder_out)

    def decode_in_engine(self, verifier, sample, max_len: int, first: int,
                         max_draft: Optional[int]) -> Optional[LoopResult]:
        if self.engine_drafter(verifier) is None or not verifier.runs_engine_loops:
            return None
        t0 = time.perf_counter()
        self.begin(sample, max_len, verifier.encoder_out() if self.caps.encoder_out else None)
        if self.encoder_out is not None:  # this batch drafts in torch
            return None
        begun = time.perf_counter() - t0
        spec = self.engine_drafter(verifier)  # (its settings: the batch's drafter begun)
        toks, scores, passes, st = verifier.decode_in_engine(
            spec.kind, first, max_draft, drafter=(spec.engine, self.native.state), **spec.settings)
        st.loop.draft_ns += int(begun * 1e9)
        return LoopResult(toks, scores, passes, st.loop)

    def engine_drafter(self, verifier) -> Optional[EngineDrafter]:
        # the engine's block drafter (csrc/loop/nar_drafter.cpp) makes the drafts of propose() as written here
        if self.native is None or not drafts_as(self, NARBlockDrafter, ("propose", "observe_emitted", "update")):
            return None
        room = min(self.max_positions, self.native.positions()) - 1
        # (a shortlist of the drafter's is set up per batch by begin(): rows that join one by one have none)
        return EngineDrafter("nar", dict(bos=self.bos, k=self.k, room=room, shared_encoder=self.caps.encoder_out,
                                         causal=self.native.causal),
                             engine=self.native.engine, joins=self.shortlist is None)

    def _torch_begin(self, net_input, given) -> None:
        """Encoder output (and the fused path's keys/values) for the torch path."""
        if self.caps.encoder_out:
            self.encoder_out = self._with_embedding(given, net_input["src_tokens"])
        else:
            self.encoder_out = self.model.encoder(
                net_input["src_tokens"], src_lengths=net_input["src_lengths"]
            )
        self._rows, self._enc_rows = None, self.encoder_out
        self.enc_kv = self._enc_kv_rows = None
        self._allowed = None if self.shortlist is None else self.shortlist.allowed(net_input["src_tokens"])
        if self.fast:
            from ..runtime.layer_ops import encoder_kv

            self.enc_kv = self._enc_kv_rows = encoder_kv(self.model.decoder.layers, self.encoder_out)

    def _with_embedding(self, encoder_out, src_tokens):
        """The verifier's encoder output, in the drafter's dtype, plus the source
        token embeddings a ``--block-src-copy`` decoder reads (the drafter's own
        frozen copy of the shared embeddings)."""
        param = next(self.model.decoder.parameters())
        out = dict(encoder_out)
        out["encoder_out"] = [encoder_out["encoder_out"][0].to(device=param.device, dtype=param.dtype)]
        if getattr(self.model.decoder, "src_copy", False):
            enc = self.model.encoder
            out["encoder_embedding"] = [enc.embed_scale * enc.embed_tokens(src_tokens.to(param.device))]
        return out

    def observe_emitted(self, sents: List[int], feats, n_emit: List[int]) -> None:
        if not self.caps.emitted_features:
            return
        feats = feats.to(self._feats.dtype)
        o = 0
        for s, ne in zip(sents, n_emit):
            at = self._n_feats[s]
            ne = min(ne, self._feats.size(1) - at)  # past the cap nothing is drafted any more
            self._feats[s, at : at + ne] = feats[o : o + ne]
            self._n_feats[s] = at + ne
            o += ne

    def _feature_rows(self, sents: List[int], starts: List[int], ends: List[int]):
        """The verifier's features at row positions ``starts[i]`` .. ``ends[i] - 1``
        of sentence ``sents[i]``, rows concatenated (float32, for the native drafter)."""
        for s, e in zip(sents, ends):
            if e > self._n_feats[s]:
                raise RuntimeError(f"drafter: sentence {s} has {self._n_feats[s] - 1} emitted tokens' features, "
                                   f"its row {e - 1} tokens (the generator must call observe_emitted)")
        if len(sents) == 1:  # consecutive rows of one sentence: already contiguous
            rows = self._feats[sents[0], starts[0] : ends[0]]
        else:
            rows = torch.cat([self._feats[s, a:e] for s, a, e in zip(sents, starts, ends)])
        return rows.float().contiguous()

    def _encoder_rows(self, sents: List[int]):
        if self._rows is None and sents == list(range(len(sents))) and \
                len(sents) == self.encoder_out["encoder_out"][0].size(1):
            self._rows = list(sents)  # the whole batch: no reordering
        if sents != self._rows:  # sentences finished since the last call
            idx = torch.tensor(sents, dtype=torch.long, device=self.encoder_out["encoder_out"][0].device)
            self._enc_rows = self.model.encoder.reorder_encoder_out(self.encoder_out, idx)
            if self.enc_kv is not None:
                k, v, m = self.enc_kv
                self._enc_kv_rows = ([t.index_select(0, idx) for t in k], [t.index_select(0, idx) for t in v],
                                     None if m is None else m.index_select(0, idx))
            self._rows = list(sents)
        return self._enc_rows

    @torch.no_grad()
    def propose(self, sents: List[int], outputs: List[List[int]], caps: List[int]) -> List[List[Branch]]:
        # bos + prefix + slots must fit the drafter's positions
        ks = [min(self.k, c, self.max_positions - 1 - len(o)) for c, o in zip(caps, outputs)]
        if max(ks) <= 0:
            return single_drafts([[] for _ in sents])
        k = max(ks)
        if self.encoder_out is None:  # the native engine drafts this batch
            rows = [[self.bos] + out for out in outputs]
            feats = None
            if self.caps.emitted_features:
                feats = self._feature_rows(sents, self.native.starts(sents), [len(r) for r in rows])
            pred = self.native.propose(sents, rows, k, feats, self.min_prob)
        else:
            pred = self._torch_propose(sents, outputs, k)
        drafts = []
        for p, kk in zip(pred, ks):
            p = p[: max(kk, 0)]
            if self.eos in p:  # nothing follows the end of the sentence
                p = p[: p.index(self.eos) + 1]
            drafts.append(p)
        return single_drafts(drafts)

    def _torch_propose(self, sents: List[int], outputs: List[List[int]], k: int) -> List[List[int]]:
        width = 1 + max(len(o) for o in outputs) + k
        rows, slot_rows = [], []
        for out in outputs:
            n = 1 + len(out)
            rows.append([self.bos] + out + [self.slot_id] * k + [self.pad] * (width - n - k))
            slot_rows.append([False] * n + [True] * k + [False] * (width - n - k))
        device = self.encoder_out["encoder_out"][0].device
        tokens = torch.tensor(rows, dtype=torch.long, device=device)
        slots = torch.tensor(slot_rows, dtype=torch.bool, device=device)
        enc = self._encoder_rows(sents)
        prefix_feats = None
        if self.caps.emitted_features:
            idx = torch.tensor(sents, dtype=torch.long, device=self._feats.device)
            prefix_feats = self._feats.index_select(0, idx)[:, :width].to(device)
        if self.fast:
            feats = self.model.decoder.fast_block_features(tokens, slots, enc, self._enc_kv_rows, prefix_feats)
            logits = self.model.decoder.output_layer(feats[slots])
        elif prefix_feats is not None:
            logits = self.model.block_logits(tokens, slots, enc, prefix_feats=prefix_feats)
        else:  # (stand-in drafters take three arguments)
            logits = self.model.block_logits(tokens, slots, enc)
        logits[:, self.pad] = -float("inf")
        if self._allowed is not None:
            allowed = self._allowed[torch.tensor(sents, device=self._allowed.device)].to(logits.device)
            logits = logits.masked_fill(~allowed.repeat_interleave(k, 0), -float("inf"))
        return logits.argmax(-1).view(len(sents), k).tolist()
