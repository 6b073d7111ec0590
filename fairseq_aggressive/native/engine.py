"""The native verifier: a fairseq Transformer copied once into the compiled
engine (``transformer.cpp``), which encodes a batch and runs whole
verification passes (decoder over [last, draft] on the cache, projection,
greedy choice with fairseq's adjustments, exact acceptance, scores, commit) in
one call per pass.

Models the engine does not reproduce are refused by :func:`check_native`
(the generator then uses the torch verifier, which gives the same output).
"""
import ctypes
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..quantization import Int8Linear
from ..threads import engine_threads
from .build import NativeUnavailable, library


class _Config(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "C", "H", "F", "enc_layers", "dec_layers", "src_vocab", "tgt_vocab", "src_positions",
        "tgt_positions", "enc_normalize_before", "dec_normalize_before", "gelu", "pad", "unk", "eos")] + [
        (n, ctypes.c_float) for n in ("enc_embed_scale", "dec_embed_scale", "ln_eps")]


def _activation(layer) -> str:
    return getattr(layer.activation_fn, "__name__", "")


def check_native(model) -> None:
    """Raise NativeUnavailable unless the engine computes ``model`` exactly as
    fairseq's standard Transformer layers do."""
    from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
    from fairseq.modules import TransformerDecoderLayer, TransformerEncoderLayer

    enc, dec = getattr(model, "encoder", None), getattr(model, "decoder", None)
    if not isinstance(enc, TransformerEncoderBase) or not isinstance(dec, TransformerDecoderBase):
        raise NativeUnavailable(f"{type(model).__name__} is not a standard fairseq Transformer")
    C = dec.embed_dim
    problems = []
    if enc.embed_tokens.embedding_dim != C or dec.output_embed_dim != C:
        problems.append("embedding, encoder and output dimensions differ")
    if dec.project_in_dim is not None or dec.project_out_dim is not None:
        problems.append("decoder input/output projections")
    if dec.adaptive_softmax is not None or not isinstance(dec.output_projection, (torch.nn.Linear, Int8Linear)):
        problems.append("adaptive softmax")
    if getattr(enc, "quant_noise", None) is not None or getattr(dec, "quant_noise", None) is not None:
        problems.append("quant-noise")
    if enc.embed_positions is not None and dec.embed_positions is None or (
            enc.embed_positions is None and dec.embed_positions is not None):
        problems.append("positions in only one of encoder and decoder")
    layers = list(enc.layers) + list(dec.layers)
    heads = {l.self_attn.num_heads for l in layers}
    ffn = {l.fc1.out_features for l in layers}
    acts = {_activation(l) for l in layers}
    norms = {l.self_attn_layer_norm.eps for l in layers}
    if len(heads) != 1 or len(ffn) != 1:
        problems.append("layers with different head counts or FFN sizes")
    if not acts <= {"relu", "gelu"}:
        problems.append(f"activation {sorted(acts)}")
    if len(norms) != 1:
        problems.append("layer norms with different eps")
    for i, l in enumerate(layers):
        if type(l) not in (TransformerEncoderLayer, TransformerDecoderLayer) and not type(l).__name__.endswith("LayerBase"):
            problems.append(f"layer {i} is a {type(l).__name__}")
        for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid"):
            if getattr(l, name, None) is not None:
                problems.append(f"normformer extras ({name})")
        attns = [l.self_attn] + ([l.encoder_attn] if getattr(l, "encoder_attn", None) is not None else [])
        for a in attns:
            if a.bias_k is not None or a.add_zero_attn or a.embed_dim != C or a.kdim != C or a.vdim != C:
                problems.append(f"layer {i}: non-standard attention")
    if problems:
        raise NativeUnavailable("the native engine does not run this model (" + "; ".join(sorted(set(problems))) + ")")


def _f32(t):
    return None if t is None else t.detach().to(torch.float32).contiguous()


def _exact_half(t):
    """``t`` as float16 if that loses nothing, else None."""
    h = t.to(torch.float16)
    return h.contiguous() if torch.equal(h.to(torch.float32), t) else None


def _positions(emb, n: int):
    """Position embeddings of steps 0..n-1 (n x C), as the verifier builds them."""
    if emb is None:
        return None
    pad = emb.padding_idx if emb.padding_idx is not None else -1
    with torch.no_grad():
        dummy = torch.full((1, n), pad + 1, dtype=torch.long)
        return emb(dummy)[0].float().contiguous()


class NativeEngine:
    """One model in the compiled engine; decodes batches with :meth:`begin` /
    :meth:`step`.  Thread-safe only per instance (one batch at a time)."""

    def __init__(self, model, tgt_dict, generic: bool = False, threads: Optional[int] = None):
        check_native(model)
        self.lib = library(generic)
        self.isa = "avx2" if self.lib.fa_simd() else "generic"
        enc, dec = model.encoder, model.decoder
        layers = list(enc.layers) + list(dec.layers)
        C = dec.embed_dim
        self._linear_weights = []
        self.src_positions = enc.max_positions() if enc.embed_positions is not None else 1 << 30
        self.tgt_positions = dec.max_positions() if dec.embed_positions is not None else 1 << 30
        tensors = [
            _f32(enc.embed_tokens.weight),
            _positions(enc.embed_positions, min(self.src_positions, 4096)),
            *self._norm(enc.layernorm_embedding), *self._norm(enc.layer_norm),
            _f32(dec.embed_tokens.weight),
            _positions(dec.embed_positions, min(self.tgt_positions, 4096)),
            *self._norm(dec.layernorm_embedding), *self._norm(dec.layer_norm),
            *self._lin(dec.output_projection),
        ]
        for l in enc.layers:
            sa = l.self_attn
            tensors += [*self._lin(sa.q_proj), *self._lin(sa.k_proj), *self._lin(sa.v_proj), *self._lin(sa.out_proj),
                        *self._norm(l.self_attn_layer_norm), *self._lin(l.fc1), *self._lin(l.fc2),
                        *self._norm(l.final_layer_norm)]
        for l in dec.layers:
            sa, ea = l.self_attn, l.encoder_attn
            tensors += [*self._lin(sa.q_proj), *self._lin(sa.k_proj), *self._lin(sa.v_proj), *self._lin(sa.out_proj),
                        *self._norm(l.self_attn_layer_norm),
                        *self._lin(ea.q_proj), *self._lin(ea.k_proj), *self._lin(ea.v_proj), *self._lin(ea.out_proj),
                        *self._norm(l.encoder_attn_layer_norm), *self._lin(l.fc1), *self._lin(l.fc2),
                        *self._norm(l.final_layer_norm)]
        if tensors[1] is not None:
            self.src_positions = tensors[1].size(0)
        if tensors[7] is not None:
            self.tgt_positions = tensors[7].size(0)
        # weights whose every value is a float16 value (fairseq --fp16 checkpoints, float16
        # exports) are kept as float16: half the bytes per pass, the same arithmetic
        linear_ids = {id(t) for t in self._linear_weights}
        halves = [_exact_half(t) if t is not None and id(t) in linear_ids else None for t in tensors]
        # int8 layers (--inference-precision int8): their weight slot holds the Int8Linear
        q8 = [t if isinstance(t, Int8Linear) else None for t in tensors]
        n_q8 = sum(q is not None for q in q8)
        if n_q8 and self._linear_weights:
            raise NativeUnavailable(f"{n_q8} int8 and {len(self._linear_weights)} float linear layers in one model")
        tensors = [None if isinstance(t, Int8Linear) else t for t in tensors]

        def pointers(ts):
            return (ctypes.c_void_p * len(ts))(*[0 if t is None else t.data_ptr() for t in ts])

        ptrs, hptrs = pointers(tensors), pointers(halves)
        qptrs = pointers([None if q is None else q.qweight for q in q8])
        sptrs = pointers([None if q is None else q.scale for q in q8])
        cfg = _Config(
            C=C, H=dec.layers[0].self_attn.num_heads, F=dec.layers[0].fc1.out_features,
            enc_layers=len(enc.layers), dec_layers=len(dec.layers),
            src_vocab=enc.embed_tokens.num_embeddings, tgt_vocab=dec.output_projection.out_features,
            src_positions=self.src_positions if tensors[1] is not None else 0,
            tgt_positions=self.tgt_positions if tensors[7] is not None else 0,
            enc_normalize_before=int(enc.layers[0].normalize_before),
            dec_normalize_before=int(dec.layers[0].normalize_before),
            gelu=int(_activation(layers[0]) == "gelu"),
            pad=tgt_dict.pad(), unk=tgt_dict.unk(), eos=tgt_dict.eos(),
            enc_embed_scale=float(enc.embed_scale), dec_embed_scale=float(dec.embed_scale),
            ln_eps=float(layers[0].self_attn_layer_norm.eps),
        )
        self.src_pad = enc.padding_idx
        self.eos, self.pad = tgt_dict.eos(), tgt_dict.pad()
        self.embed_dim = dec.embed_dim
        self.handle = self.lib.fa_model_create(ctypes.byref(cfg), ptrs, hptrs, qptrs, sptrs)  # copies the weights
        self.half_linears = self.lib.fa_half_linears(self.handle)
        self.int8_linears = self.lib.fa_int8_linears(self.handle)
        self.threads = 0
        self.set_threads(engine_threads(threads))

    def _lin(self, m):
        if isinstance(m, Int8Linear):
            return [m, _f32(m.bias)]
        w = _f32(m.weight)
        self._linear_weights.append(w)
        return [w, _f32(m.bias)]

    @staticmethod
    def _norm(m):
        return [None, None] if m is None else [_f32(m.weight), _f32(m.bias)]

    def set_threads(self, n: int) -> None:
        """Run on ``n`` threads (the caller's and ``n - 1`` workers)."""
        if n != self.threads:
            self.lib.fa_set_threads(self.handle, int(n))
            self.threads = n

    def pool_stats(self) -> dict:
        """The thread pool's counters since the engine was made: parallel calls,
        items its workers ran, waits for a worker's item and stalls (waits far
        longer than an item: the worker was not running), seconds waited."""
        out = (ctypes.c_int64 * 6)()
        self.lib.fa_pool_stats(self.handle, out)
        calls, parallel, worker_items, waits, stalls, wait_ns = list(out)
        return dict(calls=calls, parallel=parallel, worker_items=worker_items, waits=waits, stalls=stalls,
                    wait_seconds=wait_ns / 1e9)

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.fa_model_free(handle)
            self.handle = None

    def can_decode(self, src_len: int, max_len: int) -> bool:
        """Whether the position tables cover a batch (else decode it with torch)."""
        return src_len <= self.src_positions and max_len + 1 <= self.tgt_positions

    def begin(self, src_tokens: torch.Tensor, max_len: int, shortlist=None, tree_room: int = 0) -> "NativeBatch":
        """Encode a batch; ``shortlist`` (a :class:`~fairseq_aggressive.shortlist.VocabShortlist`)
        restricts each sentence's output vocabulary; ``tree_room``: cache positions
        beyond a plain row that a pass over several drafts (tree rows) may use."""
        rows = src_tokens.cpu()
        keep = rows.ne(self.src_pad)
        lengths = keep.sum(1).to(torch.int32).numpy()
        flat = rows[keep].to(torch.int32).numpy()
        batch = NativeBatch(self, len(lengths), flat, lengths, max_len + 2 + max(0, int(tree_room)))
        batch.src_keep = keep
        if shortlist is not None:
            self.set_shortlist(batch.handle, shortlist, rows)
        return batch

    def set_shortlist(self, state_handle, shortlist, src_tokens: torch.Tensor) -> None:
        """Restrict each sentence of a state to its shortlist (the common ids and its source's)."""
        if self.lib.fa_shortlist_common(self.handle, shortlist.n_common) != 0:
            raise ValueError(f"vocabulary shortlist of {shortlist.n_common} common ids: it must cover "
                             "the special symbols and fit the vocabulary")
        for b, ids in enumerate(shortlist.extras(src_tokens.cpu())):
            arr = np.ascontiguousarray(ids, dtype=np.int32)
            if self.lib.fa_shortlist(self.handle, state_handle, b, len(arr), arr.ctypes.data) != 0:
                raise ValueError(f"sentence {b}: shortlist ids must ascend, beyond the common ones")


class NativeBatch:
    """The encoded sentences of one batch and their decoder caches."""

    def __init__(self, engine: NativeEngine, n: int, flat: np.ndarray, lengths: np.ndarray, cap: int):
        self.engine, self.lib = engine, engine.lib
        flat = np.ascontiguousarray(flat, dtype=np.int32)
        lengths = np.ascontiguousarray(lengths, dtype=np.int32)
        self.handle = self.lib.fa_begin(engine.handle, n, flat.ctypes.data, lengths.ctypes.data, cap)
        self._rows_cap = self._tok_cap = 0
        self.features = None  # after step(features=True): the emitted tokens' decoder features

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.fa_state_free(handle)
            self.handle = None

    def encoder_out(self):
        """The verifier's encoder output as fairseq's encoder returns it
        (``encoder_out`` S x B x C, zeros at padding; ``encoder_padding_mask``
        B x S), for a drafter that shares the verifier's encoder."""
        keep = self.src_keep
        C = self.engine.embed_dim
        flat = torch.empty(int(keep.sum()), C, dtype=torch.float32)
        n = self.lib.fa_encoder_out(self.handle, flat.data_ptr())
        if n != flat.numel():
            raise RuntimeError(f"native engine: {n} encoder values, expected {flat.numel()}")
        enc = torch.zeros(*keep.shape, C, dtype=torch.float32)
        enc[keep] = flat
        return {"encoder_out": [enc.transpose(0, 1)], "encoder_padding_mask": [~keep],
                "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}

    def _buffers(self, n_rows: int, n_tokens: int):
        if n_rows > self._rows_cap or n_tokens > self._tok_cap:
            self._rows_cap, self._tok_cap = max(n_rows, self._rows_cap), max(n_tokens, 2 * self._tok_cap)
            I, F = ctypes.c_int32, ctypes.c_float
            self._sent, self._lens, self._n_emit, self._n_match, self._done, self._nb, self._win = (
                (I * self._rows_cap)() for _ in range(7))
            self._tok, self._choice, self._blen = (I * self._tok_cap)(), (I * self._tok_cap)(), (I * self._tok_cap)()
            self._score = (F * self._tok_cap)()
            self._feats = None

    def step(self, sents: Sequence[int], rows: Sequence[List[int]], max_len: int, min_len: int,
             unk_penalty: float, temperature: float, branches: Optional[Sequence[List[int]]] = None,
             features: bool = False, beta: int = 1, tau: float = 0.0):
        """One pass; ``rows[i]`` = [last token] + draft of sentence ``sents[i]``.
        With ``branches``, ``branches[i]`` lists the lengths of the drafts that
        follow the last token in ``rows[i]`` one after the other (each is a
        continuation of the last token; the pass keeps the one that accepts
        most).  Returns per row the emitted tokens, their scores, the accepted
        draft length, whether EOS was emitted and the index of the kept draft.
        With ``features``, :attr:`features` then holds the decoder features
        (last layer, normalised) each emitted token was chosen from, the rows'
        emitted tokens one after the other (sum of n_emit x C).  ``beta`` > 1
        accepts GAD++'s way (:class:`~fairseq_aggressive.acceptance.RankAcceptance`:
        a drafted token among the top ``beta`` within ``tau`` of the top one's
        log-probability) instead of greedy's."""
        n = len(rows)
        lens = [len(r) for r in rows]
        flat = rows[0] if n == 1 else [t for r in rows for t in r]
        self._buffers(n, len(flat))
        self._sent[:n], self._lens[:n], self._tok[: len(flat)] = sents, lens, flat
        nb = blen = None
        if branches is not None:
            if len(branches) != n:
                raise ValueError(f"{len(branches)} branch lists for {n} rows")
            bflat = [x for b in branches for x in b]
            for r, b in zip(rows, branches):
                if not b or 1 + sum(b) != len(r) or (len(b) > 1 and min(b) < 1):
                    raise ValueError(f"branch lengths {b} do not split a row of {len(r)} tokens")
            self._nb[:n], self._blen[: len(bflat)] = [len(b) for b in branches], bflat
            nb, blen = self._nb, self._blen
        fptr = None
        if features:
            if self._feats is None:
                self._feats = torch.empty(self._tok_cap, self.engine.embed_dim, dtype=torch.float32)
            fptr = self._feats.data_ptr()
        rc = self.lib.fa_pass(self.engine.handle, self.handle, n, self._sent, self._lens, self._tok, max_len,
                              min_len, unk_penalty, temperature, beta, tau, self._choice, self._score, self._n_emit,
                              self._n_match, self._done, nb, blen, self._win, fptr)
        if rc != 0:
            raise RuntimeError("native engine: a row does not fit its sentence's cache")
        n_emit = self._n_emit[:n]
        toks, scores, o = [], [], 0
        for k, ne in zip(lens, n_emit):
            toks.append(self._choice[o : o + ne])
            scores.append(self._score[o : o + ne])
            o += k
        if features:
            if n == 1:
                self.features = self._feats[: n_emit[0]].clone()
            else:
                ne = np.asarray(n_emit)  # emitted token j of row r sits at row offset + j
                idx = np.arange(ne.sum()) + np.repeat(np.cumsum(lens) - lens - (np.cumsum(ne) - ne), ne)
                self.features = self._feats[torch.from_numpy(idx)]
        return toks, scores, self._n_match[:n], self._done[:n], self._win[:n]
