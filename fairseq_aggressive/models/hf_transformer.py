"""Transformers imported from Hugging Face checkpoints (``hf_transformer``,
made by :mod:`fairseq_aggressive.hf`): fairseq's own Transformer with the
four things some of those checkpoints need beyond it.

- ``--final-logits-bias``: a bias on the output projection (Marian's and
  BART's ``final_logits_bias``; the converter also puts -inf there for the
  rows a model must never emit).
- ``--swish``: SiLU in every layer, as transformers computes it, in place
  of ``--activation-fn`` (fairseq's options do not offer it).
- ``--decoder-start bos`` (or an index): decoding starts from the
  dictionary's ``<s>`` instead of EOS (Marian starts from its pad token's
  embedding, which the converter puts at ``<s>``; mBART from its target
  language token); :func:`decoder_start` says which token, and
  the task passes it to every generator.
- ``--forced-first INDEX``: every output starts with that token
  (transformers' ``forced_bos_token_id``: M2M100's and NLLB's target
  language, BART's ``<s>``); :func:`forced_first` says which, and the task
  gives it to every generator (fairseq's as a prefix token).

Everything else is fairseq's ``transformer``, so every decoding mode, the
native engine and fairseq's own tools take these models as they are.
"""
import torch
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture


@register_model("hf_transformer")
class HFTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--final-logits-bias", action="store_true",
                            help="a bias on the output projection (imported models)")
        parser.add_argument("--swish", action="store_true",
                            help="SiLU (transformers' swish) in every layer in place of --activation-fn")
        parser.add_argument("--decoder-start", default="eos",
                            help="the token decoding starts from: eos (fairseq's), bos (<s>) or a target "
                                 "dictionary index (an imported mBART model's target language token)")
        parser.add_argument("--forced-first", type=int, default=-1, metavar="INDEX",
                            help="the target dictionary index every output starts with (transformers' "
                                 "forced_bos_token_id: a target language token, BART's <s>); -1: none")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        if getattr(args, "final_logits_bias", False):
            out = model.decoder.output_projection
            out.bias = torch.nn.Parameter(out.weight.new_zeros(out.out_features))
        if getattr(args, "swish", False):
            for layer in list(model.encoder.layers) + list(model.decoder.layers):
                layer.activation_fn = F.silu
        model.decoder_start = str(getattr(args, "decoder_start", "eos"))
        if model.decoder_start not in ("eos", "bos") and not (
                model.decoder_start.isdigit() and int(model.decoder_start) < len(task.target_dictionary)):
            raise ValueError(f"--decoder-start {model.decoder_start}: eos, bos or an index of the target "
                             f"dictionary ({len(task.target_dictionary)} types)")
        model.forced_first = getattr(args, "forced_first", -1)
        if not -1 <= model.forced_first < len(task.target_dictionary):
            raise ValueError(f"--forced-first {model.forced_first}: an index of the target dictionary "
                             f"({len(task.target_dictionary)} types) or -1")
        return model


def decoder_start(model, tgt_dict):
    """The token ``model``'s decoding starts from, or None for fairseq's (EOS)."""
    start = str(getattr(model, "decoder_start", "eos"))
    return None if start == "eos" else tgt_dict.bos() if start == "bos" else int(start)


def forced_first(model):
    """The token every output of ``model`` starts with, or None (fairseq's models)."""
    f = getattr(model, "forced_first", -1)
    return None if f < 0 else f


@register_model_architecture("hf_transformer", "hf_transformer")
def hf_transformer(args):
    args.decoder_start = getattr(args, "decoder_start", "eos")
    args.forced_first = getattr(args, "forced_first", -1)
    args.final_logits_bias = getattr(args, "final_logits_bias", False)
    args.swish = getattr(args, "swish", False)
    base_architecture(args)
