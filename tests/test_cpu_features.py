"""Portability: bfloat16 only where the CPU does it natively, the same result
everywhere else, and the machine named in benchmark output.

These run on every machine: FAIRSEQ_AGGRESSIVE_NO_NATIVE_BF16 simulates a CPU
without native bf16, and monkeypatching the hardware probe simulates one with it."""
import logging

import pytest
import torch

from fairseq_aggressive.runtime import cpu_features
from fairseq_aggressive.runtime.cpu_features import NO_NATIVE_BF16_ENV, use_bf16
from helpers import make_model, make_sample, make_task


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(cpu_features, "_warned", set())


@pytest.mark.parametrize("hardware", [True, False])
def test_bf16_policy(hardware, monkeypatch, fresh_warnings, caplog):
    monkeypatch.setattr(cpu_features, "_hardware_bf16", lambda: hardware)
    monkeypatch.delenv(NO_NATIVE_BF16_ENV, raising=False)
    assert cpu_features.native_bf16() is hardware
    assert use_bf16("off", "--cpu-bf16") is False
    assert use_bf16(None, "--cpu-bf16") is False and use_bf16(False, "--cpu-bf16") is False
    assert use_bf16("on", "--cpu-bf16") is True
    with caplog.at_level(logging.WARNING, logger="fairseq_aggressive"):
        assert use_bf16("auto", "--cpu-bf16") is hardware
        assert use_bf16(True, "--cpu-bf16") is hardware  # a bare flag means auto
    fallbacks = [r for r in caplog.records if "running float32" in r.getMessage()]
    assert len(fallbacks) == (0 if hardware else 1)  # one clear warning, not one per step


def test_env_var_hides_native_bf16(monkeypatch, fresh_warnings, caplog):
    monkeypatch.setattr(cpu_features, "_hardware_bf16", lambda: True)
    monkeypatch.setenv(NO_NATIVE_BF16_ENV, "1")
    assert cpu_features.native_bf16() is False
    with caplog.at_level(logging.WARNING, logger="fairseq_aggressive"):
        assert use_bf16("auto", "--drafter-bf16") is False
    assert NO_NATIVE_BF16_ENV in caplog.text
    monkeypatch.setenv(NO_NATIVE_BF16_ENV, "0")
    assert cpu_features.native_bf16() is True


def test_bad_precision_value():
    with pytest.raises(ValueError, match="auto, on, off"):
        use_bf16("yes", "--cpu-bf16")


def _train_step(cpu_bf16):
    """One training step of a tiny Transformer under the task's autocast: loss and
    the gradient of the output projection."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    task = make_task(cpu_bf16=cpu_bf16)
    model = make_model(task, seed=3).train()
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    d = task.target_dictionary
    rows = [[5, 6, 7, 8, d.eos()], [9, 10, 11, d.eos()]]
    sample = make_sample(rows, d.pad())
    sample["net_input"]["prev_output_tokens"] = make_sample([[d.eos()] + r[:-1] for r in rows], d.pad(),
                                                           left_pad=False)["net_input"]["src_tokens"]
    sample["target"] = make_sample(rows, d.pad(), left_pad=False)["net_input"]["src_tokens"]
    sample["ntokens"] = sum(len(r) for r in rows)

    class NoOpt:  # task.train_step calls optimizer.backward(loss)
        def backward(self, loss):
            loss.backward()

    seen = {}
    orig = crit.forward

    def forward(m, s, reduce=True):
        seen["autocast"] = torch.is_autocast_cpu_enabled()
        return orig(m, s, reduce)

    crit.forward = forward
    loss, _, _ = task.train_step(sample, model, crit, NoOpt(), update_num=0)
    grad = model.decoder.embed_tokens.weight.grad.clone()
    return loss.detach().float(), grad, seen["autocast"]


def test_cpu_bf16_fallback_gives_float32_result(monkeypatch, fresh_warnings):
    """--cpu-bf16 (auto) on a CPU without native bf16 is exactly the float32 step."""
    monkeypatch.setenv(NO_NATIVE_BF16_ENV, "1")
    loss32, grad32, ac32 = _train_step("off")
    loss_auto, grad_auto, ac_auto = _train_step("auto")
    assert not ac32 and not ac_auto
    assert torch.equal(loss32, loss_auto) and torch.equal(grad32, grad_auto)


def test_cpu_bf16_on_runs_bfloat16(monkeypatch, fresh_warnings):
    """'on' forces autocast (and so changes the arithmetic) even without native bf16."""
    monkeypatch.setenv(NO_NATIVE_BF16_ENV, "1")
    loss32, _, _ = _train_step("off")
    loss_on, _, ac_on = _train_step("on")
    assert ac_on
    assert not torch.equal(loss32, loss_on)
    assert torch.allclose(loss32, loss_on, rtol=0.05)


def test_drafter_bf16_auto_falls_back(monkeypatch, fresh_warnings, tmp_path):
    """GAD's --drafter-bf16 (auto) loads the drafter in float32 where bf16 is not native."""
    from fairseq_aggressive.drafters.nar_block_checkpoint import build_gad_drafter
    from fairseq_aggressive.tasks import aggressive_translation as at

    monkeypatch.setenv(NO_NATIVE_BF16_ENV, "1")
    calls = []

    class Loaded(Exception):
        pass

    def load_drafter(self, path, like=None, dtype=None, precision="float32"):
        calls.append(dtype)
        raise Loaded

    monkeypatch.setattr(at.AggressiveTranslationTask, "load_drafter", load_drafter)
    task = make_task(drafter_path="d.pt")
    for mode, want in (("auto", None), ("on", torch.bfloat16), ("off", None)):
        task.cfg.drafter_bf16 = mode
        with pytest.raises(Loaded):
            build_gad_drafter(task, [make_model(task)], task.decoding_options())
        assert calls[-1] == want, mode


def test_machine_info_names_the_cpu():
    from fairseq_aggressive.native.machine import describe_machine, machine_info

    info = machine_info()
    assert info["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert isinstance(info["native_bf16"], bool) and info["cpu_model"]
    line = describe_machine(info)
    assert info["cpu_capability"] in line and "native bf16" in line and info["torch"] in line
    if info["cpu_family"]:  # x86 Linux: "family/model F/M" (AMD's Zen generations, Intel's cores)
        assert f"family/model {info['cpu_family']}" in line and info["cpu_family"].count("/") == 1


def test_aarch64_targets_by_the_cpus_features(monkeypatch):
    """On aarch64 the dot-product extension ("asimddp" in /proc/cpuinfo; on macOS sysctl's
    FEAT_DotProd) selects neon-dotprod, every other aarch64 CPU neon; generic comes last."""
    import builtins
    import subprocess

    from fairseq_aggressive.native import build, targets

    monkeypatch.setattr(targets, "arch", lambda machine="": "aarch64")
    monkeypatch.setattr(build, "_cpu_flags", lambda: {"fp", "asimd", "asimddp"})
    assert [t.name for t in build.cpu_targets()] == ["neon-dotprod", "neon", "generic"]
    monkeypatch.setattr(build, "_cpu_flags", lambda: {"fp", "asimd"})
    assert [t.name for t in build.cpu_targets()] == ["neon", "generic"]
    monkeypatch.undo()

    # macOS: no /proc/cpuinfo; the flag comes from sysctl
    real_open = builtins.open

    def no_cpuinfo(path, *a, **kw):
        if path == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_cpuinfo)
    monkeypatch.setattr(build.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(targets, "arch", lambda machine="": "aarch64")
    for answer, flags in (("1\n", {"asimddp"}), ("0\n", set())):
        monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, answer, ""))
        assert build._cpu_flags() == flags


def test_last_level_cache_from_sysfs(tmp_path):
    """The outermost data or unified cache that sysfs lists for the first CPU (its size with
    Linux's K/M suffixes); an instruction cache never counts; 0 where nothing is listed."""
    def index(name, level, kind, size):
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")

    index("index0", 1, "Data", "48K")
    index("index1", 1, "Instruction", "64K")
    index("index2", 2, "Unified", "2048K")
    f = cpu_features.last_level_cache_bytes.__wrapped__
    assert f(str(tmp_path)) == 2048 << 10
    index("index3", 3, "Unified", "32M")
    assert f(str(tmp_path)) == 32 << 20
    index("index4", 4, "Instruction", "1G")
    assert f(str(tmp_path)) == 32 << 20
    assert f(str(tmp_path / "none")) == 0
