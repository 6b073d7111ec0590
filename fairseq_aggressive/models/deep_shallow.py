"""Deep-encoder / shallow-decoder Transformers (Kasai et al. 2021; SAD paper).

Both presets are stock fairseq ``transformer`` models, so every fairseq tool
and every decoding mode works on them; ``--encoder-layers/--decoder-layers``
override the default 9+3 split (12+2, 7+5, ...)."""
from fairseq.models import register_model_architecture
from fairseq.models.transformer import base_architecture, transformer_vaswani_wmt_en_de_big


def _deep_shallow_depth(args):
    args.encoder_layers = getattr(args, "encoder_layers", 9)
    args.decoder_layers = getattr(args, "decoder_layers", 3)


@register_model_architecture("transformer", "transformer_deep_shallow")
def transformer_deep_shallow(args):
    _deep_shallow_depth(args)
    base_architecture(args)


@register_model_architecture("transformer", "transformer_deep_shallow_big")
def transformer_deep_shallow_big(args):
    _deep_shallow_depth(args)
    transformer_vaswani_wmt_en_de_big(args)
