"""The benchmark's parts without decoding a corpus: the mode names and what
they stand for, the reference mode of each, the result's JSON schema and
its tables (fairseq_aggressive/bench)."""
import argparse
import io
import json

import pytest

from fairseq_aggressive.bench.modes import mode_overrides, reference_mode, without_target
from fairseq_aggressive.bench.report import beam_width, print_edit_table, print_position_table, print_table, summarize
from fairseq_aggressive.evaluation.edit_spans import bound_of_spans, edit_span_ranges, span_lengths
from fairseq_aggressive.stats import DecodingStats


def args(**kw):
    return argparse.Namespace(**dict(dict(drafter_path="d.pt", gad_beta=1, gad_tau=0.0, bench_shortlist=None), **kw))


@pytest.mark.parametrize("name,expected", [
    ("beam5", dict(beam=5, decoding="beam")),
    ("greedy", dict(beam=1, decoding="beam")),
    ("iad", dict(beam=1, decoding="iad")),
    ("iad@3-b2-cost", dict(beam=1, decoding="iad", max_draft_len=3, iad_branches=2, draft_cost="auto")),
    ("greedy-native", dict(beam=1, decoding="iad", max_draft_len=0, engine="native")),
    ("iad-torch", dict(beam=1, decoding="iad", engine="torch")),
    ("iad-int8", dict(beam=1, decoding="iad", inference_precision="int8")),
    ("greedy-sl", dict(beam=1, decoding="iad", max_draft_len=0, vocab_shortlist=1000)),
    ("iad-pyloop", dict(beam=1, decoding="iad", python_loop=True)),
    ("greedy-native-int8-pyloop", dict(beam=1, decoding="iad", max_draft_len=0, engine="native",
                                       inference_precision="int8", python_loop=True)),
    ("iad:avx2", dict(beam=1, decoding="iad", native_isa="avx2")),
    ("blockwise-top3-min2", dict(beam=1, decoding="blockwise", blockwise_topk=3, min_block_size=2)),
    ("gad@8", dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=8, drafter_bf16="off")),
    ("gad++@8", dict(beam=1, decoding="gad", gad_beta=3, gad_tau=1.0, block_size=8, drafter_bf16="off")),
    ("gad@8-dsl", dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=8, drafter_bf16="off",
                       drafter_shortlist=1000)),
    ("feature-ar", dict(beam=1, decoding="feature-ar", drafter_path="d.pt", block_size=8)),
    ("feature-ar@5-torch", dict(beam=1, decoding="feature-ar", drafter_path="d.pt", block_size=5, engine="torch")),
    ("feature-ar@8-pyloop", dict(beam=1, decoding="feature-ar", drafter_path="d.pt", block_size=8, python_loop=True)),
    ("blockwise-pyloop", dict(beam=1, decoding="blockwise", blockwise_topk=1, min_block_size=1, python_loop=True)),
    ("gad@8-pyloop", dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=8, drafter_bf16="off",
                          python_loop=True)),
    ("gad@8-stream", dict(beam=1, decoding="gad", gad_beta=1, gad_tau=0.0, block_size=8, drafter_bf16="off",
                          bench_stream=True)),
    ("feature-ar@8-dsl", dict(beam=1, decoding="feature-ar", drafter_path="d.pt", block_size=8, drafter_shortlist=1000)),
    ("ct2-best", {}),
    ("ct2-best-beam5", {}),
    ("beam4", dict(beam=4, decoding="beam")),
    ("beam5-native", dict(beam=5, decoding="beam", engine="native")),
    ("beam2-native-int8", dict(beam=2, decoding="beam", engine="native", inference_precision="int8")),
    ("iad-beam5", dict(beam=5, decoding="iad", engine="native")),
    ("iad@6-beam4-int8", dict(beam=4, decoding="iad", engine="native", max_draft_len=6, inference_precision="int8")),
])
def test_mode_names(name, expected):
    assert mode_overrides(name, args()) == expected


@pytest.mark.parametrize("name,message", [
    ("iad-cheap", "unknown benchmark mode"),
    ("beam5-pyloop", "-pyloop applies to IAD, GAD, feature-ar, blockwise"),
    ("iad-torch-pyloop", "-pyloop applies to IAD, GAD, feature-ar, blockwise"),
    ("gad@8-torch-pyloop", "-pyloop applies to IAD, GAD, feature-ar, blockwise"),
    ("greedy:avx2", ":TARGET applies to modes on the native engine"),
    ("iad:sse9", "benchmark mode iad:sse9"),
    ("iad-dsl", "-dsl applies to gad and feature-ar modes"),
    ("ct2-sl", "-sl applies to aggressive modes"),
    ("beam0-native", "the beam must be >= 1"),
    ("beam5-native-pyloop", "-pyloop applies to IAD"),
    ("beam5-torch", "-torch applies to aggressive modes"),
    ("iad-beam1", "the beam must be >= 2"),
])
def test_bad_mode_names(name, message):
    with pytest.raises(SystemExit, match=message):
        mode_overrides(name, args())


def test_gad_modes_need_a_drafter():
    with pytest.raises(SystemExit, match="needs --drafter-path"):
        mode_overrides("gad@8", args(drafter_path=None))
    with pytest.raises(SystemExit, match="needs --bench-feature-drafter or --drafter-path"):
        mode_overrides("feature-ar@4", args(drafter_path=None))
    # its own drafter beside GAD's in one run
    assert mode_overrides("feature-ar@4", args(bench_feature_drafter="f.pt"))["drafter_path"] == "f.pt"


def test_reference_modes():
    modes = ["greedy", "greedy-int8", "greedy-sl", "iad", "iad-int8", "iad-sl", "iad:avx2"]
    assert [reference_mode(m, modes) for m in modes] == [
        "greedy", "greedy-int8", "greedy-sl", "greedy", "greedy-int8", "greedy-sl", "greedy"]
    assert reference_mode("iad-int8", ["greedy", "iad-int8"]) == "greedy"  # no int8 greedy in the run
    # the engine's beam search: fairseq's of the same width and precision, where the run has it
    beams = ["greedy", "beam5", "beam5-int8", "beam5-native", "beam5-native-int8", "beam4-native"]
    assert [reference_mode(m, beams) for m in beams[3:]] == ["beam5", "beam5-int8", "greedy"]
    # drafted beam search: the engine's beam search of its width, else fairseq's
    assert reference_mode("iad-beam5", beams) == "beam5-native"
    assert reference_mode("iad@8-beam5-int8", beams) == "beam5-native-int8"
    assert reference_mode("iad-beam5", ["greedy", "beam5"]) == "beam5"
    assert without_target("iad-int8:avx512") == "iad-int8"
    # the drafter's precision, its shortlist and the loop leave the verifier, and so the reference, as it is
    modes = ["greedy", "greedy-int8"]
    assert reference_mode("feature-ar@8-int8-dint8", modes) == "greedy-int8"
    assert reference_mode("gad@8-int8-dsl-dint8", modes) == "greedy-int8"
    assert reference_mode("feature-ar@8-dint8-pyloop", modes) == "greedy"
    fa = args(bench_feature_drafter="f.pt")
    assert mode_overrides("feature-ar@8-int8-dint8", fa)["drafter_precision"] == "int8"
    assert mode_overrides("feature-ar@8-int8-dint8", fa)["inference_precision"] == "int8"
    assert "drafter_precision" not in mode_overrides("feature-ar@8-int8", fa)
    assert mode_overrides("feature-ar@8-c0.4-dint8", fa)["draft_confidence"] == 0.4
    assert mode_overrides("feature-ar@6-c.25", fa)["draft_confidence"] == 0.25
    assert "draft_confidence" not in mode_overrides("feature-ar@6", fa)
    with pytest.raises(SystemExit, match="-dint8 applies to gad and feature-ar"):
        mode_overrides("iad-dint8", fa)


def test_edit_spans():
    src, out = [5, 6, 7, 8, 9], [5, 7, 7, 8, 10, 11]
    assert edit_span_ranges(src, out) == [(1, 2), (4, 6)]  # 6 -> 7, then 9 -> 10 11
    assert span_lengths(src, out) == [1, 2]
    assert bound_of_spans(span_lengths(src, out)) == 1 + 1 + 2
    assert span_lengths(src, src) == [] and bound_of_spans([]) == 1


class _Gen:
    def __init__(self, stats):
        self.stats, self.native, self.drafter = stats, None, None


def _fake_run(edit_ratio=0.1):
    """A run of 3 sentences with greedy (stock), an aggressive mode and CTranslate2."""
    modes = ["greedy", "iad", "ct2"]
    per_sent = {}
    for i in range(3):
        toks = [4 + i, 5, 2]
        per_sent[i] = {"id": i, "src_text": "a b c d e", "ref_text": "a b c d e", "edit_spans": i, "pass_bound": 1 + i,
                       "edit_ratio": edit_ratio,
                       **{m: {"ms": 1.0, "tokens": toks, "text": "a b c d e", **({"passes": 1 + i} if m == "iad" else {})}
                          for m in modes}}
    st = DecodingStats()
    st.sentences, st.passes, st.sentence_passes, st.tokens, st.drafted, st.accepted = 3, 6, 6, 9, 8, 3
    st.add_positions([6, 2], [2, 1])
    totals = {"greedy": 0.03, "iad": 0.01, "ct2": 0.02}
    return summarize(modes, per_sent, totals, {"greedy": 9, "ct2": 9}, {"iad": (None, _Gen(st))}, 1,
                     {"torch": 1}, load=0)


def test_result_schema_and_tables():
    res = json.loads(json.dumps(_fake_run()))  # the JSON the benchmark writes
    assert {"sentences", "batch_size", "threads", "load", "machine", "modes", "ct2_fastest", "per_sentence",
            "passes_by_edit_spans"} <= set(res)
    assert res["sentences"] == 3 and res["ct2_fastest"] == "ct2"
    iad = res["modes"]["iad"]
    assert iad["speedup_vs_greedy"] == pytest.approx(3.0) and iad["speedup_vs_ct2"] == pytest.approx(2.0)
    assert iad["mean_tokens_per_pass"] == pytest.approx(9 / 6) and iad["identical_to_greedy"] == 3
    assert iad["acceptance_by_position"] == pytest.approx([2 / 6, 1 / 2])
    assert res["modes"]["greedy"]["mean_passes_per_sentence"] == pytest.approx(3.0)
    assert res["modes"]["greedy"]["bleu"] == pytest.approx(100.0)
    out = io.StringIO()
    print_table(res, out)
    print_edit_table(res, out)
    print_position_table(res, out)
    text = out.getvalue()
    assert "| iad |" in text and "| ct2 |" in text
    assert "passes per sentence against E" in text
    assert "by position in the draft" in text and "| iad | 0.33 | 0.50 |" in text


def test_beam_modes_against_ctranslate2s_beam_of_their_width():
    """A beam mode's ratio to CTranslate2 is also taken against CTranslate2's fastest beam
    search of the same width; greedy modes keep the fastest greedy CTranslate2 as their base."""
    modes = ["beam5", "beam5-native", "ct2-int8", "ct2-beam5", "ct2-int8-beam5"]
    per_sent = {i: {"id": i, "src_text": "a", "edit_spans": 0, "pass_bound": 1, "edit_ratio": 0.1,
                    **{m: {"ms": 1.0, "tokens": [4, 2], "text": "a"} for m in modes}} for i in range(2)}
    totals = {"beam5": 0.4, "beam5-native": 0.02, "ct2-int8": 0.01, "ct2-beam5": 0.05, "ct2-int8-beam5": 0.03}
    res = summarize(modes, per_sent, totals, {m: 2 for m in modes}, {}, 1, {"torch": 1}, load=0)
    assert res["ct2_fastest"] == "ct2-int8"
    native = res["modes"]["beam5-native"]
    assert native["speedup_vs_ct2"] == pytest.approx(0.5)
    assert native["speedup_vs_ct2_beam"] == pytest.approx(1.5) and native["ct2_beam_reference"] == "ct2-int8-beam5"
    assert native["identical_to_greedy"] == 2  # against beam5, its reference
    assert "speedup_vs_ct2_beam" not in res["modes"]["ct2-int8"]
    assert beam_width("iad@8-beam5-int8") == 5 and beam_width("base_beam5") == 5 and beam_width("iad") == 1
    out = io.StringIO()
    print_table(res, out)
    assert "x CT2's fastest beam of its width" in out.getvalue()


def test_edit_span_table_only_where_outputs_copy_their_sources():
    """Translation (outputs far from their sources): no passes-against-edit-spans
    table; the JSON keeps the numbers and the mean edit ratio."""
    for ratio, shown in ((0.1, True), (0.5, True), (0.9, False)):
        res = json.loads(json.dumps(_fake_run(edit_ratio=ratio)))
        assert res["mean_edit_ratio"] == pytest.approx(ratio) and res["passes_by_edit_spans"]
        out = io.StringIO()
        print_edit_table(res, out)
        assert ("passes per sentence against E" in out.getvalue()) == shown, ratio


def test_positions_counted_one_by_one_up_to_a_cap():
    from fairseq_aggressive.stats import COUNTED_POSITIONS

    st = DecodingStats()
    st.add_positions([1] * (COUNTED_POSITIONS + 5), [1] * 3)
    assert len(st.position_drafted) == COUNTED_POSITIONS and st.position_drafted[-1] == 6
    assert st.position_accepted == [1, 1, 1] + [0] * (COUNTED_POSITIONS - 3)


def test_a_draft_counts_as_its_runs_of_ones():
    """DecodingStats.add_draft (the generator's per-draft count) is add_positions
    over runs of ones, below, at and past the cap."""
    from fairseq_aggressive.stats import COUNTED_POSITIONS

    a, b = DecodingStats(), DecodingStats()
    for n_draft, n_match in ((0, 0), (1, 0), (4, 2), (3, 3), (COUNTED_POSITIONS - 1, 5),
                             (COUNTED_POSITIONS, COUNTED_POSITIONS), (COUNTED_POSITIONS + 9, COUNTED_POSITIONS + 2)):
        a.add_draft(n_draft, n_match)
        b.add_positions([1] * n_draft, [1] * n_match)
        assert (a.position_drafted, a.position_accepted) == (b.position_drafted, b.position_accepted), n_draft


def _cfg(fp16=False):
    return argparse.Namespace(common=argparse.Namespace(fp16=fp16))


def test_bench_device_choices_and_refusals(monkeypatch):
    """--bench-device: the CPU by default; CUDA only where torch sees a device, and then only
    for the torch modes; --fp16 only on the GPU. Each refusal names what to change."""
    import torch

    from fairseq_aggressive.bench.run import bench_device

    modes = ["greedy", "iad", "greedy-native", "iad-int8", "iad:avx2", "feature-ar@8-dint8", "ct2-best"]
    ov = {m: mode_overrides(m, args()) for m in modes}
    assert bench_device(args(bench_device="cpu"), _cfg(), ov) == torch.device("cpu")
    assert bench_device(args(), _cfg(), ov) == torch.device("cpu")  # an older caller's namespace
    with pytest.raises(SystemExit, match="--fp16 decodes a float16 copy on the GPU: add --bench-device cuda"):
        bench_device(args(bench_device="cpu"), _cfg(fp16=True), ov)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="sees no CUDA device here"):
        bench_device(args(bench_device="cuda"), _cfg(), ov)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(SystemExit) as e:
        bench_device(args(bench_device="cuda"), _cfg(), ov)
    refused = str(e.value).split(": ")[2].split(" run on")[0].split(", ")
    assert refused == ["greedy-native", "iad-int8", "iad:avx2", "feature-ar@8-dint8", "ct2-best"]
    torch_only = {m: ov[m] for m in ("greedy", "iad")}
    assert bench_device(args(bench_device="cuda"), _cfg(fp16=True), torch_only) == torch.device("cuda", 0)


def test_bench_synchronizes_only_a_gpu(monkeypatch):
    import torch

    from fairseq_aggressive.bench import run as bench_run

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    bench_run.synchronize(torch.device("cpu"))
    assert calls == []
    bench_run.synchronize(torch.device("cuda", 0))
    assert calls == [torch.device("cuda", 0)]


def test_near_ties_counted_for_drafter_settings_on_an_int8_verifier():
    """A mode whose drafter settings follow an int8 verifier (feature-ar@8-int8-dint8) has its
    differences from greedy-int8 checked as near-ties with the int8 tolerance."""
    import torch

    from fairseq_aggressive.bench.run import count_near_ties, verifier_mode

    assert verifier_mode("feature-ar@8-int8-dint8:avx2") == "feature-ar@8-int8"

    class Scores(torch.nn.Module):  # tokens 5 and 6 within 0.1 of each other at every position
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, src, lengths, prev):
            lp = torch.full((1, prev.size(1), 8), -9.0)
            lp[..., 5], lp[..., 6] = -0.6, -0.7
            return lp

        def get_normalized_probs(self, net, log_probs):
            return net

    recs = {0: {"src_tokens": [4, 2], "greedy-int8": {"tokens": [5, 2]},
                "feature-ar@8-int8-dint8": {"tokens": [6, 2]}}}
    modes = ["greedy-int8", "feature-ar@8-int8-dint8"]
    ties = count_near_ties(modes, recs, {"greedy-int8": Scores()}, eos=2)
    assert ties == {"feature-ar@8-int8-dint8": 1}


class _Dict:
    def pad(self):
        return 1

    def string(self, toks, bpe=None):
        return " ".join(map(str, toks.tolist()))


class _Reversing:
    """A generator whose output is each source reversed; ``flip`` makes a later call differ."""

    def __init__(self, log, name, flip_after=None):
        self.log, self.name, self.flip_after, self.calls = log, name, flip_after, 0

    def generate(self, models, sample):
        import torch

        self.calls += 1
        self.log.append(self.name)
        out = []
        for row in sample["net_input"]["src_tokens"]:
            toks = row.flip(0)
            if self.flip_after is not None and self.calls > self.flip_after:
                toks = toks + 1
            out.append([{"tokens": torch.as_tensor(toks)}])
        return out


def _batches(n):
    import torch

    return [{"id": torch.tensor([2 * j, 2 * j + 1]), "net_input": {"src_tokens": torch.tensor([[4, 5, 2], [6, 7, 2]])}}
            for j in range(n)]


def test_rounds_rotate_the_modes_and_average_the_times():
    """--bench-rounds R: every batch decoded R times by every mode, in an order that turns from
    batch to batch and round to round; per-sentence times are the rounds' mean."""
    from fairseq_aggressive.bench.run import decode_blocks

    log = []
    gens = {m: (None, _Reversing(log, m)) for m in ("a", "b", "c")}
    per_sent = {i: {"id": i} for i in range(6)}
    totals = {m: 0.0 for m in gens}
    steps = {m: 0 for m in gens}
    bench = argparse.Namespace(warmup=0, bench_rounds=2)
    decode_blocks([list(gens)], gens, _batches(3), bench, per_sent, totals, steps, _Dict(), _Dict(), None)
    firsts = log[::3]
    assert firsts == ["a", "b", "c", "b", "c", "a"]  # batch j of round r starts with mode (j + r) % 3
    assert all(gens[m][1].calls == 6 for m in gens)
    assert steps == {m: 3 * 3 for m in gens}  # counted in the first round only
    assert per_sent[0]["a"]["tokens"] == [2, 5, 4]
    assert sum(per_sent[i]["c"]["ms"] for i in range(6)) == pytest.approx(1000 * totals["c"])


def test_a_round_that_decodes_differently_stops_the_run():
    from fairseq_aggressive.bench.run import decode_blocks

    log = []
    gens = {"a": (None, _Reversing(log, "a")), "b": (None, _Reversing(log, "b", flip_after=2))}
    per_sent = {i: {"id": i} for i in range(4)}
    bench = argparse.Namespace(warmup=0, bench_rounds=2)
    with pytest.raises(SystemExit, match="b decoded sentence 0 differently in a later round"):
        decode_blocks([list(gens)], gens, _batches(2), bench, per_sent, {"a": 0.0, "b": 0.0}, {"a": 0, "b": 0},
                      _Dict(), _Dict(), None)


def test_streaming_modes_take_turns_round_by_round(monkeypatch):
    """The -stream modes are timed as the batch modes are: each round streams every sentence
    with every mode, the modes taking turns (every other round in the reverse order), so
    that a drift of the host's speed falls on all of them; times are the rounds' mean."""
    import importlib
    from types import SimpleNamespace

    from fairseq_aggressive.bench.stream import decode_streams
    from fairseq_aggressive.streaming import decoder

    stream = importlib.import_module("fairseq_aggressive.streaming.stream")  # (the package's name is its function)

    log = []

    class Stats:
        def __init__(self):
            self.sentences = self.tokens = self.loops = 0

        def add_loop(self, loop):
            self.loops += 1

    class Dec:
        def __init__(self, name):
            self.name = name

        def prepared(self, src):
            return src.tolist()

        def lanes(self, rows):
            return 2

        def lane_rows(self):
            return None

        def make_batches(self, lanes):
            return [SimpleNamespace(name=self.name, stats=lambda: SimpleNamespace(loop=None)) for _ in range(lanes)]

    def lanes(batches, prepared, rows, lane_rows=None):
        if prepared:  # (the warm-up's is empty here)
            log.append(batches[0].name)
        return [(p[::-1], 1) for p in prepared]  # (token lists, as the running batch gives them)

    monkeypatch.setattr(decoder.RunningDecoder, "of_generator", classmethod(lambda cls, gen, cost: Dec(gen.name)))
    monkeypatch.setattr(stream, "stream_lanes", lanes)
    gens = {m: (None, SimpleNamespace(name=m, stats=Stats())) for m in ("a", "b", "c")}
    per_sent = {i: {"id": i} for i in range(4)}
    totals = {m: 0.0 for m in gens}
    bench = argparse.Namespace(warmup=0, bench_rounds=3)
    words = SimpleNamespace(string=lambda toks, bpe=None: " ".join(map(str, toks)))
    decode_streams(list(gens), gens, {}, _batches(2), bench, per_sent, totals, 8, 1, words, None)
    assert log == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert per_sent[1]["b"]["tokens"] == [2, 7, 6]
    assert all(gens[m][1].stats.loops == 2 and gens[m][1].stats.sentences == 4 for m in gens)  # the last round's
    assert sum(per_sent[i]["c"]["ms"] for i in range(4)) == pytest.approx(1000 * totals["c"])


def test_an_output_file_that_cannot_be_written_is_refused_before_decoding(tmp_path, monkeypatch, capsys):
    """--bench-json, --bench-plot and --bench-edit-plot (and the diagnostics' --json) are
    written when a run ends: a missing folder or a folder named as the file stops the
    command as it starts (exit 2, the flag and the reason), before any model or data is read."""
    import argparse

    from fairseq_aggressive.bench import cli
    from fairseq_aggressive.bench.provenance import output_file

    def no_run(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(cli, "run", no_run)
    base = [str(tmp_path / "no-data"), "--path", str(tmp_path / "no-model.pt"), "--user-dir", "fairseq_aggressive",
            "--task", "aggressive_translation", "-s", "src", "-t", "tgt"]
    for flag in ("--bench-json", "--bench-plot", "--bench-edit-plot"):
        for path, reason in ((tmp_path / "missing" / "out.json", "does not exist"), (tmp_path, "is a folder")):
            with pytest.raises(SystemExit) as e:
                cli.main(base + [flag, str(path)])
            assert e.value.code == 2
            err = capsys.readouterr().err
            assert flag in err and reason in err, err
    assert output_file(str(tmp_path / "x.json")) == str(tmp_path / "x.json")
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        output_file(str(tmp_path / "missing" / "x.json"))
