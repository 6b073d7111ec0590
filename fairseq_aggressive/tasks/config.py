"""Options of the ``aggressive_translation`` task: fairseq's translation
options plus the decoding, precision and engine choices of this plugin."""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks.translation import TranslationConfig

from ..constants import ENGINES, PRECISION_CHOICES, PRECISIONS
from ..drafters import DECODINGS

# beam = fairseq's own SequenceGenerator; the others are aggressive decodings
DECODING_CHOICES = ChoiceEnum(["beam", *DECODINGS])
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
            "transformer_blockwise model (exact unless --blockwise-topk/--min-block-size); feature-ar = a "
            "block_nat --feature-ar drafter (--drafter-path) drafts --block-size tokens one after the "
            "other from the verifier's features (greedy-exact)"
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
    iad_branches: int = field(
        default=1,
        metadata={"help": "IAD: after an edit, verify up to N copies of the source in one pass, one per "
                  "alignment of the edit (substitution, insertion or deletion of 1-2 tokens, the unique "
                  "suffix match), and keep the one that accepts most (native engine; exact). 1 = the "
                  "paper's single draft"},
    )
    draft_cost: Optional[str] = field(
        default=None,
        metadata={"help": "cost-aware draft lengths (native engine, IAD). unset/auto: the engine's loop "
                  "chooses each pass's lengths from its measured pass cost and the acceptance it learns "
                  "(with --iad-branches > 1, auto measures the cost on the first batch for the generator's "
                  "loop); FIXED,PER_POSITION: a given cost in ms for the generator's loop; off: the drafts "
                  "as made (--max-draft-len)"},
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
    draft_confidence: float = field(
        default=0.0,
        metadata={
            "help": "feature-ar: a draft ends after its first token whose probability under the drafter "
            "is below this (0 = off: drafts of --block-size tokens); shorter drafts where the drafter is "
            "unsure, fewer drafting steps and verified positions; the output stays greedy's"
        },
    )
    drafter_precision: INFERENCE_PRECISION = field(
        default="float32",
        metadata={
            "help": "GAD, feature-ar: int8 = the drafter's linear layers in int8 (the arithmetic of "
            "--inference-precision int8), cheaper drafting steps; proposals only: the verifier (any "
            "precision) decides, so exact decoding still gives the verifier's greedy output"
        },
    )
    drafter_shortlist: Optional[int] = field(
        default=None,
        metadata={
            "help": "GAD: the drafter proposes only among the special symbols, the N most frequent "
            "tokens and the sentence's source tokens, and projects to those only (cheaper drafting "
            "passes). Proposals only: the verifier's choices, and exact GAD's output, stay greedy's"
        },
    )
    gad_beta: int = field(
        default=1,
        metadata={"help": "GAD++: accept a drafted token in the verifier's top-beta (1 = exact)"},
    )
    gad_tau: Optional[float] = field(
        default=None,
        metadata={"help": "GAD++: ... whose log-prob is within tau of the top-1's; needed with "
                          "--gad-beta > 1 (the GAD paper's base settings: 3 and 1.0 for high quality, "
                          "5 and 3.0 for high efficiency)"},
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
            "(fairseq_aggressive/native, compiled into the package per instruction set; standard "
            "Transformers; exact, GAD++ and top-k acceptance); torch = the torch verifier; auto = native "
            "where it runs, else torch (the output is the same either way). A GAD drafter follows: "
            "torch with torch, else native where it runs. With --decoding beam, native runs fairseq's "
            "beam search (--beam, --nbest, --lenpen, --unkpen, --min-len, ...) in the engine, with the "
            "same output; auto and torch keep fairseq's own generator"
        },
    )
    native_threads: str = field(
        default="auto",
        metadata={
            "help": "threads of the native engine (and a native GAD drafter): auto = the CPUs this "
            "process may use (its CPU affinity within a cgroup CPU quota), or a number; "
            "FAIRSEQ_AGGRESSIVE_NATIVE_THREADS sets it for every model. A service running W decoder "
            "processes on N cores gives each N/W (docs/threads-and-load.md)"
        },
    )
    python_loop: bool = field(
        default=False,
        metadata={
            "help": "run the draft -> verify -> accept loop in Python, one engine call per pass, also "
            "where the native engine runs it itself (IAD with one branch unless --draft-cost FIXED,PER_POSITION, greedy "
            "with --max-draft-len 0: one call per batch); the output is the same either way"
        },
    )
    native_isa: str = field(
        default="auto",
        metadata={
            "help": "the native engine's build target: auto = the best this CPU runs (avx512amx, "
            "avx512vnni, avx512, avx2, generic on x86-64; generic on aarch64), or one of them by name; every "
            "target gives the same output, only the speed differs. FAIRSEQ_AGGRESSIVE_ISA sets it "
            "for every model (docs/exactness-and-portability.md)"
        },
    )
    vocab_shortlist: Optional[int] = field(
        default=None,
        metadata={
            "help": "approximate: each sentence chooses among the special symbols, the N most frequent "
            "tokens and its source tokens (Devlin 2017), and the verifier projects to those only; "
            "aggressive decoding then gives greedy's output of this shortlisted model (greedy: "
            "--decoding iad --max-draft-len 0), not of the full one"
        },
    )
    inference_precision: INFERENCE_PRECISION = field(
        default="float32",
        metadata={
            "help": "int8 = decode with int8 linear layers (weights per output row, activations "
            "per position, exact integer products; fairseq_aggressive/runtime/quantization.py): every "
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
