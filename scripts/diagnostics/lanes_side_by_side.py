#!/usr/bin/env python
"""Static batches decoded whole on the engine's threads against the same
batches dealt among one-thread lanes (``NativeVerifier.lanes``), each batch by
both in turn (every other batch in the reverse order), in one process, every
output checked to be the same: whether lanes pay for this model at this batch
size on this machine now (``NativeEngine.default_lanes`` chooses by the
weights a pass reads).  With ``--stream ROWS``: the sentences streamed through
ROWS rows (``Translator.translate_batch``) in one running batch on the
engine's threads against its rows split among one-thread lanes, the two ways
in turn round by round.

    python scripts/diagnostics/lanes_side_by_side.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--checkpoint PATH] [--batch-size 8 | --stream ROWS] [--sentences 150] [--rounds 3] [--int8]
        [--decoding greedy|iad] [--load N]

Prints the weights a pass reads, the defaults' choices, and ms per sentence
(the median of the rounds after a warm-up round) of each way; ``--load N``
beside N CPU-bound processes.
"""
import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("sentences_file")
    ap.add_argument("--checkpoint", default=None, help="another checkpoint with the model directory's dictionaries")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--stream", type=int, default=None, metavar="ROWS", help="stream through this many rows instead")
    ap.add_argument("--sentences", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--decoding", choices=["greedy", "iad"], default="greedy")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside it")
    a = ap.parse_args(argv)
    if a.batch_size < 2 or a.rounds < 1 or a.sentences < 1 or (a.stream is not None and a.stream < 2):
        ap.error("--batch-size and --stream must be >= 2, --rounds and --sentences >= 1")

    import torch

    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.diagnostics.loading import token_batches
    from fairseq_aggressive.native.machine import describe_machine, machine_info
    from fairseq_aggressive.translator import Translator, load_hub

    hub = load_hub(a.model_dir, checkpoint_file=a.checkpoint or "model.pt")
    kw = dict(decoding="iad", max_len_a=1.2, max_len_b=10)
    if a.decoding == "greedy":
        kw["max_draft_len"] = 0
    if a.int8:
        kw["inference_precision"] = "int8"
    ways = {"lanes": Translator(hub, **kw), "whole": Translator(hub, **kw)}
    engine = ways["lanes"].generator.verifier.engine
    ways["lanes"].generator.verifier.lanes = engine.threads
    ways["whole"].generator.verifier.lanes = 1
    with open(a.sentences_file, encoding="utf-8") as f:
        lines = [x.strip() for x in f if x.strip()][: a.sentences]
    tokens = [hub.encode(s) for s in lines]
    samples = token_batches(tokens, hub.src_dict, a.batch_size)
    print(f"machine: {describe_machine(machine_info())}; {a.decoding}, {'int8' if a.int8 else 'float32'}, "
          + (f"streamed through {a.stream} rows" if a.stream else f"batches of {a.batch_size}")
          + f", {len(lines)} sentences; {engine.threads} engine threads; a pass reads "
          f"{engine.pass_weight_bytes / 2 ** 20:.1f} MB of weights; default lanes: {engine.default_lanes()} "
          f"(a stream's: {engine.default_lanes(stream=True)}); load {a.load}")
    if a.stream:
        return streamed(ways["lanes"], lines, a.stream, engine.threads, a.rounds, a.load)
    times = {w: [] for w in ways}
    with cpu_load(a.load):
        for rnd in range(a.rounds + 1):  # the first round warms up (lanes made, the draft policy measured)
            spent, outs = {w: 0.0 for w in ways}, {w: [] for w in ways}
            for i, s in enumerate(samples):
                for w in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        hyps = hub.task.inference_step(ways[w].generator, hub.models, s)
                    spent[w] += time.perf_counter() - t0
                    outs[w].extend(h[0]["tokens"].tolist() for h in hyps)
            if outs["lanes"] != outs["whole"]:
                print("error: the lanes' outputs differ from the whole batches'", file=sys.stderr)
                return 1
            if rnd:
                for w in ways:
                    times[w].append(1000 * spent[w] / len(lines))
    lanes, whole = statistics.median(times["lanes"]), statistics.median(times["whole"])
    print(f"in {engine.threads} lanes {lanes:.3f} ms a sentence, whole {whole:.3f}: lanes {whole / lanes:.3f}x as fast")
    return 0


def streamed(translator, lines, rows: int, lanes: int, rounds: int, load: int) -> int:
    """The sentences streamed through ``rows`` rows in ``lanes`` lanes and in one running
    batch on every engine thread, in turns round by round (every other round the other first)."""
    from fairseq_aggressive.bench.load import cpu_load

    ways = {"lanes": lanes, "whole": 1}
    times = {w: [] for w in ways}
    with cpu_load(load):
        alone = translator.translate_batch(lines, rows=rows, lanes=1)  # (the warm-up round)
        for rnd in range(rounds):
            for w in (list(ways) if rnd % 2 == 0 else list(ways)[::-1]):
                t0 = time.perf_counter()
                out = translator.translate_batch(lines, rows=rows, lanes=ways[w])
                times[w].append(1000 * (time.perf_counter() - t0) / len(lines))
                if out != alone:
                    print(f"error: the {w} stream's outputs differ", file=sys.stderr)
                    return 1
    lane, whole = statistics.median(times["lanes"]), statistics.median(times["whole"])
    print(f"in {lanes} lanes {lane:.3f} ms a sentence, whole {whole:.3f}: lanes {whole / lane:.3f}x as fast")
    return 0


if __name__ == "__main__":
    sys.exit(main())
