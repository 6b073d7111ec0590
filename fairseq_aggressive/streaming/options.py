"""The decoding options on a command line (``fairseq-aggressive-serve``,
``fairseq-aggressive-translate``): every row of
:data:`~fairseq_aggressive.decoding_options.OPTIONS`, ``--inference-precision``
and fairseq's length settings, each with its type and default in ``--help``."""
import argparse
import logging
import typing

# generation settings of fairseq's the server takes besides the decoding options
GENERATION = (("max_len_a", float, 0.0, "output length limit: a * source length + b (fairseq's --max-len-a)"),
              ("max_len_b", int, 200, "(fairseq's --max-len-b)"),
              ("min_len", int, 1, "shortest output (fairseq's --min-len)"),
              ("unkpen", float, 0.0, "unknown-word penalty (fairseq's --unkpen)"))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, once."""

    def _get_help_string(self, action):
        return action.help if "(default:" in (action.help or "") else super()._get_help_string(action)


def add_decoding_arguments(p: argparse.ArgumentParser, greedy: bool = True) -> typing.List[str]:
    """The decoding options (``decoding_options.OPTIONS``, ``--inference-precision``
    and fairseq's length settings) as arguments of ``p``, each unset by default
    (the Translator's default then holds); their names, for :func:`decoding_settings`.
    ``greedy``: ``--decoding greedy`` is a choice (the server's)."""
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    from ..constants import PRECISIONS
    from ..decoding_options import OPTIONS

    g = p.add_argument_group("decoding (the Translator's settings; unset: the default shown)")
    names = []

    def add(name, kind, default, help_text, **extra):
        flag = "--" + name.replace("_", "-")
        shown = "unset" if default is None else default
        g.add_argument(flag, dest=name, default=None, help=f"{help_text} (default: {shown})", **extra)
        names.append(name)

    for o in OPTIONS:
        kind = o.type
        if typing.get_origin(kind) is typing.Union:  # Optional[X]
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if o.name == "decoding":
            choices = list(kind) + (["greedy"] if greedy else [])
            add(o.name, str, "iad", ("greedy = greedy search on the native engine's running batch (iad with "
                                     "drafts of 0 tokens); " if greedy else "") + o.help, choices=choices)
        elif isinstance(kind, type) and issubclass(kind, bool):
            add(o.name, bool, o.default, o.help, action="store_true")
        elif isinstance(kind, tuple):  # a choice
            extra = {"nargs": "?", "const": o.metadata["argparse_const"]} if "argparse_const" in o.metadata else {}
            add(o.name, str, o.default, o.help, choices=list(kind), **extra)
        else:
            add(o.name, kind, o.default, o.help, type=kind, metavar=kind.__name__.upper())
    add("inference_precision", str, "float32", "int8: int8 linear layers (the same int8 model everywhere; "
        "exact decodings give its greedy output)", choices=list(PRECISIONS))
    for name, kind, default, help_text in GENERATION:
        add(name, kind, default, help_text, type=kind, metavar=kind.__name__.upper())
    return names


def decoding_settings(args: argparse.Namespace, names: typing.List[str]) -> dict:
    """The decoding options given on the command line, as Translator settings."""
    return {k: getattr(args, k) for k in names if getattr(args, k) not in (None, False)}


def translator_settings(settings: dict) -> dict:
    """Command-line settings as the Translator takes them: ``--decoding greedy`` is
    IAD with drafts of 0 tokens (greedy search on the engine's running batch); no
    ``--decoding``: IAD."""
    settings = dict(settings)
    if settings.get("decoding") == "greedy":
        settings.update(decoding="iad", max_draft_len=0)
    settings.setdefault("decoding", "iad")
    return settings
