"""The benchmark's command-line options (``fairseq-aggressive-bench`` adds them
to fairseq's generation parser)."""
from .modes import GRAMMAR, SHORTLIST_DEFAULT


def add_bench_args(parser):
    g = parser.add_argument_group("benchmark")
    g.add_argument("--bench-modes", default="beam5,greedy,iad",
                   help="comma-separated modes: " + GRAMMAR)
    g.add_argument("--bench-shortlist", type=int, default=SHORTLIST_DEFAULT,
                   help="frequent tokens of the -sl modes' shortlist (plus each sentence's source tokens)")
    g.add_argument("--bench-device", choices=("cpu", "cuda"), default="cpu",
                   help="where the torch modes decode: cpu, or cuda (the first GPU; timing synchronises the "
                   "device after every batch; fairseq's --fp16 decodes a float16 copy there); the native "
                   "engine's and CTranslate2's modes run on the CPU only")
    g.add_argument("--threads", type=int, default=None,
                   help="threads of every engine (torch, the native engine, CTranslate2); default: each "
                   "engine's own default (the native engine: --native-threads auto; CTranslate2: the "
                   "CPUs this process may use; torch: its own, at most the CPUs less --bench-load N)")
    g.add_argument("--bench-load", type=int, default=0, metavar="N",
                   help="run N CPU-bound processes beside the decoder for the whole run (every mode, "
                   "CTranslate2 included): a machine that is also doing other work")
    g.add_argument("--bench-workers", type=int, default=0, metavar="W",
                   help="instead of the table: W decoder processes per mode at once, each decoding its "
                   "share of the sentences one request at a time, as a service with W workers does "
                   "(sentences per second in total, per-request latency p50/p95; CTranslate2: one "
                   "translator with inter_threads=W); each worker gets the CPUs / W threads")
    g.add_argument("--bench-worker-kind", choices=("processes", "threads"), default="processes",
                   help="with --bench-workers: W processes, each with its own copy of the model "
                   "(processes), or one process with W decoder threads on one copy of the native "
                   "engine's weights (threads)")
    g.add_argument("--bench-feature-drafter", default=None, metavar="DRAFTER.pt",
                   help="the drafter of the feature-ar modes (default: --drafter-path), so that one run "
                   "compares GAD's block drafter and the autoregressive feature drafter")
    g.add_argument("--bench-max-sentences", type=int, default=None,
                   help="decode only the first N sentences of the subset")
    g.add_argument("--baseline-path", default=None,
                   help="also decode with beam 5 of this checkpoint (mode 'base_beam5', e.g. a 6+6 "
                   "model as in the papers) and report every mode's speedup over it")
    g.add_argument("--warmup", type=int, default=5, help="batches decoded before timing")
    g.add_argument("--bench-rounds", type=int, default=1, metavar="R",
                   help="decode every batch R times with every mode, the modes taking turns in an order "
                   "that rotates from batch to batch and round to round; times are the mean of the rounds "
                   "and every round's outputs must equal the first's (a noisy machine: R 3 or more)")
    g.add_argument("--bench-json", default=None, help="write all results as JSON here")
    g.add_argument("--bench-plot", default=None, help="write a PNG of speedup vs edit ratio here")
    g.add_argument("--bench-edit-plot", default=None,
                   help="write a PNG of passes per sentence against edit spans here")
    return parser
