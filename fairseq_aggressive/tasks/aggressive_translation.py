"""Task ``aggressive_translation``: fairseq's translation task whose generator
is chosen by ``--decoding`` (``beam`` = stock SequenceGenerator, ``iad`` =
input-guided aggressive decoding, ``gad`` = a ``block_nat`` drafter proposes
blocks, GAD++ with ``--gad-beta/--gad-tau``), plus opt-in CPU bfloat16 (only
where the CPU does it natively: :mod:`fairseq_aggressive.cpu_features`).  The
same task trains the AR models and (``--block-size``) the block drafter."""
import atexit
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import checkpoint_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..acceptance import build_acceptance, build_blockwise_acceptance
from ..cpu_features import PRECISION_CHOICES, use_bf16
from ..generator import ENGINES
from ..quantization import PRECISIONS, is_int8, quantize_int8

logger = logging.getLogger("fairseq_aggressive")

DECODINGS = ["beam", "iad", "gad", "blockwise"]
DECODING_CHOICES = ChoiceEnum(DECODINGS)
PRECISION = ChoiceEnum(list(PRECISION_CHOICES))
ENGINE_CHOICES = ChoiceEnum(list(ENGINES))
INFERENCE_PRECISION = ChoiceEnum(list(PRECISIONS))


@dataclass
class AggressiveTranslationConfig(TranslationConfig):
    decoding: DECODING_CHOICES = field(
        default="beam",
        metadata={
            "help": "decoder: beam = fairseq's SequenceGenerator (beam search / greedy); "
            "iad = input-guided aggressive decoding; gad = a block_nat drafter "
            "(--drafter-path) proposes --block-size tokens per pass (both greedy-exact "
            "unless --gad-beta > 1, need --beam 1); blockwise = the proposal heads of a "
            "transformer_blockwise model (exact unless --blockwise-topk/--min-block-size)"
        },
    )
    max_draft_len: Optional[int] = field(
        default=None,
        metadata={"help": "longest draft verified in one pass (Lmax); default: 4 with the native "
                  "engine, unlimited with the torch verifier"},
    )
    iad_ngram_min: int = field(
        default=1,
        metadata={"help": "IAD: shortest output suffix used to re-find the place in the source"},
    )
    iad_ngram_max: int = field(
        default=4,
        metadata={"help": "IAD: longest output suffix used to re-find the place in the source"},
    )
    drafter_path: Optional[str] = field(
        default=None, metadata={"help": "GAD: checkpoint of the block_nat drafter"}
    )
    block_size: Optional[int] = field(
        default=None,
        metadata={
            "help": "block_nat: tokens drafted per block (k); training default 25, "
            "decoding default = the drafter's training value"
        },
    )
    drafter_bf16: PRECISION = field(
        default="off",
        metadata={
            "help": "GAD: run the drafter in bfloat16: auto (the bare flag) = only where the CPU "
            "has native bf16 (AVX-512 BF16, AMX), else float32 with a warning; on = always; "
            "off. The verifier stays fp32, so exact GAD still equals greedy",
            "argparse_const": "auto",
        },
    )
    gad_beta: int = field(
        default=1,
        metadata={"help": "GAD++: accept a drafted token in the verifier's top-beta (1 = exact)"},
    )
    gad_tau: float = field(
        default=0.0,
        metadata={"help": "GAD++: ... whose log-prob is within tau of the top-1's"},
    )
    blockwise_topk: int = field(
        default=1,
        metadata={"help": "blockwise: accept a proposed token in the verifier's top-K (1 = exact)"},
    )
    min_block_size: int = field(
        default=1,
        metadata={"help": "blockwise: every pass emits at least this many tokens (1 = exact)"},
    )
    engine: ENGINE_CHOICES = field(
        default="auto",
        metadata={
            "help": "verifier of --decoding iad/gad/blockwise: native = the compiled CPU engine "
            "(fairseq_aggressive/native, built with the system C++ compiler at first use; exact "
            "acceptance and standard Transformers only); torch = the torch verifier; auto = native "
            "where it runs, else torch (the output is greedy's either way)"
        },
    )
    inference_precision: INFERENCE_PRECISION = field(
        default="float32",
        metadata={
            "help": "int8 = decode with int8 linear layers (weights per output row, activations "
            "per position, exact integer products; fairseq_aggressive/quantization.py): every "
            "--decoding, beam and greedy included, runs the same int8 model, so aggressive "
            "decoding still gives that model's greedy output; embeddings and layer norms stay float32"
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
        if cfg.block_size is not None and cfg.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {cfg.block_size}")
        build_acceptance(cfg.gad_beta, cfg.gad_tau)  # checks beta/tau
        build_blockwise_acceptance(cfg.blockwise_topk, cfg.min_block_size)
        self._drafters = {}
        self._train_bf16 = None

    def _option(self, args, name):
        """A decoding option: per-call generation args (hub API) win over the task config."""
        value = getattr(args, name, None)
        return value if value is not None else getattr(self.cfg, name)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        decoding = str(self._option(args, "decoding"))
        if str(self._option(args, "inference_precision")) == "int8":
            for model in models:
                quantize_int8(model)
        elif any(is_int8(model) for model in models):
            raise ValueError("this model was quantized in place by an earlier --inference-precision int8 "
                             "(e.g. a hub model's translate(inference_precision='int8')); load it again "
                             "to decode in float32")
        if decoding == "beam" or getattr(args, "score_reference", False):
            return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs)
        if decoding not in DECODINGS:
            raise ValueError(f"unknown --decoding {decoding!r}; choose from {', '.join(DECODINGS)}")
        check_generation_args(args, decoding)
        if kwargs.get("prefix_allowed_tokens_fn") is not None:
            raise ValueError(f"prefix_allowed_tokens_fn is not supported with --decoding {decoding}")
        from ..generator import AggressiveGenerator

        acceptance = None
        if decoding == "iad":
            from ..drafters import InputCopyDrafter

            drafter = InputCopyDrafter(
                self.source_dictionary,
                self.target_dictionary,
                ngram_min=self._option(args, "iad_ngram_min"),
                ngram_max=self._option(args, "iad_ngram_max"),
            )
        elif decoding == "blockwise":
            from ..drafters import BlockwiseHeadsDrafter

            drafter = BlockwiseHeadsDrafter(models[0], self.target_dictionary)
            acceptance = build_blockwise_acceptance(
                self._option(args, "blockwise_topk"), self._option(args, "min_block_size"),
                block_size=models[0].blockwise_k,
            )
        else:
            drafter = self._build_nar_drafter(models, args)
            acceptance = build_acceptance(self._option(args, "gad_beta"), self._option(args, "gad_tau"))
        if len(models) != 1:
            raise ValueError(
                f"aggressive decoding verifies with a single model, got an ensemble of {len(models)}"
            )
        generator = AggressiveGenerator(
            models,
            self.target_dictionary,
            drafter,
            acceptance=acceptance,
            max_len_a=getattr(args, "max_len_a", 0),
            max_len_b=getattr(args, "max_len_b", 200),
            min_len=getattr(args, "min_len", 1),
            normalize_scores=not getattr(args, "unnormalized", False),
            len_penalty=getattr(args, "lenpen", 1),
            unk_penalty=getattr(args, "unkpen", 0),
            temperature=getattr(args, "temperature", 1.0),
            max_draft_len=self._option(args, "max_draft_len"),
            engine=str(self._option(args, "engine")),
        )
        atexit.register(_log_summary, generator, decoding)
        return generator

    def load_drafter(self, path: str, like=None, dtype=None):
        """The block_nat drafter at ``path`` (cached) and its training block size,
        on the device and in the dtype of the module ``like`` (or ``dtype``)."""
        import os

        if not os.path.isfile(path):
            raise FileNotFoundError(f"--drafter-path: no checkpoint at {path}")
        param = next(like.parameters()) if like is not None else None
        device = param.device if param is not None else None
        dtype = dtype or (param.dtype if param is not None else None)
        key = (os.path.abspath(path), device, dtype)
        if key not in self._drafters:
            state = checkpoint_utils.load_checkpoint_to_cpu(path)
            cfg = state["cfg"]
            self._check_drafter_dictionaries(path, state)
            model = self.build_model(cfg["model"])
            model.load_state_dict(state["model"], strict=True, model_cfg=cfg["model"])
            if device is not None:
                model = model.to(device=device)
            if dtype is not None:
                model = model.to(dtype=dtype)
            trained_k = getattr(cfg["task"], "block_size", None) if cfg.get("task") else None
            self._drafters[key] = (model.eval(), trained_k)
        return self._drafters[key]

    def _check_drafter_dictionaries(self, path, state):
        """Same vocabulary sizes, and the same symbols if the drafter's data dir is here."""
        import os

        from fairseq.data import Dictionary

        from ..drafters import DrafterMismatchError

        emb = state["model"].get("decoder.embed_tokens.weight")
        if emb is not None and emb.size(0) != len(self.target_dictionary):
            raise DrafterMismatchError(
                f"drafter and verifier dictionaries differ: {path} has {emb.size(0)} target "
                f"symbols, the verifier's dictionary {len(self.target_dictionary)}; train both on "
                "the same binarized data (same dict.*.txt)"
            )
        task_cfg = state["cfg"].get("task")
        data = getattr(task_cfg, "data", None) if task_cfg is not None else None
        if not data:
            return
        for lang, ours in ((self.cfg.source_lang, self.source_dictionary),
                           (self.cfg.target_lang, self.target_dictionary)):
            f = os.path.join(data.split(os.pathsep)[0], f"dict.{lang}.txt")
            if lang and os.path.isfile(f) and Dictionary.load(f).symbols != ours.symbols:
                raise DrafterMismatchError(
                    f"drafter and verifier dictionaries differ: {f} (the drafter's) is not the "
                    f"verifier's {lang} dictionary; train both on the same binarized data"
                )

    def _build_nar_drafter(self, models, args):
        from ..drafters import NARBlockDrafter, check_drafter

        path = self._option(args, "drafter_path")
        if not path:
            raise ValueError("--decoding gad needs a drafter: pass --drafter-path DRAFTER.pt")
        dtype = torch.bfloat16 if use_bf16(self._option(args, "drafter_bf16"), "--drafter-bf16") else None
        drafter_model, trained_k = self.load_drafter(path, like=models[0], dtype=dtype)
        check_drafter(drafter_model, models[0], self.target_dictionary)
        k = self._option(args, "block_size")
        if k is None:
            k = trained_k or 25
        return NARBlockDrafter(drafter_model, self.target_dictionary, k)

    # ------------------------------------------------------------ batching
    def get_batch_iterator(self, dataset, *args, required_batch_size_multiple=1, **kwargs):
        """Every sentence of a decoded or validated split gets batched.

        fairseq's ``batch_by_size`` drops a last batch whose size is not a multiple of
        ``--required-batch-size-multiple`` (default 8; fairseq issue #5036), so stock
        ``fairseq-generate`` silently skips up to 7 test sentences.  The multiple is kept
        for the training split only, where it serves fp16 efficiency."""
        if dataset is not self.datasets.get(self._train_split()):
            required_batch_size_multiple = 1
        return super().get_batch_iterator(
            dataset, *args, required_batch_size_multiple=required_batch_size_multiple, **kwargs)

    def _train_split(self):
        return getattr(self.cfg, "train_subset", None) or "train"

    # ------------------------------------------------------------ training
    def _autocast(self):
        if self._train_bf16 is None:  # decided once, on the first step
            self._train_bf16 = use_bf16(self.cfg.cpu_bf16, "--cpu-bf16")
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._train_bf16)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        with self._autocast():
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        with self._autocast():
            return super().valid_step(sample, model, criterion)


def _log_summary(generator, decoding):
    if generator.stats.sentences:
        logger.info(f"aggressive decoding ({decoding}): {generator.stats.summary()}")
