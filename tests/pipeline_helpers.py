"""What tests/test_pipeline.py and tests/test_pipeline_translation.py share: the pipeline script
(scripts/experiments/pipeline.py) loaded as a module, every config and scale, a dry run of every
step, fairseq's own parsers for the commands it writes, and a real run of a config.  The two
ci-scale pipelines are in separate files so that pytest-xdist (--dist loadfile) runs them on two
workers at once; xdist hands out the files with the most tests first, so each file keeps one
parametrized set of dry-run checks (test_commands_parse_with_fairseq in tests/test_pipeline.py,
test_budgets_in_updates_and_no_hidden_bf16 in tests/test_pipeline_translation.py) and starts early."""
import glob
import importlib.util
import os
import sys

import yaml

from helpers import ROOT, run

PIPELINE = os.path.join(ROOT, "scripts", "experiments", "pipeline.py")
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*", "*.yaml")))
CONFIGS = [c for c in CONFIGS if "kind:" in open(c).read()]  # not the shared scale files


def load_pipeline():
    spec = importlib.util.spec_from_file_location("pipeline", PIPELINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pipeline = load_pipeline()

LICENSED_ENV = {v: f"/licensed/{v.lower()}.m2" for v in (
    "LANG8_M2", "NUCLE_M2", "FCE_M2", "WI_TRAIN_M2", "WI_DEV_M2", "CONLL13_M2", "CONLL14_M2")}


def scales_of(path):
    with open(path) as f:
        return ["paper"] + list((yaml.safe_load(f).get("scales") or {}))


CASES = [(c, s) for c in CONFIGS for s in scales_of(c)]

CASE_IDS = [f"{os.path.basename(c)}-{s}" for c, s in CASES]


def dry_run(config, scale, tmp_path, monkeypatch):
    for k, v in LICENSED_ENV.items():
        monkeypatch.setenv(k, v)
    lines = []
    cfg = pipeline.load_config(config, scale)
    pipe = pipeline.Pipeline(cfg, tmp_path / "work", dry_run=True, log=lines.append)
    for step in pipeline.STEPS:
        getattr(pipe, step)()
    return cfg, pipe


def parse_with_fairseq(argv):
    """Parse a fairseq-train / fairseq-generate / bench command line with fairseq's own parser."""
    from fairseq import options

    from fairseq_aggressive.bench.options import add_bench_args

    tool = os.path.basename(argv[0])
    if tool == "fairseq-train":
        parser = options.get_training_parser()
    elif tool == "fairseq-generate":
        parser = options.get_generation_parser()
    elif tool == "fairseq-aggressive-bench":
        parser = options.get_generation_parser(default_task="aggressive_translation")
        add_bench_args(parser)
    else:
        return None
    return options.parse_args_and_arch(parser, input_args=argv[1:])


def run_pipeline(config, scale, work, *extra):
    return run([sys.executable, PIPELINE,
                os.path.join(ROOT, "configs", config), "--scale", scale, "--work", str(work), *extra])
