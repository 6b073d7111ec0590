"""Checks of the plugin's options, each written once.

The task checks its configuration when it is built (``fairseq-train`` and
``fairseq-generate`` stop before loading anything); the generator, drafters and
criteria call the same functions for the values they are given directly (hub
API, tests, scripts).  Messages name the command-line flag."""
import numbers
from typing import Optional


def check_positive_int(value, flag: str) -> int:
    """``value`` as an int, or a ValueError naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value or value < 1:
        raise ValueError(f"{flag} must be an integer >= 1, got {value}")
    return int(value)


def check_isa(value) -> Optional[str]:
    """--native-isa: None for ``auto`` (or unset), else a build target's name
    (:mod:`~fairseq_aggressive.native.targets`; whether this CPU runs it is
    checked when the engine loads)."""
    if value in (None, "", "auto"):
        return None
    from .native import targets

    names = list(targets.all_targets())
    if value not in names:
        raise ValueError(f"--native-isa must be auto or one of {', '.join(names) or '(none on this architecture)'}, "
                         f"got {value!r}")
    return str(value)


def check_max_draft_len(value: Optional[int]) -> Optional[int]:
    """Lmax: None (unlimited / the engine's default) or an integer >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value or value < 0:
        raise ValueError(f"--max-draft-len must be >= 0 (or unset for unlimited), got {value}")
    return int(value)


def check_draft_cost(value: str):
    """--draft-cost FIXED,PER_POSITION: two numbers > 0 (milliseconds), as floats."""
    parts = str(value).split(",")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) != 2 or not all(x > 0 and x < float("inf") for x in nums):
        raise ValueError(f"--draft-cost must be 'auto', 'off' or FIXED,PER_POSITION (milliseconds of a pass "
                         f"and of each position it verifies, both > 0), got {value!r}")
    return nums[0], nums[1]


def check_iad_branches(value) -> int:
    """--iad-branches: drafts verified per pass after an edit, 1 to 8."""
    n = check_positive_int(value, "--iad-branches")
    if n > 8:
        raise ValueError(f"--iad-branches must be at most 8, got {n}")
    return n


def check_block_size(value: Optional[int]) -> Optional[int]:
    """GAD's k: None (the drafter's training value) or an integer >= 1."""
    return None if value is None else check_positive_int(value, "--block-size")


def check_shortlist(value: Optional[int], decoding: str) -> Optional[int]:
    """--vocab-shortlist: None (off) or an integer >= 1, with an aggressive decoding."""
    if value is None:
        return None
    value = check_positive_int(value, "--vocab-shortlist")
    if decoding == "beam":
        raise ValueError("--vocab-shortlist needs an aggressive --decoding (iad, gad, blockwise); greedy "
                         "search on the shortlist is --decoding iad --max-draft-len 0")
    return value


def check_single_model(models) -> None:
    if len(models) != 1:
        raise ValueError(f"aggressive decoding verifies with a single model, got an ensemble of {len(models)}")


def check_temperature(value: float) -> float:
    if not value > 0:
        raise ValueError(f"--temperature must be greater than 0, got {value}")
    return value


# generation options that change greedy's choices and that aggressive decoding
# does not reproduce: (option, value that means "off", how the user spells it)
UNSUPPORTED_GENERATION = [
    ("sampling", False, "--sampling"),
    ("no_repeat_ngram_size", 0, "--no-repeat-ngram-size"),
    ("prefix_size", 0, "--prefix-size"),
    ("constraints", None, "--constraints"),
    ("match_source_len", False, "--match-source-len"),
    ("lm_path", None, "--lm-path"),
    ("diverse_beam_groups", -1, "--diverse-beam-groups"),
    ("diversity_rate", -1, "--diversity-rate"),
    ("print_alignment", None, "--print-alignment"),
    ("retain_dropout", False, "--retain-dropout"),
]


def check_generation_args(args, decoding: str) -> None:
    """Refuse generation options aggressive decoding cannot honour exactly."""
    beam = getattr(args, "beam", 5)
    if beam != 1:
        raise ValueError(f"--decoding {decoding} reproduces greedy search: pass --beam 1 (got --beam {beam})")
    nbest = getattr(args, "nbest", 1)
    if nbest != 1:
        raise ValueError(f"--decoding {decoding} returns one hypothesis: pass --nbest 1 (got {nbest})")
    for name, off, flag in UNSUPPORTED_GENERATION:
        value = getattr(args, name, off)
        if value not in (off, None, False, 0, -1, ""):
            raise ValueError(f"{flag} is not supported with --decoding {decoding}; use --decoding beam")


def check_confidence(value) -> float:
    """``--draft-confidence``: a probability in [0, 1) (0: off)."""
    p = float(value)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"--draft-confidence must be in [0, 1) (0: off), got {value}")
    return p
