"""Task ``aggressive_translation``: fairseq's translation task whose generator
is chosen by ``--decoding`` (``beam`` = stock SequenceGenerator, ``iad`` =
input-guided aggressive decoding), plus an opt-in CPU bf16 training mode."""
import atexit
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

logger = logging.getLogger("fairseq_aggressive")

DECODINGS = ["beam", "iad"]
DECODING_CHOICES = ChoiceEnum(DECODINGS)


@dataclass
class AggressiveTranslationConfig(TranslationConfig):
    decoding: DECODING_CHOICES = field(
        default="beam",
        metadata={
            "help": "decoder: beam = fairseq's SequenceGenerator (beam search / greedy); "
            "iad = input-guided aggressive decoding (greedy-exact, needs --beam 1)"
        },
    )
    max_draft_len: Optional[int] = field(
        default=None,
        metadata={"help": "longest draft verified in one pass (Lmax); default unlimited"},
    )
    iad_ngram_min: int = field(
        default=1,
        metadata={"help": "IAD: shortest output suffix used to re-find the place in the source"},
    )
    iad_ngram_max: int = field(
        default=4,
        metadata={"help": "IAD: longest output suffix used to re-find the place in the source"},
    )
    cpu_bf16: bool = field(
        default=False,
        metadata={
            "help": "train and validate under torch.autocast('cpu', bfloat16) "
            "(fairseq's --bf16 takes a TPU path on CPU); decoding stays fp32"
        },
    )


# generation options that change greedy's choices and that aggressive decoding
# does not reproduce: (option, value that means "off", how the user spells it)
_UNSUPPORTED_GENERATION = [
    ("sampling", False, "--sampling"),
    ("no_repeat_ngram_size", 0, "--no-repeat-ngram-size"),
    ("prefix_size", 0, "--prefix-size"),
    ("constraints", None, "--constraints"),
    ("match_source_len", False, "--match-source-len"),
    ("lm_path", None, "--lm-path"),
    ("diverse_beam_groups", -1, "--diverse-beam-groups"),
    ("diversity_rate", -1, "--diversity-rate"),
    ("print_alignment", None, "--print-alignment"),
    ("retain_dropout", False, "--retain-dropout"),
]


def check_generation_args(args, decoding: str) -> None:
    """Refuse generation options aggressive decoding cannot honour exactly."""
    beam = getattr(args, "beam", 5)
    if beam != 1:
        raise ValueError(
            f"--decoding {decoding} reproduces greedy search: pass --beam 1 (got --beam {beam})"
        )
    nbest = getattr(args, "nbest", 1)
    if nbest != 1:
        raise ValueError(f"--decoding {decoding} returns one hypothesis: pass --nbest 1 (got {nbest})")
    for name, off, flag in _UNSUPPORTED_GENERATION:
        value = getattr(args, name, off)
        if value not in (off, None, False, 0, -1, ""):
            raise ValueError(
                f"{flag} is not supported with --decoding {decoding}; use --decoding beam"
            )


@register_task("aggressive_translation", dataclass=AggressiveTranslationConfig)
class AggressiveTranslationTask(TranslationTask):
    cfg: AggressiveTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        if cfg.max_draft_len is not None and cfg.max_draft_len < 0:
            raise ValueError(f"--max-draft-len must be >= 0 (or unset for unlimited), got {cfg.max_draft_len}")

    def _option(self, args, name):
        """A decoding option: per-call generation args (hub API) win over the task config."""
        value = getattr(args, name, None)
        return value if value is not None else getattr(self.cfg, name)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        decoding = str(self._option(args, "decoding"))
        if decoding == "beam" or getattr(args, "score_reference", False):
            return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs)
        if decoding not in DECODINGS:
            raise ValueError(f"unknown --decoding {decoding!r}; choose from {', '.join(DECODINGS)}")
        check_generation_args(args, decoding)
        if kwargs.get("prefix_allowed_tokens_fn") is not None:
            raise ValueError(f"prefix_allowed_tokens_fn is not supported with --decoding {decoding}")
        from ..drafters import InputCopyDrafter
        from ..generator import AggressiveGenerator

        drafter = InputCopyDrafter(
            self.source_dictionary,
            self.target_dictionary,
            ngram_min=self._option(args, "iad_ngram_min"),
            ngram_max=self._option(args, "iad_ngram_max"),
        )
        generator = AggressiveGenerator(
            models,
            self.target_dictionary,
            drafter,
            max_len_a=getattr(args, "max_len_a", 0),
            max_len_b=getattr(args, "max_len_b", 200),
            min_len=getattr(args, "min_len", 1),
            normalize_scores=not getattr(args, "unnormalized", False),
            len_penalty=getattr(args, "lenpen", 1),
            unk_penalty=getattr(args, "unkpen", 0),
            temperature=getattr(args, "temperature", 1.0),
            max_draft_len=self._option(args, "max_draft_len"),
        )
        atexit.register(_log_summary, generator, decoding)
        return generator

    # ------------------------------------------------------------ training
    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(self.cfg.cpu_bf16))

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        with self._autocast():
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        with self._autocast():
            return super().valid_step(sample, model, criterion)


def _log_summary(generator, decoding):
    if generator.stats.sentences:
        logger.info(f"aggressive decoding ({decoding}): {generator.stats.summary()}")
