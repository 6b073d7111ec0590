"""Choices of the plugin's options, in a module that imports nothing, so that
the task's options (tasks/config.py) and the modules that implement the
choices share them without importing each other."""

# --engine: the verifier of aggressive decoding
ENGINES = ("auto", "native", "torch")

# --drafter-bf16, --cpu-bf16: whether bfloat16 is used (auto: where the hardware has it)
PRECISION_CHOICES = ("auto", "on", "off")

# --inference-precision: the arithmetic of the model's linear layers
PRECISIONS = ("float32", "int8")

# --max-draft-len where it is not given, by what decides each pass's lengths (the one table; the
# option's help in decoding_options.py and docs/usage.md say the same):
# - "engine": the native engine's draft-length policy (IAD's and the feature drafter's default)
# - "budget": a cost-aware budget in the generator's loop (--draft-cost FIXED,PER_POSITION)
# - "native": drafts verified as made on the native engine (--draft-cost off): the engine's
#   passes cost little more than a greedy step, so positions verified but rarely accepted are
#   what a long draft wastes (Lmax 3-5 are best on the shipped model: docs/results-uagec.md)
# - "torch": drafts verified as made by the torch verifier (None: no cap)
# - "beam": drafted beam search's hypotheses
DEFAULT_MAX_DRAFT_LEN = {"engine": 8, "budget": 16, "native": 4, "torch": None, "beam": 4}
