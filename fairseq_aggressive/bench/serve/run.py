"""What the benchmark runs: the reference (the engine's greedy one sentence at
a time), CTranslate2's configuration, and one system's run: its server
started, the phases over HTTP, the CPU time the server, the client and the
rest of the machine used meanwhile."""
import asyncio
import os
import time
from typing import Dict, Optional

from .ct2_server import length_cap
from .phases import WARMUP, Checker, run_phases
from .servers import HOST, ServerProcess, server_command

PROBE_SENTENCES = 40  # CTranslate2's configurations are timed on these, at batch 1


def _quiet_logs():
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq_aggressive", "fairseq.tasks", "fairseq.models"):
        logging.getLogger(name).setLevel(logging.WARNING)


def greedy_reference(args, sentences):
    """The engine's greedy one sentence at a time, the length limits and the
    BPE tokens of the CTranslate2 probe."""
    from fairseq_aggressive.translator import Translator

    _quiet_logs()
    t = Translator.from_pretrained(args.model_dir, decoding="iad", max_draft_len=0)
    _quiet_logs()
    ref = [t.translate_static([s])[0] for s in sentences]
    gen = t.generator
    limits = {"max_len_a": float(gen.max_len_a), "max_len_b": int(gen.max_len_b), "max_positions": int(gen.max_len)}
    d = t.hub.src_dict
    probe = []
    for s in sentences[:PROBE_SENTENCES]:
        ids = t.hub.encode(s).tolist()
        probe.append({"tokens": [[d[i] for i in ids[:-1]]],
                      "max_len": length_cap(limits["max_len_a"], limits["max_len_b"], len(ids),
                                            limits["max_positions"])})
    return ref, limits, probe


def setup_ct2(args, probe, log) -> Dict:
    from fairseq_aggressive.bench import ct2
    from fairseq_aggressive.runtime.threads import usable_cpus

    ct2_dir = ct2.converted_model(os.path.join(args.model_dir, "model.pt"), args.model_dir)
    if args.ct2_config:
        ctype, _, th = args.ct2_config.partition(":")
        return {"dir": ct2_dir, "compute_type": ctype, "threads": int(th or 1), "tuned": False}
    cfg = ct2.tune(ct2_dir, probe, ct2.thread_counts(usable_cpus()), min(WARMUP, len(probe)))
    log(f"ct2: {cfg['compute_type']} x {cfg['threads']} thread(s), the fastest at batch 1 on {len(probe)} "
        "sentences of " + ", ".join(f"{c['compute_type']}/{c['threads']}t {1000 * c['seconds']:.0f} ms"
                                     for c in cfg["configs"]))
    return {"dir": ct2_dir, "compute_type": cfg["compute_type"], "threads": cfg["threads"], "tuned": True,
            "configs": cfg["configs"]}


def _machine_busy() -> Optional[float]:
    """CPU-seconds every CPU of the machine has been busy (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """CPU-seconds process ``pid`` has used (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def run_system(system, args, sentences, reference, ct2_setup, limits, log, load_pids=()) -> Dict:
    from fairseq_aggressive.serving.server import free_port

    checker = Checker(sentences, reference)
    cmd = server_command(system, args, free_port(HOST), ct2_setup and ct2_setup["dir"], ct2_setup, limits)
    env = None
    if system == "ct2":
        env = dict(os.environ, OMP_NUM_THREADS=str(ct2_setup["threads"] * args.workers))
    server = ServerProcess(system, cmd, env)
    res: Dict = {"command": " ".join(cmd)}
    try:
        res["ready_s"] = round(server.wait_ready(), 2)
        log(f"{system}: serving on port {server.port} after {res['ready_s']:.1f} s")
        pids = [server.proc.pid] + list(load_pids)
        before = (_machine_busy(), _own_cpu(), [_process_cpu(p) for p in pids], time.perf_counter())
        res.update(asyncio.run(run_phases(server.port, sentences, reference, args, checker)))
        after = (_machine_busy(), _own_cpu(), [_process_cpu(p) for p in pids], time.perf_counter())
        res["client_cpu_s"] = round(after[1] - before[1], 2)
        res["server_cpu_s"] = round(after[2][0] - before[2][0], 2)
        res["phases_s"] = round(after[3] - before[3], 2)
        if before[0] is not None:
            # CPU time on the machine that neither this process, its server nor its load used
            ours = res["client_cpu_s"] + sum(a - b for a, b in zip(after[2], before[2]))
            res["other_cpu_s"] = round(max(0.0, after[0] - before[0] - ours), 2)
    except Exception as e:  # noqa: BLE001  (reported; the other systems still run)
        res["error"] = str(e)
    finally:
        res["exit_code"] = server.stop()
        res["server_complaints"] = server.complaints()[-20:]
        res["server_log_tail"] = server.lines[-10:]
    res["check"] = checker.summary()
    if ct2_setup and system == "ct2":
        res["ct2_config"] = {k: v for k, v in ct2_setup.items() if k != "dir"}
    return res
