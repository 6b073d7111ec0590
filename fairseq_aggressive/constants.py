"""Choices of the plugin's options, in a module that imports nothing, so that
the task's options (tasks/config.py) and the modules that implement the
choices share them without importing each other."""

# --engine: the verifier of aggressive decoding
ENGINES = ("auto", "native", "torch")

# --drafter-bf16, --cpu-bf16: whether bfloat16 is used (auto: where the hardware has it)
PRECISION_CHOICES = ("auto", "on", "off")

# --inference-precision: the arithmetic of the model's linear layers
PRECISIONS = ("float32", "int8")
