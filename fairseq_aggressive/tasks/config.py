"""Options of the ``aggressive_translation`` task: fairseq's translation
options, the decoding options (each declared once, with its default, help and
check, in :data:`fairseq_aggressive.decoding_options.OPTIONS`) and the
precision choices of this plugin."""
import dataclasses
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks.translation import TranslationConfig

from ..constants import PRECISION_CHOICES, PRECISIONS
from ..decoding_options import OPTIONS

__all__ = ["AggressiveTranslationConfig"]

PRECISION = ChoiceEnum(list(PRECISION_CHOICES))
INFERENCE_PRECISION = ChoiceEnum(list(PRECISIONS))


@dataclass
class PrecisionConfig(TranslationConfig):
    """fairseq's translation options, the symbols after a source's EOS and the
    plugin's precision choices."""

    inference_precision: INFERENCE_PRECISION = field(
        default="float32",
        metadata={
            "help": "int8 = decode with int8 linear layers (weights per output row, activations "
            "per position, exact integer products; fairseq_aggressive/runtime/quantization.py): every "
            "--decoding, beam and greedy included, runs the same int8 model, so aggressive "
            "decoding still gives that model's greedy output; embeddings and layer norms stay float32"
        },
    )
    source_suffix: str = field(
        default="",
        metadata={
            "help": "comma-separated dictionary symbols after every source's EOS (an imported mBART "
            "model's source language token, as its tokenizer puts it): added to binarized sources "
            "and to text alike"
        },
    )
    cpu_bf16: PRECISION = field(
        default="off",
        metadata={
            "help": "train and validate under torch.autocast('cpu', bfloat16) (fairseq's --bf16 "
            "takes a TPU path on CPU): auto (the bare flag) = only where the CPU has native "
            "bf16, else float32 with a warning; on = always (emulated bf16 is ~75x slower); "
            "off (default). Decoding stays fp32",
            "argparse_const": "auto",
        },
    )


# the task's configuration: the above and a field per decoding option
AggressiveTranslationConfig = dataclasses.make_dataclass(
    "AggressiveTranslationConfig", [o.task_field() for o in OPTIONS], bases=(PrecisionConfig,),
    namespace={"__module__": __name__})
