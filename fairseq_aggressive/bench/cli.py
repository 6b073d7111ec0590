"""``fairseq-aggressive-bench``: beam 5, greedy and aggressive decoding side by
side in one process on binarized data.

    fairseq-aggressive-bench DATA --path CKPT --gen-subset test \
        [--bench-modes beam5,greedy,iad] [--batch-size 1] [--threads 2] \
        [--bench-json out.json] [--bench-plot out.png]

GAD modes need ``--drafter-path DRAFTER.pt``: ``gad`` (exact), ``gad++``
(top-beta/tau: ``--gad-beta/--gad-tau`` if beta > 1, else beta 3, tau 1.0),
each optionally with a block size, e.g. ``gad@4,gad@8,gad++@8``; ``gad-bf16@8``
runs the drafter in bfloat16 where the CPU has it natively (float32 elsewhere).  Blockwise
modes (a ``transformer_blockwise`` checkpoint): ``blockwise`` (exact),
``blockwise-top3`` (top-3 acceptance), ``blockwise-min2`` (minimum block 2).

``iad@L`` is IAD with drafts of at most L tokens (``--max-draft-len L``; the
SAD paper's Lmax); ``-bN`` after an IAD mode (``iad-b3``, ``iad@1024-b3``)
verifies up to N copies after an edit in one pass (``--iad-branches N``);
``-cost`` (``iad-cost``, ``iad-b3-cost``) chooses draft lengths from the
engine's measured pass cost (``--draft-cost auto``).  For every aggressive
mode the JSON gives each sentence's passes, and the table after the main one
puts the mean passes against E, the edit spans between the source and
greedy's output (maximal runs of unmatched steps in a Levenshtein
alignment), beside the reference line 1 + 1.3E (one pass, plus 1.3 passes
per edit span) and the fewest passes any drafter that copies the source can need.

``-int8`` after any other mode (``greedy-int8``, ``iad-int8``,
``greedy-native-int8``, ``beam5-int8``) decodes a copy of the model with int8
linear layers (``--inference-precision int8``); its ``=greedy`` column counts
outputs identical to ``greedy-int8`` (the same int8 model) when that mode runs,
and ``=fp32`` those identical to float32 ``greedy`` (the quality change).

``-pyloop`` after an IAD, GAD, feature-ar, blockwise or ``greedy-native`` mode (``iad-pyloop``,
``greedy-native-int8-pyloop``) runs the draft -> verify -> accept loop in
Python, one engine call per pass (``--python-loop``), where the engine would
run it in one call per batch: the same output, the cost of the round trips.

``-dsl`` after a gad mode (``gad@8-dsl``) drafts from the same shortlist
(``--drafter-shortlist``): cheaper drafting passes, the output still greedy's.
``-sl`` after any mode but beam and CTranslate2 (``iad-sl``, ``greedy-sl``,
``iad-int8-sl``) decodes with the vocabulary shortlist (``--vocab-shortlist``
with ``--bench-shortlist`` frequent tokens, default 1,000): an approximate
model; ``greedy-sl`` is greedy search on it and the reference of the ``=greedy``
column of the ``-sl`` modes.

CTranslate2 modes (``pip install 'fairseq-aggressive[ct2]'``): ``ct2`` and
``ct2-int8`` decode the same batches greedily with CTranslate2 (float32 and
int8 compute), converted once from the checkpoint with CTranslate2's fairseq
converter (cached as ``CKPT.ct2/``).  CTranslate2 runs in a process of its own
(in the torch process the two OpenMP runtimes slow each other down many
times), with the same thread count, after the torch modes have finished: the
same warm-up batches first, then every batch timed one by one around
``translate_batch``; the length cap is fairseq's (``--max-len-a/-b``).
``ct2-best`` first times every compute type CTranslate2 supports on the CPU at
1, 2, 4, ... threads (up to the CPUs this process may use) on the first 40
sentences, then decodes the run with the fastest (the JSON's ``ct2_config``
lists every configuration's time).  The ``x ct2...`` column compares every mode
with the fastest CTranslate2 mode of the run.

The torch modes decode every batch back to back (interleaved), so machine
noise hits them alike; then the modes on the native engine (``--engine``)
the same way in a block of their own (torch's idle OpenMP threads and the
engine's worker thread would compete for the cores if the two were
interleaved); a warm-up precedes each block, and timing covers
decoding only (data loading and model loading are excluded).  The table and
the JSON name the machine: CPU model, torch's CPU capability, native bf16,
threads, torch and fairseq versions.
"""
import argparse
import json
import sys

from .options import add_bench_args
from .provenance import output_file, provenance
from .report import plot, plot_edit_spans, print_edit_table, print_position_table, print_table
from .run import run
from .workers import print_workers_table, run_workers


def main(argv=None):
    from fairseq import options

    parser = options.get_generation_parser(default_task="aggressive_translation")
    add_bench_args(parser)
    args = options.parse_args_and_arch(parser, input_args=argv)
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(args)
    if cfg.common_eval.path is None:
        parser.error("--path CHECKPOINT is required")
    if args.bench_load < 0 or args.bench_workers < 0:
        parser.error("--bench-load and --bench-workers must be >= 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.bench_rounds < 1:
        parser.error("--bench-rounds must be >= 1")
    # (checked here, not as the flags' type: a pipeline parses its planned commands before it makes their folders)
    for flag, path in (("--bench-json", args.bench_json), ("--bench-plot", args.bench_plot),
                       ("--bench-edit-plot", args.bench_edit_plot)):
        if path:
            try:
                output_file(path)
            except argparse.ArgumentTypeError as e:
                parser.error(f"argument {flag}: {e}")
    if args.bench_workers:
        res = run_workers(sys.argv[1:] if argv is None else list(argv), args)
        res.update(provenance(sys.argv if argv is None else ["fairseq-aggressive-bench"] + list(argv)))
        print_workers_table(res)
        if args.bench_json:
            with open(args.bench_json, "w") as f:
                json.dump(res, f, indent=1)
        return res
    res = run(cfg, args)
    res.update(provenance(sys.argv if argv is None else ["fairseq-aggressive-bench"] + list(argv)))
    print_table(res)
    print_edit_table(res)
    print_position_table(res)
    if args.bench_json:
        with open(args.bench_json, "w") as f:
            json.dump(res, f, indent=1)
    if args.bench_plot and "iad" in res["modes"]:
        plot(res, args.bench_plot, base="beam5" if "beam5" in res["modes"] else "greedy")
    if args.bench_edit_plot and res.get("passes_by_edit_spans"):
        plot_edit_spans(res, args.bench_edit_plot)
    return res


def cli_main(argv=None):
    main(argv)  # console-script wrapper: exit status 0, not the result dict
