"""Opt-in int8 inference (``--inference-precision int8``): the model's linear
layers become :class:`Int8Linear` in place, so every decoding mode (fairseq's
own greedy and beam search, the torch verifier, the native engine) runs the
same int8 model, and "exact" keeps its meaning: aggressive decoding gives the
greedy output of that int8 model.

The arithmetic is defined so that any correct implementation computes the same
bits (the native engine does it with integer SIMD, this module with a float
matrix product whose every partial sum is an integer it represents exactly):

- weights: per output row n, ``sw[n] = amax(|W[n]|) / 127`` and
  ``qw[n, k] = round(W[n, k] * (127 / amax))`` (half to even), fixed at load;
- activations: per input row (one position), ``sx = amax(|x|) / 127`` and
  ``qx[k] = round(x[k] * (127 / amax))`` (a zero row gives zeros);
- ``acc = sum_k qx[k] * qw[n, k]`` in integers (exact, any order);
- ``y[n] = float32(acc) * (sx * sw[n]) + b[n]``, each operation in float32.

Each position's row is quantized on its own, so a verification pass over many
positions gives bit for bit what one-token steps give (per-tensor activation
scales, as in torch's dynamic quantization, would make a position's result
depend on the other positions of the pass).
"""
import torch
from torch import Tensor, nn

QMAX = 127.0


def quantize_rows(x: Tensor):
    """(round(x * 127 / amax) as float, amax / 127) per row of the last dimension."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    qmax = torch.full_like(amax, QMAX)  # true divisions (`scalar / tensor` multiplies by a reciprocal)
    inv = torch.div(qmax, torch.where(amax == 0, torch.ones_like(amax), amax))
    q = torch.round(x * inv).clamp_(-QMAX, QMAX)
    return q, torch.div(amax, qmax)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (per output row scales) and int8
    activations (per input row scales), exact integer products."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        q, scale = quantize_rows(w)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", q.to(torch.int8))
        self.register_buffer("scale", scale.squeeze(1).contiguous())
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        # partial sums reach 127 * 127 * K: float32 holds them exactly below 2^24
        self._dtype = torch.float32 if QMAX * QMAX * self.in_features < 2 ** 24 else torch.float64

    def _weight_t(self) -> Tensor:
        """qweight^T in the product's float type (cached; not saved)."""
        w = getattr(self, "_wt", None)
        if w is None or w.device != self.qweight.device:
            w = self._wt = self.qweight.to(self._dtype).t().contiguous()
        return w

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        qx, sx = quantize_rows(x.float().reshape(-1, self.in_features))
        acc = (qx.to(self._dtype) @ self._weight_t()).float()
        y = acc * (sx * self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def is_int8(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace the linear layers of ``model``'s encoder and decoder layers and
    its output projection by :class:`Int8Linear`, in place (embeddings and
    layer norms stay float32).  Idempotent.  Attention modules are switched to
    fairseq's own projection calls (its fused torch path would read the float
    weights directly)."""
    if is_int8(model):
        return model
    targets = []
    for part in ("encoder", "decoder"):
        mod = getattr(model, part, None)
        for layer in getattr(mod, "layers", []) or []:
            targets.append(layer)
    for layer in targets:
        for name, child in list(layer.named_modules()):
            if name and "." not in name and isinstance(child, nn.Linear):
                setattr(layer, name, Int8Linear(child))
        for attn in (getattr(layer, "self_attn", None), getattr(layer, "encoder_attn", None)):
            if attn is None:
                continue
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                if isinstance(getattr(attn, name, None), nn.Linear):
                    setattr(attn, name, Int8Linear(getattr(attn, name)))
            attn.skip_embed_dim_check = True
    dec = getattr(model, "decoder", None)
    if dec is not None and isinstance(getattr(dec, "output_projection", None), nn.Linear):
        dec.output_projection = Int8Linear(dec.output_projection)
    if not is_int8(model):
        raise ValueError(f"--inference-precision int8: no linear layers found in {type(model).__name__}")
    return model
