from . import aggressive_translation  # noqa: F401  (registers the task)
