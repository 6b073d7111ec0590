"""``block_nat``: the non-autoregressive block drafter of GAD (Ge et al. 2022).

An encoder plus a decoder that reads the already decoded prefix followed by
``k`` mask slots and predicts the ``k`` slots in parallel.  Self-attention is
bidirectional over prefix and block; positions are added as usual (slot ``i``
of a block after a prefix of ``p`` tokens sits at position ``p + 1 + i`` behind
the BOS).  There is no length predictor: a block simply contains EOS when the
sentence ends.  Optionally (``--block-src-copy``) each mask slot starts from a
soft copy of the source token embeddings near its position (GLAT's copy of
source embeddings, without a length).

Decoder input layout (one row): ``[bos, y_1 .. y_p, M x k, pad ...]`` with a
bool ``slots`` mask marking the ``M`` positions; slot ``i`` predicts
``y_{p+1+i}``.  The ids at slot positions are ignored (any non-pad id).

Two options make a drafter cheap on a CPU:

* ``--shared-encoder``: the drafter reads the *verifier's* encoder output
  instead of encoding the source itself.  The encoder is initialised from
  ``--init-encoder-from`` (the verifier) and frozen, in eval mode, so that the
  drafter trains on exactly the features the verifier's encoder gives at
  decoding time; with ``--share-all-embeddings`` the (tied) embeddings and
  output projection stay frozen too and only the decoder layers, the mask
  embedding and the decoder's layer norms train.  At decoding time GAD runs
  one encoder per sentence, the verifier's, and checks that it is the one the
  drafter was trained on.
* ``--block-causal-prefix``: prefix positions attend causally (position ``i``
  to positions ``<= i``), block positions to everything.  The prefix's keys
  and values then do not depend on the block, so a decoder can keep them in a
  cache across passes and run only the new tokens and the ``k`` slots.

``--verifier-features`` (with ``--shared-encoder``) lets the drafter read what
the verifier already knows about the prefix: each prefix token's input also
gets a learnt projection of the verifier's decoder features (last layer,
normalised) at the position before it, the features that token was chosen
from (nothing for BOS, whose input gets the projection's bias; nothing for the
slots).  The verifier computes those features for every token it emits, so at
decoding time they cost nothing but the projection; in training the verifier
(``--init-encoder-from``'s whole model, frozen, not saved with the drafter)
runs teacher-forced over the target.

``--feature-ar`` (with ``--block-causal-prefix --verifier-features``) makes the
same decoder an autoregressive drafter at the level of features: no slots;
each position reads its token and the verifier's features that chose it, and
is trained (``--criterion feature_ar_loss``) to predict the next token through
the shared output projection and the verifier's features at that position.
Drafting k tokens then takes k cheap steps, each reading the token the drafter
just chose and, in place of the verifier's features, the drafter's own output
there (:class:`~fairseq_aggressive.drafters.feature_ar.FeatureARDrafter`).
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerModel,
    base_architecture,
    transformer_vaswani_wmt_en_de_big,
)
from torch import Tensor, nn

from .partial_checkpoint import load_partial


class BlockNATDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, src_copy: bool = False, causal_prefix: bool = False,
                 verifier_features: bool = False, feature_ar: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        dim = embed_tokens.embedding_dim
        self.mask_embed = nn.Parameter(torch.empty(dim).normal_(0, dim**-0.5))
        self.src_copy = src_copy
        self.causal_prefix = causal_prefix
        # the verifier's features -> this decoder's input width.  They are as wide
        # as the verifier's encoder output, which a --verifier-features drafter
        # shares (--shared-encoder): cfg.encoder.embed_dim
        self.feature_proj = nn.Linear(cfg.encoder.embed_dim, self.embed_dim) if verifier_features else None
        # a --feature-ar drafter narrower than its verifier reads its own output
        # (this decoder's width) through a projection of its own
        self.own_feature_proj = nn.Linear(self.embed_dim, self.embed_dim) \
            if verifier_features and feature_ar and cfg.encoder.embed_dim != self.embed_dim else None

    def forward(self, prev_output_tokens, encoder_out=None, slots: Optional[Tensor] = None,
                features_only: bool = False, block: Optional[Tensor] = None,
                prefix_feats: Optional[Tensor] = None, **unused):
        if slots is None or unused.get("incremental_state") is not None:
            raise ValueError(
                "block_nat is a non-autoregressive drafter and cannot decode on its own: "
                "decode with an autoregressive verifier and --decoding gad --drafter-path THIS.pt"
            )
        x = self.extract_block_features(prev_output_tokens, slots, encoder_out, block=block,
                                        prefix_feats=prefix_feats)
        return (x if features_only else self.output_layer(x)), {}

    def slot_inputs(self, tokens: Tensor, slots: Tensor, encoder_out) -> Tensor:
        """Token embeddings with the mask slots replaced (B, T, C)."""
        x = self.embed_tokens(tokens)
        fill = self.mask_embed.to(x.dtype).expand_as(x)
        if self.src_copy and encoder_out is not None:
            fill = fill + self._soft_copy(tokens.size(1), encoder_out).to(x.dtype)
        return torch.where(slots.unsqueeze(-1), fill, x)

    def _soft_copy(self, tgt_len: int, encoder_out) -> Tensor:
        """Source token embeddings averaged with weights softmax(-|i - j|)."""
        src_emb = encoder_out["encoder_embedding"][0] / self.embed_scale  # (B, S, C) unscaled
        S = src_emb.size(1)
        i = torch.arange(tgt_len, device=src_emb.device, dtype=torch.float).unsqueeze(1)
        j = torch.arange(S, device=src_emb.device, dtype=torch.float).unsqueeze(0)
        logits = -(i - j).abs().unsqueeze(0).expand(src_emb.size(0), -1, -1)  # (B, T, S)
        if len(encoder_out["encoder_padding_mask"]) > 0:
            pad = encoder_out["encoder_padding_mask"][0].unsqueeze(1)
            logits = logits.masked_fill(pad, -math.inf)
        return torch.bmm(logits.softmax(-1).to(src_emb.dtype), src_emb)

    def feature_inputs(self, prefix_feats: Tensor, block: Tensor, tokens: Tensor, own=None) -> Tensor:
        """What the verifier's features add to the inputs (B, T, C): their
        projection at the prefix positions (BOS included), zero at the block's
        and at padding.  ``own`` (a drafter with ``own_feature_proj``): a pair
        (mask (B, T), outputs (B, T, C)), the positions that read the drafter's
        own outputs through that projection instead."""
        prefix = tokens.ne(self.padding_idx) & ~block
        x = self.feature_proj(prefix_feats.to(self.feature_proj.weight.dtype))
        if own is not None:
            mask, outputs = own
            x = torch.where(mask.unsqueeze(-1), self.own_feature_proj(outputs.to(x.dtype)), x)
        return x * prefix.unsqueeze(-1)

    def _embed(self, tokens: Tensor, slots: Tensor, encoder_out, prefix_feats: Optional[Tensor] = None,
               block: Optional[Tensor] = None, own=None) -> Tensor:
        x = self.embed_scale * self.slot_inputs(tokens, slots, encoder_out)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if self.embed_positions is not None:
            x = x + self.embed_positions(tokens)
        if self.feature_proj is not None:
            if prefix_feats is None:
                raise ValueError("this drafter reads the verifier's features (--verifier-features): "
                                 "pass prefix_feats")
            x = x + self.feature_inputs(prefix_feats, slots if block is None else block, tokens, own)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return x

    @torch.no_grad()
    def fast_block_features(self, tokens: Tensor, slots: Tensor, encoder_out, enc_kv,
                            prefix_feats: Optional[Tensor] = None) -> Tensor:
        """Inference path of :meth:`extract_block_features` (eval mode): the same
        layer arithmetic with encoder keys/values precomputed once per batch
        (``enc_kv`` from :func:`fairseq_aggressive.runtime.layer_ops.encoder_kv`) and
        fused attention; no per-call encoder projections."""
        from ..runtime.layer_ops import attention_backends, attention_scope

        with attention_scope(attention_backends(tokens.device, self.embed_tokens.weight.dtype)):
            return self._layer_features(tokens, slots, encoder_out, enc_kv, slots, prefix_feats)

    def _layer_features(self, tokens: Tensor, slots: Tensor, encoder_out, enc_kv, block: Tensor,
                        prefix_feats: Optional[Tensor] = None, own=None) -> Tensor:
        """The stock layers' arithmetic (:func:`~fairseq_aggressive.runtime.layer_ops.decoder_layer`)
        with a per-row self-attention mask; in training mode with the layers' dropout."""
        from ..runtime.layer_ops import decoder_layer

        train = self.training
        x = self._embed(tokens, slots, encoder_out, prefix_feats, block, own)
        if train:
            x = self.dropout_module(x)
        mask = self.self_attn_mask(tokens, block)
        enc_k, enc_v, enc_mask = enc_kv
        for li, layer in enumerate(self.layers):
            p = layer.self_attn.dropout_module.p if train else 0.0

            def attention(q, k, v, p=p):
                return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                                      attn_mask=mask, dropout_p=p, scale=1.0)

            x = decoder_layer(layer, x, attention, enc_k[li], enc_v[li], enc_mask, train=train)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x

    def self_attn_mask(self, tokens: Tensor, block: Tensor) -> Optional[Tensor]:
        """Boolean self-attention mask (B, 1, T, T), True = attend, or None
        (everything attends to everything).  Keys: the non-pad positions; with
        ``causal_prefix`` a query before the block sees only keys up to itself
        (``block`` marks the block positions, slots and revealed slots alike,
        which follow the prefix)."""
        keep = tokens.ne(self.padding_idx)
        if not self.causal_prefix:
            return None if bool(keep.all()) else keep[:, None, None, :]
        T = tokens.size(1)
        idx = torch.arange(T, device=tokens.device)
        causal = (idx.view(1, T, 1) >= idx.view(1, 1, T)) | block.unsqueeze(2)  # (B, Tq, Tk)
        return (causal & keep.unsqueeze(1)).unsqueeze(1)

    def extract_block_features(self, tokens: Tensor, slots: Tensor, encoder_out,
                               block: Optional[Tensor] = None, prefix_feats: Optional[Tensor] = None,
                               own=None) -> Tensor:
        """Decoder features (B, T, C).  ``block`` (default ``slots``): the
        positions after the prefix, for the causal-prefix mask (glancing
        reveals some slots, which stay block positions).  ``prefix_feats``
        (B, T, C'), for a ``--verifier-features`` drafter: at prefix position
        ``i`` the verifier's features that chose token ``i`` (zeros at BOS);
        ``own``: see :meth:`feature_inputs`."""
        if self.causal_prefix:  # a per-row mask: the stock layers' own attention cannot take it
            from ..runtime.layer_ops import encoder_kv

            return self._layer_features(tokens, slots, encoder_out, encoder_kv(self.layers, encoder_out),
                                        slots if block is None else block, prefix_feats, own)
        enc, enc_pad = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            enc_pad = encoder_out["encoder_padding_mask"][0]
        x = self.dropout_module(self._embed(tokens, slots, encoder_out, prefix_feats, block)).transpose(0, 1)
        pad_mask = tokens.eq(self.padding_idx)
        pad_mask = pad_mask if bool(pad_mask.any()) else None
        for layer in self.layers:  # no future mask: bidirectional
            x, _, _ = layer(x, enc, enc_pad, None, self_attn_mask=None, self_attn_padding_mask=pad_mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x


@register_model("block_nat")
class BlockNATModel(TransformerModel):
    """Transformer encoder + bidirectional block decoder (the GAD drafter)."""

    is_block_drafter = True

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--block-src-copy", action="store_true",
                            help="start mask slots from a soft copy of the source embeddings")
        parser.add_argument("--init-encoder-from", type=str, metavar="CKPT",
                            help="initialise the encoder (and shared embeddings) from the "
                            "encoder of this (autoregressive) checkpoint")
        parser.add_argument("--shared-encoder", action="store_true",
                            help="read the verifier's encoder output at decoding time: the encoder "
                            "comes from --init-encoder-from (the verifier) and stays frozen")
        parser.add_argument("--block-causal-prefix", action="store_true",
                            help="prefix positions attend causally (their keys/values can be cached "
                            "across passes), block positions to everything")
        parser.add_argument("--verifier-features", action="store_true",
                            help="prefix tokens also read the verifier's decoder features that chose "
                            "them (needs --shared-encoder; in training the --init-encoder-from model "
                            "runs teacher-forced, frozen)")
        parser.add_argument("--feature-ar", action="store_true",
                            help="an autoregressive drafter of the verifier's features (needs "
                            "--block-causal-prefix --verifier-features; train with --criterion feature_ar_loss, "
                            "decode with --decoding feature-ar)")

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return BlockNATDecoder(
            TransformerConfig.from_namespace(args), tgt_dict, embed_tokens,
            src_copy=getattr(args, "block_src_copy", False),
            causal_prefix=getattr(args, "block_causal_prefix", False),
            verifier_features=getattr(args, "verifier_features", False),
            feature_ar=getattr(args, "feature_ar", False),
        )

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        path = getattr(args, "init_encoder_from", None)
        model.shared_encoder = bool(getattr(args, "shared_encoder", False))
        if model.shared_encoder and not (path or getattr(args, "encoder_initialized_from", None)):
            raise ValueError("--shared-encoder needs --init-encoder-from VERIFIER.pt: the drafter "
                             "reads that model's encoder output")
        if path:
            load_partial(model.encoder, path, "--init-encoder-from", "the drafter's encoder", prefix="encoder.")
            # the weights now live in this model's checkpoints: do not reload at decoding time
            args.encoder_initialized_from = path
            args.init_encoder_from = None
        if model.shared_encoder:
            model.encoder.requires_grad_(False)  # with shared embeddings: those and the output layer too
            model.encoder.eval()
        model.reads_verifier_features = bool(getattr(args, "verifier_features", False))
        model._verifier = None
        if model.reads_verifier_features:
            if not model.shared_encoder:
                raise ValueError("--verifier-features needs --shared-encoder: the features are the "
                                 "verifier's, computed over the verifier's encoder output")
            if path:  # training: the verifier that produces the features (not a submodule: not saved)
                object.__setattr__(model, "_verifier", load_verifier(path, task))  # not registered
        model.feature_ar = bool(getattr(args, "feature_ar", False))
        if model.feature_ar:
            model.is_block_drafter = False  # an instance attribute: GAD refuses it
            if not (model.reads_verifier_features and getattr(args, "block_causal_prefix", False)):
                raise ValueError("--feature-ar needs --block-causal-prefix --verifier-features (and so "
                                 "--shared-encoder): it drafts from the verifier's features, causally")
        return model

    def verifier_prefix_features(self, prev_output_tokens: Tensor, encoder_out) -> Tensor:
        """Training inputs of a ``--verifier-features`` drafter: the verifier run
        teacher-forced over ``prev_output_tokens`` (B, L), its features shifted
        one position right (position ``i`` holds what chose token ``i``, zeros
        at BOS), (B, L, C)."""
        feats = self.verifier_features(prev_output_tokens, encoder_out)
        return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)

    def verifier_features(self, prev_output_tokens: Tensor, encoder_out) -> Tensor:
        """The verifier's decoder features (last layer, normalised) teacher-forced
        over ``prev_output_tokens`` (B, L): position ``i`` holds what chooses
        token ``i + 1``, (B, L, C); no gradients."""
        verifier = self._verifier
        if verifier is None:
            raise ValueError("this drafter's verifier is not loaded: train with --init-encoder-from VERIFIER.pt")
        if next(verifier.parameters()).device != prev_output_tokens.device:
            verifier.to(prev_output_tokens.device)
        with torch.no_grad():
            feats, _ = verifier.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True)
        return feats

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self, "shared_encoder", False):
            self.encoder.eval()  # the verifier's features, without dropout
        return self

    def encode(self, src_tokens, src_lengths):
        """The encoder output the decoder reads (a frozen shared encoder runs without gradients)."""
        if getattr(self, "shared_encoder", False):
            with torch.no_grad():
                return self.encoder(src_tokens, src_lengths=src_lengths)
        return self.encoder(src_tokens, src_lengths=src_lengths)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, slots=None, encoder_out=None, **kwargs):
        """The block decoder over ``prev_output_tokens`` with mask ``slots``;
        ``encoder_out``: this model's encoder output when the caller has it
        already (training runs the gradient-carrying pass through this method,
        so that a DistributedDataParallel wrapper synchronizes the gradients)."""
        if encoder_out is None:
            encoder_out = self.encode(src_tokens, src_lengths)
        return self.decoder(prev_output_tokens, encoder_out, slots=slots, **kwargs)

    def block_logits(self, tokens: Tensor, slots: Tensor, encoder_out, block: Optional[Tensor] = None,
                     prefix_feats: Optional[Tensor] = None) -> Tensor:
        """Logits of the slot positions only, flattened (N_slots, V)."""
        feats = self.decoder.extract_block_features(tokens, slots, encoder_out, block=block,
                                                    prefix_feats=prefix_feats)
        return self.decoder.output_layer(feats[slots])

    def set_num_updates(self, num_updates):
        self.num_updates = num_updates
        super().set_num_updates(num_updates)


def load_verifier(path: str, task):
    """The autoregressive model at ``path`` (built by ``task``: same
    dictionaries), frozen, in eval mode."""
    import os

    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise FileNotFoundError(f"--init-encoder-from: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    verifier = task.build_model(state["cfg"]["model"])
    verifier.load_state_dict(state["model"], strict=True, model_cfg=state["cfg"]["model"])
    if getattr(verifier, "is_block_drafter", False):
        raise ValueError(f"--verifier-features: {path} is a block drafter, not the autoregressive verifier")
    return verifier.eval().requires_grad_(False)


def _block_nat_defaults(args):
    args.dropout = getattr(args, "dropout", 0.1)


@register_model_architecture("block_nat", "block_nat")
def block_nat(args):
    _block_nat_defaults(args)
    base_architecture(args)


@register_model_architecture("block_nat", "block_nat_base")
def block_nat_base(args):
    block_nat(args)


@register_model_architecture("block_nat", "block_nat_big")
def block_nat_big(args):
    _block_nat_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
