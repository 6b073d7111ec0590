"""The native engine on a machine that is also doing other work: its thread
pool runs every item exactly once and never waits for a thread that is not
running, outputs are bit-identical for any thread count with or without load
beside them, and the thread policy follows what the process may use."""
import ctypes
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import make_model, make_sample, make_task, needs_native, random_rows

from fairseq_aggressive.bench.load import cpu_load
from fairseq_aggressive.native import available
from fairseq_aggressive.runtime.threads import THREADS_ENV, _cgroup_quota, engine_threads, parse_threads, usable_cpus



def selftest(threads, calls, max_items, slow=0, slow_us=0, seed=1, timeout_ms=0):
    """The test library's pool self-test: item counts drawn anew in [1, max_items] for every call."""
    from fairseq_aggressive.native import build

    stats = (ctypes.c_int64 * 6)()
    bad = build.test_library().fa_pool_selftest(threads, calls, max_items, seed, slow, slow_us, timeout_ms, stats)
    return bad, dict(zip(("calls", "parallel", "worker_items", "waits", "stalls", "wait_ns"), list(stats)))


# every process this test session starts inherits this mark: load processes of other
# programs on the machine (another benchmark beside the tests) are not this session's
SESSION_MARK = f"FAIRSEQ_AGGRESSIVE_TEST_SESSION={os.getpid()}"
os.environ["FAIRSEQ_AGGRESSIVE_TEST_SESSION"] = str(os.getpid())


def busy_children():
    """Load processes (cpu_load's) of this test session still running."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"parent = os.getppid()" not in f.read():
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if SESSION_MARK.encode() in f.read().split(b"\0"):
                        out.append(int(pid))
            except OSError:
                pass
    return out


# ------------------------------------------------------------------ the pool
@needs_native
@pytest.mark.parametrize("threads", [2, 4, 8])
def test_pool_runs_every_item_once_oversubscribed(threads):
    """More pool threads than cores, and workers' items now and then as slow as a descheduled
    thread: every item of every call runs exactly once."""
    for seed in range(5):  # on a busy machine the pool may keep every call on the caller: run until workers took part
        bad, st = selftest(threads, calls=3000, max_items=24, slow=37, slow_us=50, seed=seed)
        assert bad == 0, st
        assert 2500 < st["calls"] <= 3000, st  # calls of one item are not counted
        if st["worker_items"] > 0:
            break
    assert st["worker_items"] > 0, st


@needs_native
def test_pool_under_load_and_stalls():
    """With two CPU-bound processes beside it the pool still runs every item
    once, and a worker that holds an item for long (as a descheduled one
    does) is seen as a stall: the pool then runs calls on the caller alone."""
    with cpu_load(2):
        bad, st = selftest(4, calls=2000, max_items=16)
        assert bad == 0, st
    bad, st = selftest(2, calls=400, max_items=16, slow=5, slow_us=5000)
    assert bad == 0, st
    assert st["stalls"] > 0, st
    assert st["parallel"] < st["calls"], st  # calls after a stall ran on the caller alone
    assert not busy_children()


needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                    reason="no C++ compiler for the pool's stress driver")
STRESS = os.path.join(os.path.dirname(__file__), "..", "scripts", "diagnostics", "pool_stress.py")


def stress(variant, calls, threads=(2, 3, 8), load=(0, 2), timeout_ms=2000):
    """scripts/diagnostics/pool_stress.py: its exit status and its runs."""
    import json

    out = subprocess.run([sys.executable, STRESS, "--variant", variant, "--calls", str(calls), "--threads",
                          *map(str, threads), "--load", *map(str, load), "--timeout-ms", str(timeout_ms),
                          "--limit-s", "120", "--json"], capture_output=True, text=True)
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout.splitlines()[-1])["runs"]


@pytest.mark.slow
@needs_compiler
@pytest.mark.timeout(300)
def test_pool_stress_changing_item_counts():
    """The pool as the engine builds it, every call offered to the workers: item
    counts drawn anew for every call (1..24), items of varying work, 2, 3 and 8
    threads on the machine's cores, quiet and beside two CPU-bound processes;
    every item of every call ran exactly once, nothing hung."""
    rc, runs = stress("plain", 300_000)
    assert rc == 0 and len(runs) == 6, runs
    for r in runs:
        assert (r["status"], r["bad"], r["calls"]) == (0, 0, 300_000), r
        assert r["worker_items"] > 0, r


@pytest.mark.slow
@needs_compiler
@pytest.mark.timeout(300)
def test_pool_stress_with_widened_windows():
    """Every window between two atomic steps of the protocol widened with yields
    and sleeps (-DFA_POOL_FAULTS): still every item exactly once, no hang."""
    rc, runs = stress("faults", 4_000)
    assert rc == 0 and len(runs) == 6, runs
    for r in runs:
        assert (r["status"], r["bad"], r["calls"]) == (0, 0, 4_000), r


@pytest.mark.slow  # (the stress program built and run by a script that imports torch and fairseq)
@needs_compiler
@pytest.mark.timeout(300)
def test_pool_stress_catches_a_split_bound():
    """The same stress test on a protocol that reads a job's bound apart from its
    job word (-DFA_POOL_SPLIT_BOUND), with the windows widened: every run fails,
    by an item run twice or for the wrong call, by a completion the pool
    reports lost, or by a crash (a worker that claims an item of a finished call
    runs a function object the caller has already destroyed); never by a silent
    hang."""
    rc, runs = stress("split-bound", 20_000, timeout_ms=300)
    assert rc == 0 and len(runs) == 6, runs
    for r in runs:
        assert r["status"] in (1, 2) or r["status"] < 0, r
        assert r["calls"] < 20_000, r
        if r["status"] == 2:
            assert "a completion was lost" in r["report"], r


@needs_native
@pytest.mark.timeout(300)
def test_a_lost_completion_fails_the_call_with_the_pool_state(monkeypatch):
    """A decoding call whose pool lost a completion raises, with the pool's
    state, after the pool's timeout instead of waiting forever; the engine then
    decodes on the calling thread, with greedy's output (on the test library,
    which has the hook that loses a completion)."""
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.native import build, engine as native_engine

    monkeypatch.setattr(native_engine, "library", build.test_library)

    task = make_task()
    model = make_model(task, encoder_embed_dim=128, decoder_embed_dim=128, encoder_ffn_embed_dim=512,
                       decoder_ffn_embed_dim=512)
    d = task.target_dictionary
    rows = random_rows(d, 3, 20, 30, seed=5)
    sample = make_sample(rows, d.pad())
    ref, _ = _decode(model, task, rows, 1, drafter_copy=True)
    gen = build_generator([model], d, InputCopyDrafter(d, d), engine="native", native_threads=2, max_len_b=40)
    gen.verifier.lanes = 1  # the batch decoded whole, on the engine's pool (not dealt among one-thread lanes)
    engine = gen.native
    engine.set_pool_timeout(0.3)
    engine.lib.fa_pool_lose_next_count(engine.handle)
    with pytest.raises(RuntimeError, match=r"made no progress for 300 ms .*a completion was lost"):
        gen.generate([model], sample)
    out = [(h[0]["tokens"].tolist(), h[0]["positional_scores"].tolist()) for h in gen.generate([model], sample)]
    assert out == ref
    st = engine.pool_stats()
    assert st["parallel"] >= 1 and st["calls"] > st["parallel"], st  # after the failure: caller alone


# ------------------------------------------------- outputs: threads and load
def _decode(model, task, rows, threads, drafter_copy, lanes=None):
    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator

    d = task.target_dictionary
    drafter = InputCopyDrafter(d, d)
    # (drafts as made: multi-position passes whatever the draft-length policy would choose)
    gen = build_generator([model], d, drafter, engine="native", native_threads=threads, max_len_b=40,
                              max_draft_len=None if drafter_copy else 0, draft_cost="off")
    assert gen.native is not None and gen.native.threads == threads
    gen.verifier.lanes = lanes  # (1: each batch whole on the engine's pool; None: one lane per thread)
    out = []
    for i in range(0, len(rows), 3):
        for h in gen.generate([model], make_sample(rows[i: i + 3], d.pad())):
            out.append((h[0]["tokens"].tolist(), h[0]["positional_scores"].tolist()))
    return out, gen


@needs_native
def test_outputs_bit_identical_for_any_threads_and_load():
    """Greedy and IAD on the engine: the same tokens and the same float scores
    (bit for bit) with 1, 2 and 5 threads, each batch whole on the engine's pool
    (and at 2 threads also dealt among one-thread lanes), quiet and with two CPU-bound processes
    beside it; the engine's greedy is fairseq's greedy."""
    from helpers import greedy

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256)
    d = task.target_dictionary
    rows = random_rows(d, 12, 5, 30, seed=3) + [r[:-1] * 3 + [d.eos()] for r in random_rows(d, 6, 4, 9, seed=4)]
    before = torch.get_num_threads()
    ref, _ = _decode(model, task, rows, 1, drafter_copy=False)
    runs = []
    for load in (0, 2):
        with cpu_load(load):
            for threads in (1, 2, 5):
                for copy in (False, True):
                    for lanes in (1, None) if threads == 2 else (1,):
                        out, gen = _decode(model, task, rows, threads, copy, lanes)
                        runs.append((load, threads, copy, lanes, out, gen))
    for load, threads, copy, lanes, out, gen in runs:
        assert out == ref, (load, threads, copy, lanes)
    # the IAD runs drafted and had drafts accepted: the pool served multi-position passes
    assert all(gen.stats.accepted > 0 for _, _, copy, _, _, gen in runs if copy)
    # the engines of several threads ran calls on their workers. On a machine whose cores are all
    # busy (the suite runs a test process per core) a woken worker can come later than this small
    # model's whole call, and the pool then keeps every call on the caller: decode a wider model,
    # whose products are cut into items that outlast a wake-up, until workers took part, with the
    # same bits as its one-thread decode
    took_part = any(gen.native.pool_stats()["worker_items"] > 0 for _, t, _, lanes, _, gen in runs
                    if t > 1 and lanes == 1)
    if not took_part:
        wide = make_model(task, encoder_embed_dim=512, decoder_embed_dim=512, encoder_ffn_embed_dim=2048,
                          decoder_ffn_embed_dim=2048)
        wide_ref, _ = _decode(wide, task, rows[:6], 1, True)
        for _ in range(5):
            out, gen = _decode(wide, task, rows[:6], 5, True, lanes=1)
            assert out == wide_ref
            took_part = gen.native.pool_stats()["worker_items"] > 0
            if took_part:
                break
    assert took_part
    assert torch.get_num_threads() == before  # torch's count is restored after each batch
    for i in range(0, len(rows), 3):  # and the engine's greedy is fairseq's
        sample = make_sample(rows[i: i + 3], d.pad())
        for k, h in enumerate(greedy(model, d, sample, max_len_b=40)):
            assert h[0]["tokens"].tolist() == ref[i + k][0]
    assert not busy_children()


# -------------------------------------------------------------- the policy
def test_default_threads_follow_the_affinity():
    """A process allowed one CPU gets one engine thread by default, and the
    environment's count where it names one (one child process for both: each
    pays the package's import)."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from fairseq_aggressive.runtime.threads import THREADS_ENV, engine_threads, usable_cpus; "
            "print(usable_cpus(), engine_threads()); os.environ[THREADS_ENV] = '3'; "
            "print(usable_cpus(), engine_threads())")
    env = {k: v for k, v in os.environ.items() if k != THREADS_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["1", "1", "1", "3"]


def test_usable_cpus_within_affinity(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    assert engine_threads() == usable_cpus()
    assert engine_threads(4) == 4


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_quota(tmp_path, version):
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    if version == "v2":
        proc.write_text("0::/svc\n")
        (root / "svc").mkdir(parents=True)
        (root / "svc" / "cpu.max").write_text("150000 100000\n")
        assert _cgroup_quota(str(proc), str(root)) == 1.5
        (root / "svc" / "cpu.max").write_text("max 100000\n")
        assert _cgroup_quota(str(proc), str(root)) is None
    else:
        proc.write_text("4:memory:/x\n3:cpu,cpuacct:/svc\n")
        d = root / "cpu,cpuacct" / "svc"
        d.mkdir(parents=True)
        (d / "cpu.cfs_quota_us").write_text("300000\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
        assert _cgroup_quota(str(proc), str(root)) == 3.0
        (d / "cpu.cfs_quota_us").write_text("-1\n")
        assert _cgroup_quota(str(proc), str(root)) is None
    assert _cgroup_quota(str(tmp_path / "missing"), str(root)) is None


def test_bad_thread_counts_are_clear_errors(monkeypatch):
    for bad in ("x", "-1", -2, "1.5"):
        with pytest.raises(ValueError, match="--native-threads must be 'auto' or a positive integer"):
            parse_threads(bad)
    assert parse_threads("auto") is None and parse_threads("3") == 3
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(ValueError, match=THREADS_ENV):
        engine_threads()
    from helpers import make_dict
    from fairseq_aggressive.tasks.aggressive_translation import AggressiveTranslationConfig, AggressiveTranslationTask

    d = make_dict()
    with pytest.raises(ValueError, match="--native-threads"):
        AggressiveTranslationTask(AggressiveTranslationConfig(native_threads="zero"), d, d)


# ------------------------------------------------------------ the benchmark
def test_bench_torch_threads_leave_the_loaded_cores(monkeypatch):
    """The torch modes' threads: --threads where given, else torch's own, at
    most the CPUs less the --bench-load processes, at least one."""
    import argparse

    import torch

    from fairseq_aggressive.bench import run as bench_run

    monkeypatch.setattr(bench_run, "usable_cpus", lambda: 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    for threads, load, want in ((None, 0, 3), (None, 1, 3), (None, 2, 2), (None, 4, 1), (None, 9, 1),
                                (2, 0, 2), (4, 3, 4)):
        bench = argparse.Namespace(threads=threads, bench_load=load)
        assert bench_run.torch_threads(bench) == want, (threads, load)


@pytest.mark.slow
@pytest.mark.e2e  # (whole bench runs beside CPU-bound processes and with worker processes)
def test_bench_under_load_and_with_workers(trained, tmp_path):
    """--bench-load N: every mode, CTranslate2 included, decodes beside N
    CPU-bound processes, which are gone afterwards; --bench-workers W: W
    decoder processes at once on a shared input, outputs still greedy's."""
    import json

    from helpers import run, tool

    data, ckpt = trained
    native = available() is None
    common = [tool("fairseq-aggressive-bench"), str(data), "--path", str(ckpt), "--gen-subset", "test",
              "--remove-bpe", "--bench-max-sentences", "20", "--warmup", "1"]
    js = tmp_path / "load.json"
    modes = "greedy,iad,ct2" + (",greedy-native" if native else "")
    proc = run(common + ["--bench-modes", modes, "--bench-load", "1", "--bench-json", str(js)])
    res = json.loads(js.read_text())
    assert res["load"] == 1 and "load: 1 CPU-bound process beside it" in proc.stdout
    assert 1 <= res["threads"]["torch"] <= max(1, usable_cpus() - 1)
    assert res["modes"]["iad"]["identical_to_greedy"] == 20
    assert res["modes"]["ct2"]["identical_to_greedy"] >= 19
    if native:
        assert res["threads"]["engine"] == [usable_cpus()] and "native engine" in proc.stdout
    assert not busy_children()

    js = tmp_path / "workers.json"
    proc = run(common + ["--bench-modes", "greedy,iad,ct2", "--bench-workers", "2", "--bench-json", str(js)])
    res = json.loads(js.read_text())
    assert res["workers"] == 2 and res["threads_per_worker"] == max(1, usable_cpus() // 2)
    for m in ("greedy", "iad", "ct2"):
        row = res["modes"][m]
        assert row["sentences_per_s"] > 0 and row["latency_ms_p95"] >= row["latency_ms_p50"] > 0, row
    assert res["modes"]["iad"]["identical_to_greedy"] == res["modes"]["greedy"]["identical_to_greedy"] == 20
    assert res["modes"]["ct2"]["identical_to_greedy"] >= 19
    assert [q["id"] for q in res["per_request"]["iad"]] == list(range(20))
    assert [q["tokens"] for q in res["per_request"]["iad"]] == [q["tokens"] for q in res["per_request"]["greedy"]]
    assert "| iad |" in proc.stdout and "2 workers" in proc.stdout
    assert all(row["peak_rss_mb"] > 0 for row in res["modes"].values())

    # W decoder threads of one process (on one copy of the engine's weights where it runs)
    js = tmp_path / "threads.json"
    modes = "greedy,iad" + (",greedy-native" if native else "")
    proc = run(common + ["--bench-modes", modes, "--bench-workers", "2", "--bench-worker-kind", "threads",
                         "--bench-json", str(js)])
    res = json.loads(js.read_text())
    assert res["worker_kind"] == "threads" and "decoder threads of one process" in proc.stdout
    assert [q["id"] for q in res["per_request"]["iad"]] == list(range(20))
    for m in modes.split(","):
        assert res["modes"][m]["identical_to_greedy"] == 20, m
    bad = subprocess.run(common + ["--bench-workers", "-1"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--bench-load and --bench-workers must be >= 0" in bad.stderr


# ------------------------------------------------------ one copy, W decoders
@needs_native
@pytest.mark.timeout(600)
def test_decoders_on_one_copy_of_the_weights_decode_at_once():
    """Generators whose engines share one copy of the weights (native_share)
    decode on separate threads at once, with more threads than cores and beside
    two busy processes: each output is fairseq's greedy, bit for bit the output
    of a generator with its own copy; the weights outlive the engine that made
    them."""
    import threading

    from fairseq_aggressive.drafters import InputCopyDrafter
    from fairseq_aggressive.generator import build_generator
    from helpers import greedy

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256)
    d = task.target_dictionary
    rows = random_rows(d, 24, 5, 30, seed=11) + [r[:-1] * 3 + [d.eos()] for r in random_rows(d, 12, 4, 9, seed=12)]
    samples = [make_sample(rows[i: i + 2], d.pad()) for i in range(0, len(rows), 2)]

    def gen(share=None, threads=1, copy=True):
        # (drafts verified as made: beside busy processes the draft-length policy may stop drafting)
        return build_generator([model], d, InputCopyDrafter(d, d), engine="native", native_threads=threads,
                               max_len_b=40, max_draft_len=None if copy else 0, native_share=share, draft_cost="off")

    def outputs(g, s):
        return [(h[0]["tokens"].tolist(), h[0]["positional_scores"].tolist()) for h in g.generate([model], s)]

    first = gen()
    ref = [outputs(first, s) for s in samples]
    for s, out in zip(samples, ref):  # the engine's output is fairseq's greedy
        assert [t for t, _ in out] == [h[0]["tokens"].tolist() for h in greedy(model, d, s, max_len_b=40)]
    shared = [gen(first.native, threads=1 + k % 2, copy=k % 3 != 2) for k in range(5)]
    assert all(g.native.handle != first.native.handle for g in shared)
    del first  # the weights stay while a decoder reads them
    got, errors = {}, []

    def decode(k):
        try:
            for rep in range(3):
                for i in range(k, len(samples), 2):
                    got[(k, rep, i)] = outputs(shared[k], samples[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with cpu_load(2):
        threads = [threading.Thread(target=decode, args=(k,)) for k in range(len(shared))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert len(got) == sum(3 * len(range(k, len(samples), 2)) for k in range(len(shared)))
    for (k, rep, i), out in got.items():
        assert out == ref[i], (k, rep, i)
    assert any(g.stats.accepted > 0 for g in shared)
    assert not busy_children()


@needs_native
def test_shared_weights_no_longer_change():
    """Once a second decoder reads a model's weights, setting a weight fails
    with an error that says why (nothing changes); an unbuilt model cannot be
    shared."""
    from fairseq_aggressive.native import NativeEngine, c_api, library

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256)
    eng = NativeEngine(model, task.target_dictionary, threads=1)
    other = eng.share(threads=1)
    with pytest.raises(RuntimeError, match="shared with another decoder"):
        eng._put("decoder.layers.fc1.bias", 0, torch.zeros(256))
    with pytest.raises(RuntimeError, match="shared with another decoder"):
        other._put("decoder.layers.fc1.bias", 0, torch.zeros(256))
    lib = library()
    cfg = c_api.Config(C=64, H=4, F=256, enc_layers=1, dec_layers=1, src_vocab=10, tgt_vocab=10, pad=1, unk=3, eos=2,
                       enc_embed_scale=1.0, dec_embed_scale=1.0, ln_eps=1e-5)
    raw = lib.fa_model_new(ctypes.byref(cfg))
    try:
        assert not lib.fa_model_share(raw)
        assert "not built" in lib.fa_model_error(raw).decode()
    finally:
        lib.fa_model_free(raw)


@needs_native
def test_generators_of_one_model_share_its_engine_weights_until_it_changes():
    """Generators built one after another for one model (a hub model's
    translate() builds one per call) read one copy of the engine's weights (the
    same settings give the same generator back, other settings another one on
    those weights); a model changed in place, or quantized, gets a fresh copy,
    and each decodes its model's greedy."""
    import argparse

    from helpers import greedy

    task = make_task()
    model = make_model(task, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
                       decoder_ffn_embed_dim=256)
    d = task.target_dictionary
    sample = make_sample(random_rows(d, 4, 5, 20, seed=13), d.pad())
    args = argparse.Namespace(beam=1, nbest=1, decoding="iad", max_len_b=30, engine="native")

    def build_and_decode(**other):  # other: a setting that changes the generator, not the output
        gen = task.build_generator([model], argparse.Namespace(**{**vars(args), **other}))
        out = [h[0]["tokens"].tolist() for h in gen.generate([model], sample)]
        return gen, out

    def fairseq_greedy():
        return [h[0]["tokens"].tolist() for h in greedy(model, d, sample, max_len_b=30)]

    g1, out1 = build_and_decode()
    assert task.build_generator([model], argparse.Namespace(**vars(args))) is g1
    g2, out2 = build_and_decode(max_draft_len=3)
    assert g1.native.weights_id == g2.native.weights_id and g1.native.handle != g2.native.handle
    assert out1 == out2 == fairseq_greedy()
    with torch.no_grad():  # an in-place change: a fresh copy, the changed model's greedy
        model.decoder.output_projection.weight.mul_(-1.0)
    g3, out3 = build_and_decode()
    assert g3.native.weights_id != g1.native.weights_id
    assert out3 == fairseq_greedy() != out1
    args.inference_precision = "int8"  # quantizes the model in place: a fresh (int8) copy, then shared again
    g4, out4 = build_and_decode()
    g5, out5 = build_and_decode(max_draft_len=3)
    assert g4.native.int8_linears > 0 and g4.native.weights_id != g3.native.weights_id
    assert g5.native.weights_id == g4.native.weights_id and out5 == out4
