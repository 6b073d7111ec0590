"""``transformer_blockwise``: blockwise parallel decoding heads (Stern et al. 2018).

A stock fairseq Transformer plus, between the decoder output and the (shared)
vocabulary projection, one feed-forward layer with hidden size ``(k-1) x
d_ffn`` and output ``(k-1) x d_model`` with a residual connection to each of
its ``k-1`` outputs.  Head 1 is the base model's own next-token prediction (the
identity: exact blockwise decoding is greedy decoding of the base model);
heads 2..k predict the tokens at t+2..t+k.  ``forward`` is the base model's,
so fairseq's own generators (``--decoding beam``) decode it as the base model.
"""

import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerModel,
    base_architecture,
    transformer_vaswani_wmt_en_de_big,
)
from torch import Tensor, nn

from .partial_checkpoint import checkpoint_has_heads, load_partial



class BlockwiseHeads(nn.Module):
    """``x`` (..., d) -> (..., k-1, d): the inputs of heads 2..k."""

    def __init__(self, dim: int, ffn_dim: int, k: int, dropout: float = 0.0):
        super().__init__()
        if k < 2:
            raise ValueError(f"--blockwise-k must be >= 2 (head 1 is the base model), got {k}")
        self.k, self.dim = k, dim
        self.fc1 = nn.Linear(dim, (k - 1) * ffn_dim)
        self.fc2 = nn.Linear((k - 1) * ffn_dim, (k - 1) * dim)
        self.dropout = dropout
        nn.init.xavier_uniform_(self.fc1.weight)
        nn.init.xavier_uniform_(self.fc2.weight)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: Tensor) -> Tensor:
        h = F.dropout(F.relu(self.fc1(x)), p=self.dropout, training=self.training)
        h = self.fc2(h).view(*x.shape[:-1], self.k - 1, self.dim)
        return x.unsqueeze(-2) + h


@register_model("transformer_blockwise")
class BlockwiseTransformerModel(TransformerModel):
    has_blockwise_heads = True

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        dim = decoder.output_embed_dim
        ffn = getattr(args, "blockwise_ffn_dim", None) or args.decoder_ffn_embed_dim
        self.blockwise_k = int(args.blockwise_k)
        self.blockwise_heads = BlockwiseHeads(dim, ffn, self.blockwise_k, getattr(args, "dropout", 0.0))

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--blockwise-k", type=int, metavar="K",
                            help="block size k: head 1 (the base model) plus k-1 proposal heads")
        parser.add_argument("--blockwise-ffn-dim", type=int, metavar="N",
                            help="hidden size per head of the proposal layer (default: decoder ffn dim)")
        parser.add_argument("--init-from-ar", type=str, metavar="CKPT",
                            help="initialise the base Transformer from this AR checkpoint "
                            "(the paper's fine-tuning settings; see --freeze-base); from a "
                            "transformer_blockwise checkpoint, its heads too (same k and sizes)")
        parser.add_argument("--freeze-base", action="store_true",
                            help="train only the proposal layer (the base model stays as loaded)")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        path = getattr(args, "init_from_ar", None)
        if path:
            with_heads = checkpoint_has_heads(path)
            load_partial(model, path, "--init-from-ar",
                         "the base Transformer and its heads" if with_heads else "the base Transformer",
                         skip=(lambda name: False) if with_heads else (lambda name: name.startswith("blockwise_heads.")))
            args.initialized_from_ar = path
            args.init_from_ar = None  # the weights now live in this model's checkpoints
        if getattr(args, "freeze_base", False):
            for name, p in model.named_parameters():
                if not name.startswith("blockwise_heads."):
                    p.requires_grad_(False)
        return model

    def head_logits(self, features: Tensor) -> Tensor:
        """Logits of heads 2..k: features (..., d) -> (..., k-1, V)."""
        return self.decoder.output_layer(self.blockwise_heads(features))

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self.args, "freeze_base", False) and mode:
            # a frozen base also keeps its dropout off: its outputs stay the loaded model's
            for name, m in self.named_children():
                if name != "blockwise_heads":
                    m.eval()
        return self


def _blockwise_defaults(args):
    args.blockwise_k = getattr(args, "blockwise_k", None) or 4


@register_model_architecture("transformer_blockwise", "transformer_blockwise")
def transformer_blockwise(args):
    _blockwise_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_blockwise", "transformer_blockwise_big")
def transformer_blockwise_big(args):
    _blockwise_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
