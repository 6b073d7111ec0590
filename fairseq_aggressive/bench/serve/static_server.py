"""What the ``static`` system's server (``--serve-static``) decodes with: the
engine's greedy, one Translator per worker, its threads by default those of
``fairseq-aggressive-serve``."""
from typing import Callable, List


def static_translators(args) -> List[Callable]:
    """The engine's greedy (IAD with drafts of 0 tokens), one Translator per
    worker on one hub model; ``--native-threads auto``: the serving default
    (:func:`~fairseq_aggressive.serving.backend.serving_threads`), as the
    continuous-batching servers have it."""
    from fairseq_aggressive.serving.backend import serving_threads
    from fairseq_aggressive.translator import Translator

    auto = args.native_threads in (None, "auto")
    settings = dict(decoding="iad", max_draft_len=0,
                    native_threads=serving_threads(args.workers) if auto else int(args.native_threads))
    first = Translator.from_pretrained(args.model_dir, **settings)
    return [first.translate_static] + [Translator(first.hub, **settings).translate_static
                                      for _ in range(args.workers - 1)]
