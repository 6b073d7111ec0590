"""What the server decodes with: a model directory's hub model, its
:class:`~fairseq_aggressive.translator.Translator` settings, one queue and W
workers on one copy of the weights (:mod:`~fairseq_aggressive.serving.scheduler`).

Where the decoding runs on the native engine as source-copy drafting,
greedy search or a feature drafter's drafts (``--decoding iad``, ``--decoding
greedy``, ``--decoding feature-ar`` with a native drafter), each worker drives
a running batch (continuous batching, in-engine draft lengths); its engines
share the weights of the others.  Any other decoding decodes the queued
sentences in static batches through the Translator (one worker).  Either way
a sentence's output is ``Translator.translate(sentence)``'s, which is the hub
model's ``translate(sentence, beam=1, ...)``.
"""
import logging
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ..generator import length_cap
from ..translator import Translator, load_hub
from .errors import Overloaded, RequestError, ShuttingDown
from .scheduler import ContinuousWorker, Item, Request, StaticWorker, WorkQueue

logger = logging.getLogger("fairseq_aggressive")

# how long a thread may hold the GIL while another waits for it (s): a worker back from
# the engine waits for the HTTP side to let go of it before it can answer and start the
# next pass; Python's default of 5 ms is several passes of a small model
SWITCH_INTERVAL = 0.0005


def serving_threads(workers: int) -> int:
    """Engine threads per worker by default: the CPUs this process may use, less
    one for the HTTP side (parsing, BPE, answers), shared by the workers.  An
    engine whose threads outnumber the free cores waits, at every product,
    for a thread the HTTP side displaced."""
    from ..runtime.threads import usable_cpus

    return max(1, (usable_cpus() - 1) // workers)


@dataclass
class Prepared:
    """A sentence ready to join a running batch: its source ids (with EOS), its
    copy source (target ids) and its length limit."""

    source: List[int]
    copy: List[int]
    max_len: int


class DecodeBackend:
    """``model_dir`` as :meth:`Translator.from_pretrained` takes it, decoded by
    ``workers`` workers (each with ``native_threads`` engine threads) from one
    queue of at most ``max_queue`` waiting sentences; a sentence of more than
    ``max_input_tokens`` tokens after BPE is refused; a running batch holds at
    most ``max_batch`` sentences.  ``settings``: the Translator's (``decoding``,
    ``inference_precision``, ``max_draft_len``, ...); ``decoding="greedy"`` is
    greedy search on the engine's running batch (IAD with drafts of 0 tokens)."""

    def __init__(self, model_dir: str, workers: int = 1, max_queue: int = 256, max_input_tokens: int = 256,
                 max_batch: int = 32, metrics=None, **settings):
        if workers < 1 or max_batch < 1 or max_queue < 0 or max_input_tokens < 1:
            raise ValueError("--workers, --max-batch and --max-input-tokens must be >= 1, --max-queue >= 0")
        self.ready = False
        self.metrics = metrics
        self.closing = False
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        settings = dict(settings)
        if settings.get("native_threads") in (None, "auto"):
            settings["native_threads"] = serving_threads(workers)
        decoding = settings.get("decoding", "iad")
        if decoding == "greedy":
            settings.update(decoding="iad", max_draft_len=0)
        settings.setdefault("decoding", "iad")
        hub = load_hub(model_dir)
        self.translator = Translator(hub, **settings)
        self.hub = hub
        limit = self.translator._limit
        self.max_input_tokens = min(max_input_tokens, limit) if limit is not None else max_input_tokens
        self.queue = WorkQueue(max_queue, on_length=self._queue_length)
        self.continuous = self._continuous_settings()
        if self.continuous is not None:
            threads = settings.get("native_threads")
            engine, drafter = self.continuous["engine"], self.continuous["drafter_engine"]
            engines = [(engine, drafter)] + [(engine.share(threads), drafter and drafter.share(threads))
                                             for _ in range(workers - 1)]
            self.workers = [ContinuousWorker(f"decoder-{i}", self.queue, self._batch_maker(*e), self._finish,
                                             max_batch, on_passes=self._on_passes)
                            for i, e in enumerate(engines)]
            self._lock = threading.Lock()
        else:
            logger.warning(f"--decoding {decoding}: decoded in static batches by one worker (a running batch takes "
                           "IAD and greedy search on the native engine)")
            self.workers = [StaticWorker("decoder-0", self.queue, self.translator.translate_batch, max_batch)]
        self.mode = "continuous" if self.continuous is not None else "static"
        for w in self.workers:
            w.start()
        if metrics is not None:
            metrics.set_workers(len(self.workers))
        self.ready = True

    # ------------------------------------------------------------ set-up
    def _continuous_settings(self) -> Optional[dict]:
        """What a running batch needs of the Translator's generator, or None
        where its decoding is not source-copy drafting, greedy or a feature
        drafter's on the engine."""
        from ..drafters.base import drafts_as
        from ..drafters.feature_ar import FeatureARDrafter
        from ..drafters.input_copy import InputCopyDrafter
        from ..generator import AggressiveGenerator
        from ..verifiers import NativeVerifier

        gen = self.translator.generator
        if not isinstance(gen, AggressiveGenerator) or not isinstance(gen.verifier, NativeVerifier):
            return None
        if gen.verifier.shortlist or not gen.engine_loop:
            return None
        drafter, r = gen.drafter, gen.verifier.rules
        run = dict(first=gen.eos, min_len=r.min_len, unk_penalty=r.unk_penalty, temperature=r.temperature,
                   beta=gen.verifier.beta, tau=gen.verifier.tau)
        draft_cost = self.translator.settings.get("draft_cost")
        if isinstance(drafter, InputCopyDrafter) and drafter.copy_loop() is not None:
            run.update(ngram_min=drafter.ngram_min, ngram_max=drafter.ngram_max)
            return dict(engine=gen.verifier.engine, drafter_engine=None, gen=gen, drafter=drafter, run=run,
                        max_draft=gen.max_draft_len,
                        budget=bool(getattr(gen.policy, "engine_budget", False)))
        if (isinstance(drafter, FeatureARDrafter) and drafter.native is not None and drafter.shortlist is None
                and drafts_as(drafter, FeatureARDrafter, ("propose", "observe_emitted", "update"))):
            run.update(bos=drafter.bos, k=drafter.k, room=drafter.max_positions - 1, min_prob=drafter.min_prob,
                       shared_encoder=drafter.caps.encoder_out)
            return dict(engine=gen.verifier.engine, drafter_engine=drafter.native.engine, gen=gen, drafter=drafter,
                        run=run, max_draft=gen.max_draft_len,
                        budget=draft_cost != "off")
        return None

    def _batch_maker(self, engine, drafter=None):
        from ..native.running import RunningBatch

        c = self.continuous
        return lambda: RunningBatch(engine, max_draft=c["max_draft"], budget=c["budget"], drafter=drafter, **c["run"])

    # ------------------------------------------------------------ requests
    def prepare(self, i: int, text: str):
        """Sentence ``i``'s tokens for a worker; a RequestError if it is too long."""
        tokens = self.hub.encode(text)
        n = int(tokens.numel())
        if n > self.max_input_tokens:
            raise RequestError(f"texts[{i}] is {n} tokens long after BPE; the limit is {self.max_input_tokens}",
                               code="too_long", status=413)
        if self.continuous is None:
            return None
        c = self.continuous
        gen, drafter = c["gen"], c["drafter"]
        max_len = length_cap(gen.max_len_a, gen.max_len_b, n, gen.max_len)
        if max_len < gen.min_len or not c["engine"].can_decode(n, max_len):
            raise RequestError(f"texts[{i}] ({n} tokens) does not fit the model's positions", code="too_long",
                               status=413)
        if c["drafter_engine"] is not None:  # the feature drafter copies nothing
            return Prepared(tokens.tolist(), [], max_len)
        copy = tokens if drafter.src_to_tgt is None else drafter.src_to_tgt[tokens]
        copy = copy[copy != drafter.pad]
        return Prepared(tokens.tolist(), copy.tolist(), max_len)

    def submit(self, texts: List[str]) -> Future:
        """Queue ``texts``; the future resolves to their outputs in order."""
        if self.closing:
            raise ShuttingDown("the server is shutting down")
        request = Request(list(texts))
        items = [Item(request, i, self.prepare(i, t)) for i, t in enumerate(texts)]
        if not self.queue.put_all(items):
            raise Overloaded(f"the queue is full ({self.queue.limit} sentences wait); retry later")
        for w in self.workers:
            if w.busy < w.max_batch:  # (a full batch takes nothing before a sentence leaves it)
                w.wake()
        return request.future

    def _finish(self, item: Item, tokens: List[int]) -> str:
        return self.hub.decode(tokens)

    # ------------------------------------------------------------ metrics
    def _queue_length(self, n: int) -> None:
        if self.metrics is not None:
            self.metrics.set_queue_length(n)

    def _on_passes(self, now, last) -> None:
        if self.metrics is None:
            return
        def d(name):
            return getattr(now, name) - (getattr(last, name) if last is not None else 0)

        hist = {}
        for k in range(1, len(now.pass_rows)):
            v = now.pass_rows[k] - (last.pass_rows[k] if last is not None else 0)
            if v:
                hist[k] = v
        with self._lock:
            self.metrics.observe_passes(d("passes"), d("sentence_passes"), d("emitted"), hist)
            n = 8
            drafted = [now.position_drafted[j] - (last.position_drafted[j] if last is not None else 0)
                       for j in range(n)]
            accepted = [now.position_accepted[j] - (last.position_accepted[j] if last is not None else 0)
                        for j in range(n)]
            self.metrics.observe_positions(drafted, accepted)

    # ------------------------------------------------------------ shutdown
    def close(self, timeout: float = 60.0) -> int:
        """Take nothing new, answer everything queued or decoding, stop the
        workers; the sentences left unanswered after ``timeout`` seconds (0 if none)."""
        self.closing = True
        for w in self.workers:
            w.stop_flag.set()
            w.wake()
        for w in self.workers:
            w.join(timeout)
        left = len(self.queue) + sum(w.busy for w in self.workers)
        self.ready = False
        return left
