"""The native verifier: a fairseq Transformer copied once into the compiled
engine (``csrc/``), which encodes a batch and runs whole
verification passes (decoder over [last, draft] on the cache, projection,
greedy choice with fairseq's adjustments, exact acceptance, scores, commit) in
one call per pass.

Models the engine does not reproduce are refused by :func:`check_native`
(:func:`~fairseq_aggressive.model_shapes.native_problems` says why; the
generator then uses the torch verifier, which gives the same output).
"""
import ctypes
import threading
import weakref
from typing import Optional

import numpy as np
import torch

from ..model_shapes import activation, native_problems
from ..runtime import cpu_features
from ..runtime.fingerprint import model_fingerprint
from ..runtime.layer_ops import position_table
from ..runtime.quantization import Int8Linear
from ..runtime.threads import engine_threads
from ..runtime.token_rows import unpadded
from . import c_api
from .batch import NativeBatch
from .build import NativeUnavailable, library


def check_native(model) -> None:
    """Raise NativeUnavailable unless the engine computes ``model`` exactly."""
    problems = native_problems(model)
    if problems:
        raise NativeUnavailable("the native engine does not run this model (" + "; ".join(problems) + ")")


def _f32(t):
    return None if t is None else t.detach().to(torch.float32).contiguous()


def _exact_half(t):
    """``t`` as float16 if that loses nothing, else None."""
    h = t.to(torch.float16)
    return h.contiguous() if torch.equal(h.to(torch.float32), t) else None


def _positions(emb, n: int):
    """Position embeddings of steps 0..n-1 (n x C), as the verifier builds them."""
    table = position_table(emb, n)
    return None if table is None else table.float().contiguous()


# model -> kind -> (its fingerprint, tgt dict, target and kind; an engine whose weights later engines for it share)
_SHARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()

# The weights a verification pass reads beyond which a batch decodes whole on every thread
# instead of in one-thread lanes (NativeEngine.default_lanes).  On a 2-core Zen 4 guest, greedy
# in static batches (scripts/diagnostics/lanes_side_by_side.py): the d=512 copy (58 MB of
# float32 weights, 14 MB in int8) ran 1.39x and 1.27x as fast whole at batch 8; the 9+3 (3.4 MB
# of float16, 1.8 MB in int8) 1.14-1.24x as fast in two lanes beside two busy processes and
# 1.02-1.08x in int8 quiet, 0.92-1.01x in float32 quiet (batches of 8 to 32).  The engine's
# tiles ask for weights ahead from the same size on (kPrefetchModelBytes).
LANE_WEIGHT_BYTES = 8 << 20
# A stream's lanes never meet (a static batch's lanes wait for their longest sentence, and a
# batch decoded whole meets at every product and splits its joining sentences' encoder among
# its threads): where the weights a pass reads are a small share of the last-level cache, a
# stream's lanes read them from there and gain, up to 1 / STREAM_LANE_CACHE_SHARE of it.  On a
# 2-core Xeon guest with AMX (480 MiB L3, 2 MiB L2 a core), the d=512 copy streamed in lanes
# against one batch on both threads (scripts/diagnostics/lanes_side_by_side.py --stream ROWS,
# greedy, 200 sentences, 4 rounds in turns, outputs equal): int8 (14.6 MB) 1.07x at 8 rows,
# 1.16x at 32, 1.22x at 128, 1.15x at 32 beside two busy processes; float32 (58.5 MB) 0.90x at 8
# rows, 1.04x at 32.  Static batches there kept LANE_WEIGHT_BYTES (int8 at batch 8: lanes 0.78x).
STREAM_LANE_CACHE_SHARE = 16

# What the attention caches of one lane's rows may hold (float32 keys and values of every
# decoder layer, its own and its source's, counted at ROW_POSITIONS positions a row) where the
# weights are small enough for lanes (NativeEngine.lane_rows): each pass reads every row's
# caches once, and past the caches those reads crowd out the weights.  On a 2-core Zen 4 guest
# (1 MiB L2 a core, 32 MiB L3) the 9+3 (192 KiB a row: 16 rows a lane) streamed through two
# lanes with this bound against none (scripts/diagnostics/lane_rows_side_by_side.py): 0.99-1.03x
# at 32 rows, 1.03-1.11x at 64, 1.12-1.33x at 128 (greedy and IAD, float32 and int8; int8 greedy
# 1.28x at 128 beside two busy processes); time a sentence at 128 rows within 3% of 32's.
LANE_CACHE_BYTES = 3 << 20
ROW_POSITIONS = 64
# the fewest rows a lane keeps decoding where rows are many (what its products need to fill a tile)
MIN_LANE_ROWS = 8


class NativeEngine:
    """One model in the compiled engine; decodes batches with :meth:`begin` /
    :meth:`step`.  Thread-safe only per instance (one batch at a time)."""

    def __init__(self, model, tgt_dict, isa: Optional[str] = None, threads: Optional[int] = None):
        check_native(model)
        self.lib = library(isa)
        self.isa = self.lib.fa_isa().decode()  # the build target (native/targets.py)
        enc, dec = model.encoder, model.decoder
        C, E = dec.embed_dim, enc.embed_tokens.embedding_dim
        # E != C: a drafter narrower than the verifier whose encoder output it reads
        # (native_problems allows that only for a --shared-encoder drafter); no encoder here
        self.own_encoder = E == C
        layers = (list(enc.layers) if self.own_encoder else []) + list(dec.layers)
        self.src_positions = enc.max_positions() if enc.embed_positions is not None else 1 << 30
        self.tgt_positions = dec.max_positions() if dec.embed_positions is not None else 1 << 30
        src_pos = _positions(enc.embed_positions, min(self.src_positions, 4096))
        tgt_pos = _positions(dec.embed_positions, min(self.tgt_positions, 4096))
        if src_pos is not None:
            self.src_positions = src_pos.size(0)
        if tgt_pos is not None:
            self.tgt_positions = tgt_pos.size(0)
        cfg = c_api.Config(
            C=C, H=dec.layers[0].self_attn.num_heads, F=dec.layers[0].fc1.out_features,
            enc_layers=len(enc.layers) if self.own_encoder else 0, dec_layers=len(dec.layers),
            src_vocab=enc.embed_tokens.num_embeddings, tgt_vocab=dec.output_projection.out_features,
            enc_normalize_before=int(enc.layers[0].normalize_before),
            dec_normalize_before=int(dec.layers[0].normalize_before),
            act=c_api.ACTIVATIONS.index(activation(layers[0])),
            pad=tgt_dict.pad(), unk=tgt_dict.unk(), eos=tgt_dict.eos(),
            enc_embed_scale=float(enc.embed_scale), dec_embed_scale=float(dec.embed_scale),
            ln_eps=float(layers[0].self_attn_layer_norm.eps), enc_dim=E,
        )
        self.src_pad = enc.padding_idx
        self.eos, self.pad = tgt_dict.eos(), tgt_dict.pad()
        self.embed_dim = dec.embed_dim
        # a row's attention caches a position: keys and values of each decoder layer, float32
        self.row_cache_bytes = len(dec.layers) * 2 * C * 4
        self.handle = self.lib.fa_model_new(ctypes.byref(cfg))
        if not self.handle:
            raise NativeUnavailable(f"the native engine cannot make this model: {self.lib.fa_new_error().decode()}")
        # every tensor by its fairseq name (csrc/model/weights.h lists them); the engine copies it
        self._n_float = self._n_int8 = 0
        sides = (("encoder", enc, src_pos),) if self.own_encoder else ()
        for side, part, pos in sides + (("decoder", dec, tgt_pos),):
            self._put(f"{side}.embed_tokens.weight", -1, _f32(part.embed_tokens.weight))
            self._put(f"{side}.embed_positions.weight", -1, pos)
            self._norm(f"{side}.layernorm_embedding", -1, part.layernorm_embedding)
            self._norm(f"{side}.layer_norm", -1, part.layer_norm)
            for i, layer in enumerate(part.layers):
                attns = [("self_attn", layer.self_attn)]
                if side == "decoder":
                    attns.append(("encoder_attn", layer.encoder_attn))
                for a_name, attn in attns:
                    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                        self._linear(f"{side}.layers.{a_name}.{proj}", i, getattr(attn, proj))
                    self._norm(f"{side}.layers.{a_name}_layer_norm", i, getattr(layer, f"{a_name}_layer_norm"))
                self._linear(f"{side}.layers.fc1", i, layer.fc1)
                self._linear(f"{side}.layers.fc2", i, layer.fc2)
                self._norm(f"{side}.layers.final_layer_norm", i, layer.final_layer_norm)
        self._linear("decoder.output_projection", -1, dec.output_projection)
        if self._n_int8 and self._n_float:
            raise NativeUnavailable(f"{self._n_int8} int8 and {self._n_float} float linear layers in one model")
        if self.lib.fa_model_build(self.handle) != 0:
            raise RuntimeError(f"native engine: {self.lib.fa_model_error(self.handle).decode()}")
        self.n_heads = 0
        if getattr(model, "has_blockwise_heads", False):
            self._set_heads(model.blockwise_heads)
        self._model = weakref.ref(model)
        self.half_linears = self.lib.fa_half_linears(self.handle)
        self.int8_linears = self.lib.fa_int8_linears(self.handle)
        self.pass_weight_bytes = self.lib.fa_pass_weight_bytes(self.handle)
        self.threads = 0
        self.set_threads(engine_threads(threads))

    def default_lanes(self, stream: bool = False) -> int:
        """The lanes (one-thread running batches, :meth:`lanes`) a static batch's sentences
        (or, with ``stream``, a stream's rows) are dealt among unless told: one per thread where
        the weights a pass reads (:attr:`pass_weight_bytes`) are below :data:`LANE_WEIGHT_BYTES`
        (a stream's: or below 1 / :data:`STREAM_LANE_CACHE_SHARE` of the last-level cache), else
        one batch on every thread.  Lanes never wait for each other, but each reads every weight
        at each pass: where those outgrow the caches, the passes are bound by reading them, and
        k lanes read them k times."""
        limit = LANE_WEIGHT_BYTES
        if stream:
            limit = max(limit, cpu_features.last_level_cache_bytes() // STREAM_LANE_CACHE_SHARE)
        return self.threads if self.pass_weight_bytes < limit else 1

    def lane_rows(self) -> Optional[int]:
        """The most rows one running batch on these weights keeps decoding at once (a stream's
        other sentences wait for a row): None (no bound) where the weights outgrow
        :data:`LANE_WEIGHT_BYTES`, whose reads more rows share; else as many as keep their
        attention caches (at :data:`ROW_POSITIONS` positions) within :data:`LANE_CACHE_BYTES`,
        at least :data:`MIN_LANE_ROWS`.  A row's output does not depend on the others."""
        if self.pass_weight_bytes >= LANE_WEIGHT_BYTES:
            return None
        return max(MIN_LANE_ROWS, LANE_CACHE_BYTES // (self.row_cache_bytes * ROW_POSITIONS))

    def lanes(self, k: int) -> list:
        """``k`` one-thread engines on these weights (:meth:`share`), made on first use and
        kept: the lanes a stream's rows or a static batch's sentences are dealt among
        (none where ``k`` < 2)."""
        if k < 2:
            return []
        cache = self.__dict__.setdefault("_lanes", {})
        if k not in cache:
            cache[k] = [self.share(1) for _ in range(k)]
        return cache[k]

    def share(self, threads: Optional[int] = None) -> "NativeEngine":
        """Another engine on the same weights: one copy in memory for every
        engine made this way (the C++ side frees it with the last), each with
        its own threads (``threads``: its count, None: the default), scratch
        buffers and shortlist.  Engines that share weights decode at once on
        separate Python threads (each one batch at a time); the engine can no
        longer change its weights."""
        other = object.__new__(NativeEngine)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("handle", "threads", "_lanes")})
        other.handle = None
        handle = self.lib.fa_model_share(self.handle)
        if not handle:
            raise self.failure("sharing the weights")
        other.handle, other.threads = handle, 0
        other.set_threads(engine_threads(threads))
        return other

    @property
    def weights_id(self) -> int:
        """Equal for engines that read one copy of the weights (:meth:`share`)."""
        return self.lib.fa_weights_id(self.handle)

    @classmethod
    def for_model(cls, model, tgt_dict, isa: Optional[str] = None, threads: Optional[int] = None,
                  prepare=None, kind: str = "verifier") -> "NativeEngine":
        """An engine for ``model`` on the weights of the last one made for it
        here (:meth:`share`: no copy), as long as the model's tensors are the
        same and unchanged (a tensor changed in place, replaced, or the model
        quantized makes a fresh copy): a hub model's ``translate`` builds a
        generator per call, which must not copy the weights each time.
        ``prepare(engine)`` completes a fresh engine's weights before anything
        shares them (a block drafter's slot input); ``kind`` names what it
        prepares for (engines of another kind are not reused); engines of
        different library files never share weights."""
        key = (model_fingerprint(model), id(tgt_dict), isa, kind, id(library(isa)))
        with _SHARED_LOCK:
            entries = _SHARED.setdefault(model, {})
            entry = entries.get(kind)
            if entry is None or entry[0] != key:
                engine = cls(model, tgt_dict, isa=isa, threads=1)
                if prepare is not None:
                    prepare(engine)
                entry = entries[kind] = (key, engine)
            return entry[1].share(threads)

    def runs(self, model) -> bool:
        """Whether this engine was made from ``model`` (the same module object)."""
        return self._model() is model

    def _put(self, name: str, layer: int, t: Optional[torch.Tensor], dtype: int = c_api.F32) -> None:
        """Hands tensor ``t`` (None: absent) to the engine as ``name`` of ``layer`` (-1: not a layer's)."""
        if t is None:
            return
        t = t.detach().contiguous()
        rows, cols = (t.size(0), 1) if t.dim() == 1 else tuple(t.shape)
        if self.lib.fa_set_weight(self.handle, name.encode(), layer, dtype, t.data_ptr(), rows, cols) != 0:
            raise RuntimeError(f"native engine: {self.lib.fa_model_error(self.handle).decode()}")

    def _linear(self, name: str, layer: int, m) -> None:
        """A linear layer: int8 weights with their row scales; or float weights,
        as float16 when every value is a float16 value (half the bytes per pass,
        the same arithmetic: fairseq --fp16 checkpoints, float16 exports)."""
        if isinstance(m, Int8Linear):
            self._n_int8 += 1
            self._put(f"{name}.weight", layer, m.qweight, c_api.I8)
            self._put(f"{name}.scale", layer, _f32(m.scale))
        else:
            self._n_float += 1
            w = _f32(m.weight)
            h = _exact_half(w)
            if h is None:
                self._put(f"{name}.weight", layer, w, c_api.F32)
            else:
                self._put(f"{name}.weight", layer, h, c_api.F16)
        self._put(f"{name}.bias", layer, _f32(m.bias))

    def _set_heads(self, heads) -> None:
        """A transformer_blockwise model's proposal heads, in float32 (an int8
        copy's dequantized: proposals only)."""
        def weight(m):
            if isinstance(m, Int8Linear):
                return (m.qweight.to(torch.float32) * m.scale.to(torch.float32).view(-1, 1)).contiguous()
            return _f32(m.weight)

        w1, w2 = weight(heads.fc1), weight(heads.fc2)
        b1, b2 = _f32(heads.fc1.bias), _f32(heads.fc2.bias)
        if self.lib.fa_set_heads(self.handle, w1.data_ptr(), b1.data_ptr(), w1.size(0), w2.data_ptr(),
                                 b2.data_ptr(), heads.k - 1) != 0:
            raise self.failure("the model's proposal heads")
        self.n_heads = heads.k - 1

    def _norm(self, name: str, layer: int, m) -> None:
        if m is not None:
            self._put(f"{name}.weight", layer, _f32(m.weight))
            self._put(f"{name}.bias", layer, _f32(m.bias))

    def set_threads(self, n: int) -> None:
        """Run on ``n`` threads (the caller's and ``n - 1`` workers)."""
        if n != self.threads:
            if self.lib.fa_set_threads(self.handle, int(n)) != 0:
                raise self.failure(f"starting {n} threads")
            self.threads = n

    def failure(self, what: str) -> RuntimeError:
        """The error of a decoding call that failed inside the engine (fa_model_error)."""
        return RuntimeError(f"native engine: {what} failed: {self.lib.fa_model_error(self.handle).decode()}")

    def set_pool_timeout(self, seconds: float) -> None:
        """How long a call waits for its last items before it checks that a
        worker still holds one; a call whose completion was lost then raises
        instead of waiting forever (default 60 s, far beyond any pass)."""
        self.lib.fa_set_pool_timeout(self.handle, max(1, int(seconds * 1000)))

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
        flat, lengths, keep = unpadded(rows, self.src_pad)
        batch = NativeBatch(self, len(lengths), flat, lengths, max_len + 2 + max(0, int(tree_room)))
        batch.src_keep = torch.from_numpy(keep)
        if shortlist is not None:
            self.set_shortlist(batch.handle, shortlist, rows)
        return batch

    def set_shortlist(self, state_handle, shortlist, src_tokens: torch.Tensor) -> None:
        """Restrict each sentence of a state to its shortlist (the common ids and its source's)."""
        rc = self.lib.fa_shortlist_common(self.handle, shortlist.n_common)
        if rc == -2:
            raise self.failure("a shortlist")
        if rc != 0:
            raise ValueError(f"vocabulary shortlist of {shortlist.n_common} common ids: it must cover "
                             "the special symbols and fit the vocabulary")
        for b, ids in enumerate(shortlist.extras(src_tokens.cpu())):
            arr = np.ascontiguousarray(ids, dtype=np.int32)
            rc = self.lib.fa_shortlist(self.handle, state_handle, b, len(arr), arr.ctypes.data)
            if rc == -2:
                raise self.failure("a shortlist")
            if rc != 0:
                raise ValueError(f"sentence {b}: shortlist ids must ascend, beyond the common ones")
