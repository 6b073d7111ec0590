#!/usr/bin/env python
"""Run a paper-reproduction pipeline described by a config in ``configs/``.

    python scripts/experiments/pipeline.py configs/translation/wmt14_ende.yaml [--scale paper|cpu|ci]
        [--direction de-en] [--work DIR] [--steps prepare,train,decode,bench] [--dry-run]
    python scripts/experiments/pipeline.py CONFIG [--scale S] --train-options MODEL

A config names the data preparation command (a script of ``scripts/data/``, or
an absolute path), the models to train (stock ``fairseq-train`` options, trained
in the order listed, on the raw or on the distilled data), the decodings to
evaluate (``fairseq-generate`` options) and the speed benchmarks
(``fairseq-aggressive-bench`` runs).  ``scales:`` in the config
overrides the paper settings for a smaller machine: ``cpu`` runs end to end on 2
CPU cores on the offline corpora (Debian en-de, UA-GEC), ``ci`` on the bundled
sample in a few minutes.  ``directions:`` holds the other direction of a language
pair (``--direction de-en``: its languages and the settings the papers give it),
prepared the same way (the dictionary is joined) in a work directory of its own.  Values may name other things with ``{work}``,
``{data}`` (the binarized data), ``{raw}`` (the prepared data directory),
``{root}`` (this repository), ``{distill}`` (the distilled data), ``{src}`` and ``{tgt}``
(the languages) and ``{MODEL}``
(that model's checkpoint, e.g. ``{teacher}``: ``checkpoint: best`` (default) or ``last``, or with
``average-last: N`` its last N interval checkpoints averaged); ``${VAR}`` reads the environment.

Steps (default: all): ``prepare`` (data), ``train`` (every model, with Seq-KD
``distill`` before the first model trained on distilled data: a model's ``data: distill``
trains on the distill section's teacher's outputs, ``data: distill:NAME`` on model NAME's), ``decode``
(every decoding on the whole test set, scored: BLEU for translation, M2 F0.5 and
GLEU for GEC, plus whether exact modes equal greedy) and ``bench``.  A step whose
output exists is skipped, so an interrupted run can be restarted.  Results go to
``WORK/results.json`` and ``WORK/results.md``.

Multi-GPU training is fairseq's own: set ``distributed-world-size`` (and for several
nodes ``distributed-num-procs``/``distributed-init-method`` ...) in a model's
options, or launch through ``torchrun``; ``update-freq`` keeps the papers' batch.
"""
import argparse
import copy
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USER_DIR = ROOT / "fairseq_aggressive"
STEPS = ("prepare", "train", "decode", "bench")


class ConfigError(SystemExit):
    def __init__(self, message):
        super().__init__(f"error: {message}")


def deep_merge(base, over):
    """``over`` on top of ``base``: dicts merge key by key, anything else replaces."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if key in out else copy.deepcopy(value)
    return out


def load_config(path, scale, direction=None):
    """The config at ``path`` for ``scale`` (its ``scales:`` entry on top of the
    paper settings) and ``direction`` (``SRC-TGT``; None: the config's own; another
    is its ``directions:`` entry on top of that)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config at {path}")
    with open(path, encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    scales = cfg.pop("scales", {}) or {}
    directions = cfg.pop("directions", {}) or {}
    if scale != "paper":
        if scale not in scales:
            raise ConfigError(f"{path} has no scale {scale!r} (it has: paper, {', '.join(scales)})")
        over = scales[scale]
        if isinstance(over, str):  # a file shared by several configs, relative to this one
            with open(path.parent / over, encoding="utf-8") as f:
                over = yaml.safe_load(f)
        cfg = deep_merge(cfg, over)
    for key in ("kind", "src", "tgt", "prepare", "models"):
        if key not in cfg:
            raise ConfigError(f"{path}: missing '{key}'")
    if cfg["kind"] not in ("translation", "gec"):
        raise ConfigError(f"{path}: kind must be translation or gec, not {cfg['kind']!r}")
    own = f"{cfg['src']}-{cfg['tgt']}"
    if direction not in (None, own):
        if direction not in directions:
            raise ConfigError(f"{path} has no direction {direction!r} (it has: {', '.join([own, *directions])})")
        cfg = deep_merge(cfg, directions[direction])
        if f"{cfg['src']}-{cfg['tgt']}" != direction:
            raise ConfigError(f"{path}: direction {direction} sets src {cfg['src']!r} and tgt {cfg['tgt']!r}")
    cfg["direction"], cfg["own_direction"] = direction or own, own
    cfg["models"] = {name: m for name, m in cfg["models"].items() if m is not None}  # null drops a model
    return cfg


def option_args(options):
    """``{'lr': 5e-4, 'share-all-embeddings': True, 'adam-betas': '(0.9, 0.98)'}`` -> argv."""
    argv = []
    for key, value in (options or {}).items():
        if value is None or value is False:
            continue
        flag = key if key.startswith("-") else f"--{key}"
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag] + [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv


class Pipeline:
    def __init__(self, cfg, work, dry_run=False, log=print, models=None):
        self.cfg, self.work, self.dry_run, self.log = cfg, Path(work), dry_run, log
        unknown = sorted(set(models or ()) - set(cfg["models"]))
        if unknown:
            raise ConfigError(f"--models: no model {', '.join(unknown)} (models: {', '.join(cfg['models'])})")
        self.models = None if models is None else set(models)  # None: every model
        self.raw = self.work / "data"
        self.data = self.raw / "bin"
        self.distill_dir = self.work / "distill"
        self.commands = []  # every command run (or printed with --dry-run)

    # ---------------------------------------------------------------- names
    def checkpoint(self, name):
        if name not in self.cfg["models"]:
            raise ConfigError(f"'{{{name}}}' names no model (models: {', '.join(self.cfg['models'])})")
        model = self.cfg["models"][name]
        if model.get("same-as"):
            return self.checkpoint(model["same-as"])
        if model.get("average-last"):  # its last N interval checkpoints averaged (average())
            return self.work / "models" / name / f"checkpoint_avg{model['average-last']}.pt"
        return self.work / "models" / name / f"checkpoint_{model.get('checkpoint', 'best')}.pt"

    def expand(self, value):
        if isinstance(value, dict):
            return {k: self.expand(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v) for v in value]
        if not isinstance(value, str):
            return value

        def env(m):
            if m.group(1) not in os.environ:
                raise ConfigError(f"the config reads ${{{m.group(1)}}}: set that environment variable")
            return os.environ[m.group(1)]

        value = re.sub(r"\$\{(\w+)\}", env, value)
        known = {"work": self.work, "data": self.data, "raw": self.raw, "root": ROOT,
                 "distill": self.distill_dir / "bin", "user_dir": USER_DIR, "src": self.cfg["src"],
                 "tgt": self.cfg["tgt"]}

        def name(m):
            key = m.group(1)
            return str(known[key]) if key in known else str(self.checkpoint(key))

        return re.sub(r"\{([\w.+-]+)\}", name, value)

    # ---------------------------------------------------------------- running
    def run(self, argv, stdout=None, cwd=None):
        argv = [str(a) for a in argv]
        self.commands.append(argv)
        line = " ".join(shlex.quote(a) for a in argv) + (f" > {stdout}" if stdout else "")
        self.log(f"$ {line}")
        if self.dry_run:
            return
        env = dict(os.environ)
        # large tensors are mmap-ed afresh on every step without this (half the CPU in page faults)
        env.setdefault("MALLOC_TRIM_THRESHOLD_", "8000000000")
        env.setdefault("MALLOC_TOP_PAD_", "1000000000")
        out = open(stdout, "w") if stdout else None
        started = time.time()
        try:
            result = subprocess.run(argv, stdout=out, env=env, cwd=cwd)
        finally:
            if out:
                out.close()
        self.log(f"  ({time.time() - started:.1f} s)")
        if result.returncode != 0:
            if stdout:
                Path(stdout).unlink(missing_ok=True)  # nothing half-written
            raise SystemExit(f"error: command failed with exit code {result.returncode}: {line}")

    def tool(self, name):
        """A console script of this environment (the venv's, even when not on PATH); the package
        is imported here, not at the top, so that reading a config does not load fairseq."""
        from fairseq_aggressive.data_prep.common import console_script
        return console_script(name)

    # ---------------------------------------------------------------- steps
    def prepare(self):
        if (self.data / "dict.{}.txt".format(self.cfg["src"])).exists():
            self.log(f"(prepared data found in {self.data})")
            return
        argv = self.expand(list(self.cfg["prepare"]))
        script = argv[0] if os.path.isabs(argv[0]) else ROOT / "scripts" / "data" / argv[0]
        self.run([sys.executable, script] + argv[1:] + ["--out", self.raw])

    def selected(self, name):
        """Whether ``--models`` selects model ``name`` (a ``same-as`` model through its target)."""
        if self.models is None:
            return True
        model = self.cfg["models"].get(name) or {}
        return name in self.models or (model.get("same-as") is not None and self.selected(model["same-as"]))

    def uses_selected(self, options):
        """Whether every model that ``options`` names (``{MODEL}``) is selected."""
        text = json.dumps(options, default=str)
        names = set(re.findall(r"\{([\w.+-]+)\}", text)) & set(self.cfg["models"])
        return all(self.selected(n) for n in names)

    @staticmethod
    def trained_updates(save):
        """Updates of the last checkpoint in ``save`` (0 without one)."""
        last = save / "checkpoint_last.pt"
        if not last.exists():
            return 0
        import torch

        state = torch.load(last, map_location="cpu", weights_only=False)
        return int(state["optimizer_history"][-1]["num_updates"])

    def train_model(self, name, model):
        save = self.work / "models" / name
        done = save / "TRAINED"  # written when fairseq-train finished its budget
        options = deep_merge(self.cfg.get("train-common") or {}, model.get("options") or {})
        if not self.dry_run:
            budget = options.get("max-update")
            finished = done.read_text().split()[:1] if done.exists() else []
            if budget and finished and finished[0].isdigit() and int(budget) > int(finished[0]):
                self.log(f"(model {name}: its budget was raised from {finished[0]} to {budget} updates; "
                         "models and distilled data made from its older checkpoint are kept: remove them to redo)")
                done.unlink()
            updates = self.trained_updates(save) if not done.exists() else 0
            if budget and updates >= int(budget):
                done.write_text(f"{budget} updates\n")
            if done.exists():
                self.average(name, model, save)
                self.log(f"(model {name}: found {self.checkpoint(name)})")
                return
            if updates:  # fairseq-train resumes from checkpoint_last.pt
                self.log(f"(model {name}: resuming after {updates} updates)")
        data = self.data_of(model)
        argv = [self.tool("fairseq-train"), data, "--user-dir", USER_DIR,
                "--task", "aggressive_translation", "--source-lang", self.cfg["src"],
                "--target-lang", self.cfg["tgt"], "--save-dir", save]
        save.mkdir(parents=True, exist_ok=True) if not self.dry_run else None
        self.run(argv + option_args(self.expand(options)))
        if not self.dry_run:
            done.write_text(f"{options.get('max-update', '')} updates\n")
        self.average(name, model, save)

    def average(self, name, model, save):
        """A model with ``average-last: N``: its last N interval checkpoints averaged
        (scripts/experiments/average_checkpoints.py) into the checkpoint it decodes with."""
        n = model.get("average-last")
        if not n or (not self.dry_run and self.checkpoint(name).exists()):
            return
        self.run([sys.executable, ROOT / "scripts" / "experiments" / "average_checkpoints.py", save,
                  "--last", str(n), "--output", self.checkpoint(name)])

    def train_options(self, name):
        """The fairseq-train options of model ``name`` (train-common + its own), without
        the data, the save directory and options that name other models' checkpoints
        (those belong to a run's work directory): the settings ``scripts/experiments/train_ar.sh``
        and ``train_drafter.sh`` take from the configs."""
        if name not in self.cfg["models"]:
            raise ConfigError(f"no model {name!r} (models: {', '.join(self.cfg['models'])})")
        model = self.cfg["models"][name]
        options = deep_merge(self.cfg.get("train-common") or {}, model.get("options") or {})
        refs = set(self.cfg["models"])
        options = {k: v for k, v in options.items()
                   if not (isinstance(v, str) and set(re.findall(r"\{([\w.+-]+)\}", v)) & refs)}
        return option_args(self.expand(options))

    def distilled_by(self, model):
        """The teacher whose outputs ``model`` trains on (its ``data``: ``distill``, the
        distill section's teacher; ``distill:NAME``, model NAME's), or None (the raw data)."""
        data = model.get("data")
        if data is None or data == "raw":
            return None
        if data == "distill":
            return (self.cfg.get("distill") or {}).get("teacher", "teacher")
        if isinstance(data, str) and data.startswith("distill:") and data[len("distill:"):] in self.cfg["models"]:
            return data[len("distill:"):]
        raise ConfigError(f"data: {data!r}: raw, distill or distill:MODEL (models: {', '.join(self.cfg['models'])})")

    def distill_dir_of(self, teacher):
        default = (self.cfg.get("distill") or {}).get("teacher", "teacher")
        return self.distill_dir if teacher == default else self.work / f"distill-{teacher}"

    def data_of(self, model):
        teacher = self.distilled_by(model)
        return self.data if teacher is None else self.distill_dir_of(teacher) / "bin"

    def distill(self, teacher):
        """The training set decoded by ``teacher`` (the distill section's options)."""
        spec = self.cfg.get("distill") or {}
        out = self.distill_dir_of(teacher)
        if (out / "bin").exists():
            self.log(f"(distilled data found in {out})")
            return
        argv = [sys.executable, ROOT / "scripts" / "experiments" / "distill.py", "--teacher", self.checkpoint(teacher),
                "--data", self.data, "--out", out, "--user-dir", USER_DIR]
        self.run(argv + option_args(self.expand(spec.get("options") or {})))

    def train(self):
        distilled = set()
        for name, model in self.cfg["models"].items():
            if model.get("same-as") or not self.selected(name):
                continue
            teacher = self.distilled_by(model)
            if teacher is not None and teacher not in distilled:
                self.distill(teacher)
                distilled.add(teacher)
            self.train_model(name, model)

    def decode(self):
        spec = self.cfg.get("decode") or {}
        out_dir = self.work / "decode"
        out_dir.mkdir(parents=True, exist_ok=True) if not self.dry_run else None
        results = {}
        for mode, options in (spec.get("modes") or {}).items():
            if options is None:  # a scale drops a mode with null
                continue
            if not self.uses_selected(deep_merge(spec.get("options") or {}, options)):
                continue
            out = out_dir / f"{mode}.txt"
            common = deep_merge(spec.get("options") or {}, {k: v for k, v in (options or {}).items()
                                                             if k not in ("exact", "evaluate")})
            if not out.exists() or self.dry_run:
                argv = [self.tool("fairseq-generate"), self.data, "--user-dir", USER_DIR,
                        "--task", "aggressive_translation", "--source-lang", self.cfg["src"],
                        "--target-lang", self.cfg["tgt"]]
                self.run(argv + option_args(self.expand(common)), stdout=out)
            if not self.dry_run:
                results[mode] = self.score(mode, out, (options or {}).get("evaluate"))
        if results:
            self.compare_exact(results, out_dir)
        return results

    def score(self, mode, out, evaluate=None):
        """A decoding's scores, by the config's ``evaluate`` (a mode's own ``evaluate`` entries
        over it: another split's gold and source)."""
        hyps, refs = read_generate(out)
        row = {"sentences": len(hyps), "file": str(out)}
        evaluate = self.expand(deep_merge(self.cfg.get("evaluate") or {}, evaluate or {}))
        if self.cfg["kind"] == "translation":
            from fairseq_aggressive.evaluation import bleu
            row["bleu"] = round(bleu.corpus_bleu(hyps, [refs], tokenized=True).score, 2)
            if evaluate.get("compound-split"):
                row["bleu_compound_split"] = round(bleu.corpus_bleu(hyps, [refs], compound=True).score, 2)
            if evaluate.get("sacrebleu-reference"):  # detokenized hypotheses vs the original test set
                from sacremoses import MosesDetokenizer

                detok = MosesDetokenizer(lang=self.cfg["tgt"])
                original = Path(evaluate["sacrebleu-reference"]).read_text(encoding="utf-8").splitlines()
                if len(original) != len(hyps):
                    raise SystemExit(f"error: {len(hyps)} hypotheses but {len(original)} reference lines "
                                     f"in {evaluate['sacrebleu-reference']}")
                row["sacrebleu"] = round(bleu.corpus_bleu(
                    [detok.detokenize(h.split()) for h in hyps], [original]).score, 2)
        else:
            from fairseq_aggressive.evaluation import gleu, m2
            gold = Path(evaluate["m2-gold"])
            source = Path(evaluate["source"])
            if not gold.exists() and evaluate.get("m2-gold-from-parallel"):
                self.run([sys.executable, "-m", "fairseq_aggressive.evaluation.parallel_to_m2",
                          source, evaluate["m2-gold-from-parallel"], "-o", gold])
            result = m2.score_m2(hyps, m2.read_m2(gold))
            row.update({"precision": round(result.precision, 4), "recall": round(result.recall, 4),
                        "f0.5": round(result.f, 4)})
            if evaluate.get("gleu-references"):
                srcs = source.read_text(encoding="utf-8").splitlines()
                refs_g = [Path(r).read_text(encoding="utf-8").splitlines() for r in evaluate["gleu-references"]]
                row["gleu"] = round(gleu.corpus_gleu(srcs, refs_g, hyps), 4)
        return row

    def compare_exact(self, results, out_dir):
        """Modes marked ``exact: greedy-MODE`` must give that greedy decoding's output."""
        for mode, options in (self.cfg.get("decode", {}).get("modes") or {}).items():
            ref = (options or {}).get("exact")
            if ref and mode in results and ref in results:
                hyps = read_generate(Path(results[mode]["file"]))[0]
                greedy = read_generate(Path(results[ref]["file"]))[0]
                results[mode]["identical_to_" + ref] = sum(a == b for a, b in zip(hyps, greedy))

    def bench(self):
        results = {}
        for name, options in (self.cfg.get("bench") or {}).items():
            if options is None or not self.uses_selected(options):
                continue
            out = self.work / f"bench-{name}.json"
            if not out.exists() or self.dry_run:
                argv = [self.tool("fairseq-aggressive-bench"), self.data, "--user-dir", USER_DIR,
                        "--task", "aggressive_translation", "--source-lang", self.cfg["src"],
                        "--target-lang", self.cfg["tgt"], "--bench-json", out]
                self.run(argv + option_args(self.expand(options)), stdout=self.work / f"bench-{name}.txt")
            if not self.dry_run:
                results[name] = json.loads(out.read_text())
        return results


def read_generate(path):
    """Hypotheses and references of a fairseq-generate output, in sentence-id order."""
    from fairseq_aggressive.evaluation.generate_output import hypotheses_and_references

    return hypotheses_and_references(path)


def write_results(work, cfg, decode, bench):
    path = Path(work) / "results.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if decode:
        old["decode"] = decode
    if bench:
        old["bench"] = {name: {m: {k: v for k, v in r.items() if not isinstance(v, (list, dict))}
                               for m, r in b["modes"].items()} for name, b in bench.items()}
    path.write_text(json.dumps(old, indent=1))
    lines = [f"# {cfg.get('description', '')} ({cfg.get('direction', '')})", ""]
    if old.get("decode"):
        keys = [k for k in ("bleu", "bleu_compound_split", "sacrebleu", "precision", "recall", "f0.5", "gleu")
                if any(k in r for r in old["decode"].values())]
        keys += sorted({k for r in old["decode"].values() for k in r if k.startswith("identical_to_")})
        lines += ["| decoding | sentences | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
        for mode, r in old["decode"].items():
            cells = [f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys]
            lines.append(f"| {mode} | {r['sentences']} | " + " | ".join(cells) + " |")
        lines.append("")
    columns = [("mean_ms_per_sentence", "ms/sentence"), ("speedup_vs_beam5", "x beam 5"),
               ("speedup_vs_greedy", "x greedy"), ("mean_passes_per_sentence", "passes/sentence"),
               ("mean_tokens_per_pass", "tokens/pass"), ("identical_to_greedy", "= greedy"), ("bleu", "BLEU")]
    for name, modes in (old.get("bench") or {}).items():
        lines += [f"benchmark {name}:", "", "| mode | " + " | ".join(c for _, c in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for mode, r in modes.items():
            cells = [f"{r[k]:.2f}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k, _ in columns]
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
        lines.append("")
    (Path(work) / "results.md").write_text("\n".join(lines))
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("config", help="a YAML file under configs/")
    ap.add_argument("--scale", default="paper", help="paper (default), cpu or ci")
    ap.add_argument("--direction", default=None, metavar="SRC-TGT",
                    help="a direction of the config's language pair (default: its own src-tgt; the other is "
                    "its directions: entry, e.g. de-en)")
    ap.add_argument("--work", default=None, help="output directory (default work/NAME-SCALE)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--models", default=None,
                    help="comma-separated models to train (default all); decode and bench then run only "
                    "what uses these models")
    ap.add_argument("--train-options", metavar="MODEL", default=None,
                    help="print MODEL's fairseq-train options (shell-quoted; no data, save directory or "
                    "other models' checkpoints) and exit")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.scale, args.direction)
    if args.train_options:
        pipe = Pipeline(cfg, args.work or ROOT / "work")
        print(" ".join(shlex.quote(a) for a in pipe.train_options(args.train_options)))
        return pipe
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise ConfigError(f"unknown step(s) {', '.join(bad)}; choose from {', '.join(STEPS)}")
    other = cfg["direction"] != cfg["own_direction"]  # the other direction works apart
    work = args.work or ROOT / "work" / (f"{Path(args.config).stem}-{args.scale}"
                                         + (f"-{cfg['direction']}" if other else ""))
    models = None if args.models is None else [m.strip() for m in args.models.split(",") if m.strip()]
    pipe = Pipeline(cfg, work, dry_run=args.dry_run, models=models)
    started = time.time()
    decode = bench = None
    for step in steps:
        pipe.log(f"== {step}")
        result = getattr(pipe, step)()
        decode = result if step == "decode" else decode
        bench = result if step == "bench" else bench
    if not args.dry_run:
        path = write_results(work, cfg, decode, bench)
        print((Path(work) / "results.md").read_text())
        print(f"results: {path} ({(time.time() - started) / 60:.1f} min)")
    return pipe


if __name__ == "__main__":
    main()
