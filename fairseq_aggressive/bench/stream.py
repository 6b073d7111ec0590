"""The benchmark's streaming modes (``iad-stream``, ``greedy-native-stream`` ...): every
sentence of the run through ``--batch-size`` rows of the engine's running batch, a row that
ends refilled at the next pass boundary, the rows split among lanes of one thread each
(``NativeEngine.default_lanes``; :func:`~fairseq_aggressive.streaming.stream.stream_lanes`),
timed whole per round, the modes taking turns round by round; each sentence is recorded as the
batch modes record theirs (its tokens, its share of the time, its passes)."""
import time
from typing import List


def decode_streams(modes: List[str], gens, draft_costs, batches, bench, per_sent, totals, rows: int, src_pad: int,
                   tgt_dict, bpe) -> None:
    """Every sentence of ``batches`` with each streaming mode of ``modes`` (in input order,
    ``rows`` rows; ``draft_costs``: each mode's ``--draft-cost``), ``bench.bench_rounds``
    times after ``bench.warmup`` sentences of warm-up."""
    from fairseq import utils

    from ..runtime.gc_pause import gc_paused
    from ..streaming.decoder import RunningDecoder
    from ..streaming.stream import stream_lanes

    sources = {}
    for sample in batches:
        for sid, row in zip(sample["id"].tolist(), sample["net_input"]["src_tokens"]):
            sources[sid] = utils.strip_pad(row, src_pad)
    ids = sorted(sources)
    rounds = max(1, getattr(bench, "bench_rounds", 1))
    setups = {}
    for m in modes:
        mdl, gen = gens[m]
        dec = RunningDecoder.of_generator(gen, draft_costs.get(m))
        if dec is None:
            raise SystemExit(f"error: benchmark mode {m}: its decoding does not run in the engine's running batch "
                             "(a shortlist, a torch verifier or a drafter the engine has no counterpart of)")
        prepared = [dec.prepared(sources[i]) for i in ids]
        lanes = dec.lanes(rows)
        list(stream_lanes(dec.make_batches(lanes), prepared[: bench.warmup], rows, lane_rows=dec.lane_rows()))
        gen.stats.__init__()
        setups[m] = (gen, dec, prepared, lanes)
    # the modes take turns round by round, every other round in the reverse order, so that a drift of
    # the host's speed over the run falls on all of them alike (their ratios are side by side)
    for r in range(rounds):
        for m in modes if r % 2 == 0 else modes[::-1]:
            gen, dec, prepared, lanes = setups[m]
            batches = dec.make_batches(lanes)
            t0 = time.perf_counter()
            with gc_paused():  # (as Translator.translate_batch decodes)
                outs = list(stream_lanes(batches, prepared, rows, lane_rows=dec.lane_rows()))
            dt = (time.perf_counter() - t0) / rounds
            totals[m] += dt
            if r == rounds - 1:  # the counters of the last round, as the batch modes keep theirs
                gen.stats.sentences += len(ids)
                for batch in batches:
                    gen.stats.add_loop(batch.stats().loop)
                gen.stats.tokens += sum(len(t) for t, _ in outs)
            for sid, (toks, passes) in zip(ids, outs):
                if r == 0:
                    per_sent[sid][m] = {"ms": 1000 * dt / len(ids), "tokens": toks, "passes": passes,
                                        "text": tgt_dict.string(toks, bpe)}
                elif toks != per_sent[sid][m]["tokens"]:
                    raise SystemExit(f"error: {m} decoded sentence {sid} differently in a later round")
                else:
                    per_sent[sid][m]["ms"] += 1000 * dt / len(ids)
