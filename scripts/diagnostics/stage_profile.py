#!/usr/bin/env python
"""Where a sentence's time goes when sentences stream through B rows of the
engine's running batch (``Translator.translate_batch``), stage by stage, with
the multiply-adds each stage needs.

    python scripts/diagnostics/stage_profile.py models/uagec-9x3 data/uagec-sample/test.tok.src \\
        [--rows 1,8,32,128] [--sentences 300] [--decoding iad|greedy] [--int8] [--threads 2]
        [--load N] [--json OUT]

The engine's test library times its stages (csrc/model/stages.h): the encoder,
and in each verification pass the embeddings, self-attention (q/k/v, attention
over the cache, output), encoder attention (query, attention, output), the
feed-forward block, the vocabulary projection, greedy's choice and the
emission.  Beside them: the drafter's time (the engine's counters), the rest
of the loop in the engine, and the Python side (BPE, joining, taking, detok).
Per stage: ms per sentence, its share, the multiply-adds per sentence it
needs (from the model's shapes, the positions the passes verified and the
sentences' lengths) and the rate it ran at (GMAC/s, a multiply-add as one).
The rows are split among lanes as ``translate_batch`` splits them (one per
engine thread, one thread each): the stages' and the loop's times, summed
over the lanes' threads, count divided by the lanes, so that the parts add
up to the wall time and a rate is the whole machine's.  Every output is
checked against the sentence's own ``translate(s)``.  ``--json`` writes a result ``scripts/results.py add`` stores.
"""
import argparse
import time
from types import SimpleNamespace

LINEAR = ("self q/k/v", "self out", "cross q", "cross out", "ffn", "projection")


def shapes(model):
    """The model's widths and depths (fairseq's transformer)."""
    enc, dec = model.encoder, model.decoder
    return dict(C=dec.embed_dim, E=enc.layers[0].embed_dim if len(enc.layers) else dec.embed_dim,
                F=dec.layers[0].fc1.out_features, EF=enc.layers[0].fc1.out_features if len(enc.layers) else 0,
                enc_layers=len(enc.layers), dec_layers=len(dec.layers),
                vocab=dec.output_projection.out_features)


def macs(s, n_src, n_pos, self_ctx, cross_ctx, enc_ctx):
    """Multiply-adds per stage for n_src source tokens, n_pos verified positions,
    and the attention contexts summed over positions (self: cache positions;
    cross: source positions per decoder position; enc: source positions per source token)."""
    C, E, F, EF, Le, Ld, V = s["C"], s["E"], s["F"], s["EF"], s["enc_layers"], s["dec_layers"], s["vocab"]
    return {
        "encoder": n_src * (Le * (4 * E * E + 2 * E * EF) + Ld * 2 * C * E) + Le * 2 * E * enc_ctx,
        "self q/k/v": n_pos * Ld * 3 * C * C,
        "self attention": Ld * 2 * C * self_ctx,
        "self out": n_pos * Ld * C * C,
        "cross q": n_pos * Ld * C * C,
        "cross attention": Ld * 2 * C * cross_ctx,
        "cross out": n_pos * Ld * C * C,
        "ffn": n_pos * Ld * 2 * C * F,
        "projection": n_pos * C * V,
    }


def profile(t, lines, alone, rows, stages):
    """One streamed run through ``rows`` rows: the wall time, seconds per part (over
    the lanes' threads, divided by the lanes) and the engine's counters (every lane's)."""
    from fairseq_aggressive.streaming import stream

    dec = t.running_decoder()
    made, spent = [], {"run": 0.0, "join": 0.0}
    real_make = dec.make_batch

    def make_batch(*a, **k):
        b = real_make(*a, **k)
        for name in ("run", "join"):
            real = getattr(b, name)

            def timed(*x, _real=real, _name=name, **y):
                t0 = time.perf_counter()
                try:
                    return _real(*x, **y)
                finally:
                    spent[_name] += time.perf_counter() - t0
            setattr(b, name, timed)
        made.append(b)
        return b

    dec.make_batch = make_batch
    try:
        stages.read(reset=True)
        t0 = time.perf_counter()
        with t._lock:
            outs = list(stream(t, lines, rows, decoder=dec, locked=True))
        wall = time.perf_counter() - t0
        st = stages.read(reset=True)
    finally:
        dec.make_batch = real_make
    if outs != alone:
        bad = sum(a != b for a, b in zip(outs, alone))
        raise SystemExit(f"rows {rows}: {bad} outputs differ from translate(s)")
    lanes = len(made)
    counts = [b.stats() for b in made]
    rs = SimpleNamespace(**{k: sum(getattr(c, k) for c in counts)
                            for k in ("passes", "sentence_passes", "drafted", "draft_ns")})
    rs.draft_ns /= lanes
    return (wall, {k: v / lanes for k, v in spent.items()}, {k: v / lanes for k, v in st.items()}, rs)


def main(argv=None):
    from fairseq_aggressive.bench.provenance import output_file
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("input")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--rows", default="1,8,32,128")
    p.add_argument("--decoding", choices=("iad", "greedy"), default="iad")
    p.add_argument("--int8", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="engine threads (default: every usable CPU)")
    p.add_argument("--rounds", type=int, default=2, help="runs per row count (the fastest is kept)")
    p.add_argument("--load", type=int, default=0)
    p.add_argument("--json", type=output_file, default=None)
    args = p.parse_args(argv)

    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    from fairseq_aggressive.bench.load import cpu_load
    from fairseq_aggressive.diagnostics import stages
    from fairseq_aggressive.diagnostics.loading import translator_and_lines
    from fairseq_aggressive.native.machine import describe_machine

    stages.use_test_library()
    t, lines, alone = translator_and_lines(args.model_dir, args.input, args.sentences, args.decoding, args.int8,
                                           args.threads)
    dec = t.running_decoder()
    prepared = [dec.prepare(s) for s in lines]
    outs_len = [len(t.hub.encode(o)) for o in alone]  # tokens each output has (EOS included)
    n_src = sum(len(x.source) for x in prepared)
    enc_ctx = sum(len(x.source) ** 2 for x in prepared)
    cross_ctx = sum(len(x.source) * n for x, n in zip(prepared, outs_len))
    self_ctx = sum(n * (n + 1) // 2 for n in outs_len)
    s = shapes(t.hub.models[0])
    rows = [int(r) for r in args.rows.split(",")]
    table = {}
    with cpu_load(args.load):
        for b in rows:
            best = min((profile(t, lines, alone, b, stages) for _ in range(args.rounds)), key=lambda r: r[0])
            wall, spent, st, rs = best
            n = len(lines)
            positions = rs.sentence_passes + rs.drafted
            need = macs(s, n_src, positions, self_ctx, cross_ctx, enc_ctx)
            inner = sum(v for k, v in st.items() if k not in ("encoder", "pass"))
            parts = {k: v for k, v in st.items() if k != "pass"}
            parts["pass (rest)"] = max(st["pass"] - inner, 0.0)
            parts["drafting"] = rs.draft_ns * 1e-9
            parts["loop (rest)"] = max(spent["run"] - st["pass"] - parts["drafting"], 0.0)
            parts["python"] = max(wall - spent["run"] - spent["join"], 0.0)
            parts["join (rest)"] = max(spent["join"] - st["encoder"], 0.0)
            table[b] = {
                "ms_per_sentence": 1e3 * wall / n,
                "passes_per_sentence": rs.sentence_passes / n, "batched_passes": rs.passes,
                "positions_per_sentence": positions / n,
                "stages": {k: {"ms": 1e3 * v / n, "share": v / wall,
                               "macs": need.get(k, 0) / n,
                               "gmacs": need[k] / v / 1e9 if k in need and v > 0 else None}
                           for k, v in parts.items()},
                "linear_gmacs": sum(need[k] for k in LINEAR) / max(sum(parts[k] for k in LINEAR), 1e-12) / 1e9,
                "total_gmacs": sum(need.values()) / wall / 1e9,
            }
    machine = describe_machine()
    print(f"{args.model_dir}: {len(lines)} sentences, {args.decoding}{' int8' if args.int8 else ''}, "
          f"load {args.load}, {machine}")
    print(f"model: C {s['C']}, FFN {s['F']}, {s['enc_layers']}+{s['dec_layers']} layers, vocabulary {s['vocab']}")
    head = "stage".ljust(18) + "".join(f"{'B=' + str(b):>22}" for b in rows)
    print(head + "\n" + " " * 18 + "".join(f"{'ms/sent  share  GMAC/s':>22}" for _ in rows))
    for k in table[rows[0]]["stages"]:
        cells = []
        for b in rows:
            c = table[b]["stages"][k]
            g = f"{c['gmacs']:.1f}" if c["gmacs"] is not None else "-"
            cells.append(f"{c['ms']:8.3f} {100 * c['share']:5.1f}% {g:>7}")
        print(k.ljust(18) + "".join(f"{x:>22}" for x in cells))
    print("total".ljust(18) + "".join(f"{table[b]['ms_per_sentence']:8.3f} 100.0% {table[b]['total_gmacs']:7.1f}"
                                     .rjust(22) for b in rows))
    print("linear layers GMAC/s: " + ", ".join(f"B={b} {table[b]['linear_gmacs']:.1f}" for b in rows))
    print("passes per sentence: " + ", ".join(f"B={b} {table[b]['passes_per_sentence']:.1f}" for b in rows))
    if args.json:
        from fairseq_aggressive.bench.provenance import write_result

        write_result(args.json, {"stages": {str(b): v for b, v in table.items()}, "shapes": s,
                                 "decoding": args.decoding + (" int8" if args.int8 else ""), "load": args.load,
                                 "sentences": len(lines)}, __file__)


if __name__ == "__main__":
    main()
