"""The stored results and the docs' tables made from them
(fairseq_aggressive/bench/results.py).

    # store a benchmark's JSON (without its per-sentence records) under results/
    python scripts/results.py add work/run.json results/serving/9x3-b8-loaded.json --label 9+3
    # remake every generated table in README.md and docs/ from results/
    python scripts/results.py tables
    # fail where a page's tables differ from what results/ makes (the test suite runs this)
    python scripts/results.py tables --check
"""
import argparse
import difflib
import json
import os
import sys

from fairseq_aggressive.bench.results import ResultsError, pages, render, stored

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="store a benchmark JSON under results/")
    a.add_argument("bench_json")
    a.add_argument("dest", help="results/TOPIC/NAME.json")
    a.add_argument("--label", required=True, help="the model as the tables name it (9+3, d=512, en-de student)")
    a.add_argument("--command", default=None, help="the command that made it (a JSON without one)")
    a.add_argument("--commit", default=None, help="the commit that ran (a JSON without one)")
    t = sub.add_parser("tables", help="remake the generated tables of README.md and docs/")
    t.add_argument("--check", action="store_true", help="change nothing; exit 1 where a page differs")
    args = p.parse_args(argv)
    try:
        if args.cmd == "add":
            with open(args.bench_json, encoding="utf-8") as f:
                res = stored(json.load(f), args.label, args.command, args.commit)
            if not os.path.abspath(args.dest).startswith(os.path.join(ROOT, "results") + os.sep):
                raise ResultsError(f"{args.dest}: stored results live under {os.path.join(ROOT, 'results')}/")
            os.makedirs(os.path.dirname(os.path.abspath(args.dest)), exist_ok=True)
            tmp = args.dest + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(res, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, args.dest)  # whole or not at all
            print(f"stored {args.dest}")
            return 0
        differ = []
        for page in pages(ROOT):
            with open(page, encoding="utf-8") as f:
                old = f.read()
            new = render(old, ROOT)
            if new == old:
                continue
            differ.append(page)
            if args.check:
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                           os.path.relpath(page, ROOT), "made from results/"))
            else:
                with open(page, "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"remade {os.path.relpath(page, ROOT)}")
        if args.check and differ:
            print(f"\n{len(differ)} page(s) differ from what results/ makes: python scripts/results.py tables")
            return 1
        return 0
    except (ResultsError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
