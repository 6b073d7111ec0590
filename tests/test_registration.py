"""The package registers with fairseq whichever of the two is imported first,
and its scorers and command lines' parsers load neither torch nor fairseq
(fairseq_aggressive/registration.py).
Each case runs in a fresh interpreter: the order of the first imports is what is tested."""
import subprocess
import sys

import pytest

CHECK = """
import sys
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.registry import REGISTRIES
from fairseq.tasks import TASK_REGISTRY
import fairseq.checkpoint_utils as cu
missing = [n for n, ok in [
    ("task", "aggressive_translation" in TASK_REGISTRY),
    ("arch", "transformer_deep_shallow" in ARCH_MODEL_REGISTRY),
    ("criterion", "glat_block_loss" in CRITERION_REGISTRY),
    ("bpe", "hf_sentencepiece" in REGISTRIES["bpe"]["registry"]),
    ("checkpoint shim", cu.torch.__class__.__name__ == "_TorchWithTrustedLoad"),
    ("watch gone", not any(type(f).__name__ == "_Watch" for f in sys.meta_path)),
] if not ok]
assert not missing, missing
print("registered")
"""

# (fairseq first, then the package, is what every --user-dir command of the suite does)
FIRST_IMPORTS = {
    "package, then fairseq": "import fairseq_aggressive\nimport fairseq\n",
    # a module of the package that imports fairseq while it runs: the registration waits for it
    "a module that imports fairseq": "import fairseq_aggressive.drafters.nar_block_checkpoint\n",
}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
@pytest.mark.parametrize("first", sorted(FIRST_IMPORTS))
def test_components_register_whichever_is_imported_first(first):
    proc = _run(FIRST_IMPORTS[first] + CHECK)
    assert proc.returncode == 0 and "registered" in proc.stdout, proc.stderr[-3000:]


def test_scorers_load_neither_torch_nor_fairseq():
    proc = _run(
        "import sys\n"
        "import fairseq_aggressive\n"
        "from fairseq_aggressive.evaluation import bleu, generate_output, gleu, m2, m2_to_parallel, parallel_to_m2\n"
        "heavy = [m for m in ('torch', 'fairseq', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('light')\n")
    assert proc.returncode == 0 and "light" in proc.stdout, proc.stderr[-3000:]


def test_the_command_lines_parse_without_torch_or_fairseq():
    """--help and argument errors of fairseq-aggressive-serve and -translate answer at once:
    their parsers (every decoding option, its choices and default) and the options' reading
    load neither torch nor fairseq."""
    proc = _run(
        "import sys\n"
        "from fairseq_aggressive.serving import cli, translate_cli\n"
        "from fairseq_aggressive.decoding_options import DecodingOptions\n"
        "for p in (cli.parser(), translate_cli.parser()):\n"
        "    text = p.format_help()\n"
        "    assert '--decoding' in text and 'feature-ar' in text and '--native-threads' in text, text\n"
        "heavy = [m for m in ('torch', 'fairseq') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('light')\n")
    assert proc.returncode == 0 and "light" in proc.stdout, proc.stderr[-3000:]
