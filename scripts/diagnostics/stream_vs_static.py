"""Streaming against static batches, side by side in one run: the same
sentences through ``Translator.translate_batch`` (B rows of the engine's
running batch, a row that ends refilled at the next pass boundary) and
through ``translate_static`` in batches of B (fairseq's batching: every
sentence of a batch waits for its longest), in alternating rounds, at each B.
Every streamed output is checked against the sentence's own
``translate(s)``.  ``--load N`` runs N CPU-bound processes beside it.

    python scripts/diagnostics/stream_vs_static.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--rows 8,32,128] [--rounds 3] [--decoding iad|greedy] [--int8] [--threads 2] [--load 2]
"""
import argparse
import statistics
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("input")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--rows", default="8,32,128")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decoding", choices=("iad", "greedy"), default="iad")
    p.add_argument("--int8", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="engine threads (default: every usable CPU)")
    p.add_argument("--load", type=int, default=0)
    args = p.parse_args(argv)

    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.diagnostics.loading import translator_and_lines
    from fairseq_aggressive.native.machine import describe_machine

    t, lines, alone = translator_and_lines(args.model_dir, args.input, args.sentences, args.decoding, args.int8,
                                           args.threads)
    with cpu_load(args.load):
        print(f"{describe_machine()}; {len(lines)} sentences, {args.decoding}{' int8' if args.int8 else ''}, "
              f"load {args.load}; ms per sentence, the median of {args.rounds} rounds")
        print("| rows | streamed | static batches | static / streamed |")
        print("|---|---|---|---|")
        for rows in (int(x) for x in args.rows.split(",")):
            t.translate_batch(lines[:rows], rows=rows)
            streamed, static = [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                out = t.translate_batch(lines, rows=rows)
                streamed.append(time.perf_counter() - t0)
                assert out == alone, f"rows {rows}: a streamed output differs from the sentence's own"
                t0 = time.perf_counter()
                for i in range(0, len(lines), rows):
                    t.translate_static(lines[i:i + rows])
                static.append(time.perf_counter() - t0)
            a, b = statistics.median(streamed), statistics.median(static)
            print(f"| {rows} | {1000 * a / len(lines):.2f} | {1000 * b / len(lines):.2f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
