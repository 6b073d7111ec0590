"""``fairseq-aggressive-translate MODEL_DIR``: a file of sentences through the model.

    fairseq-aggressive-translate models/uagec-9x3 -i input.txt -o output.txt --rows 32
    cat input.txt | fairseq-aggressive-translate models/uagec-9x3 > output.txt

One sentence a line in, its output on the same line out, in order.  Where
the decoding runs in the engine's running batch (IAD, ``--decoding greedy``,
a native feature drafter) the sentences stream through ``--rows`` rows, a row
that ends refilled at the next pass boundary, so no sentence waits for a
longer one, the rows split among ``--lanes`` running batches of one thread
each (default: one per engine thread where a pass's weights stay in the caches,
``NativeEngine.default_lanes`` with ``stream=True``); other decodings go in static
batches of ``--rows``.  Every output is ``Translator.translate``'s for its
line.  On a terminal a progress bar counts sentences per second.  With ``-o``
the output appears whole or not at all.
"""
import argparse
import logging
import os
import sys

from ..runtime.gc_pause import gc_paused
from ..streaming.options import HelpFormatter, add_decoding_arguments, decoding_settings, translator_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-aggressive-translate", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("model_dir", help="a model directory: model.pt, dict.*.txt, bpe.codes, MODEL.json")
    p.add_argument("-i", "--input", default="-", help="sentences, one a line (-: standard input)")
    p.add_argument("-o", "--output", default="-", help="where the outputs go (-: standard output)")
    p.add_argument("--rows", type=int, default=32,
                   help="sentences decoding at once, at most (a lane takes no more rows than keep their attention "
                        "caches in the CPU's caches: NativeEngine.lane_rows)")
    p.add_argument("--lanes", type=int, default=None,
                   help="running batches the rows are split among, one thread each (default: one per engine "
                        "thread where the weights a pass reads are below 8 MB or a sixteenth of the CPU's "
                        "last-level cache, else 1)")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="a progress bar on standard error (auto: when it is a terminal)")
    p.set_defaults(decoding_names=add_decoding_arguments(p))
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    for name, value in (("--rows", args.rows), ("--lanes", args.lanes)):
        if value is not None and value < 1:
            print(f"fairseq-aggressive-translate: {name} must be >= 1", file=sys.stderr)
            return 2
    from ..translator import Translator
    from ..streaming import stream

    try:
        source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    except OSError as e:
        print(f"fairseq-aggressive-translate: {e}", file=sys.stderr)
        return 2
    try:
        translator = Translator.from_pretrained(args.model_dir, **translator_settings(
            decoding_settings(args, args.decoding_names)))
    except (ValueError, OSError) as e:
        print(f"fairseq-aggressive-translate: {e}", file=sys.stderr)
        return 2
    logging.getLogger("fairseq_aggressive").setLevel(logging.WARNING)
    show = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    tmp = None
    if args.output == "-":
        out = sys.stdout
    else:
        tmp = f"{args.output}.tmp{os.getpid()}"
        out = open(tmp, "w", encoding="utf-8")
    lines = (line.rstrip("\n") for line in source)
    bar = _progress(show)
    try:
        with gc_paused():
            for text in stream(translator, lines, args.rows, lanes=args.lanes):
                out.write(text + "\n")
                if tmp is None:
                    out.flush()
                bar.update(1)
        if tmp is not None:
            out.close()
            os.replace(tmp, args.output)
            tmp = None
    except ValueError as e:  # a line the model cannot take (its number from 1)
        print(f"fairseq-aggressive-translate: {_line_message(e)}", file=sys.stderr)
        return 1
    finally:
        bar.close()
        if tmp is not None:
            out.close()
            os.remove(tmp)
        if source is not sys.stdin:
            source.close()
    return 0


def _line_message(e: ValueError) -> str:
    text = str(e)
    if text.startswith("sentence "):
        index, _, rest = text[len("sentence "):].partition(" ")
        if index.isdigit():
            return f"line {int(index) + 1} {rest}"
    return text


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(show: bool):
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(unit=" sentences", file=sys.stderr, smoothing=0.1)


def cli_main():
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
