"""What a Translator's decoding needs of the engine's running batch
(:class:`RunningDecoder`): the batch's settings, the engines, and each
sentence prepared to join (its source ids, copy source and length limit)."""
from dataclasses import dataclass
from typing import List, Optional


class TooLong(ValueError):
    """A sentence the model cannot take (after BPE, or beyond its positions)."""


@dataclass
class Prepared:
    """A sentence ready to join a running batch: its source ids (with EOS), its
    copy source (target ids) and its length limit."""

    source: List[int]
    copy: List[int]
    max_len: int


class RunningDecoder:
    """The running batch of a Translator whose decoding runs there: a drafter
    with an engine counterpart that drafts for rows joining one by one
    (:meth:`~fairseq_aggressive.drafters.base.Drafter.engine_drafter`: source
    copies, greedy with ``max_draft_len=0``, a native feature drafter, blockwise
    heads) on the native engine, without a shortlist.  Build it with :meth:`of`
    (None for any other decoding).  Every sentence's output is its batch-1
    output (``Translator.translate``'s), whatever else is in the batch; each has
    its own length limit."""

    def __init__(self, gen, spec, run: dict, budget: bool, translator=None):
        self.translator, self.gen = translator, gen
        self.hub = translator.hub if translator is not None else None
        self.engine, self.drafter_engine, self.spec = gen.verifier.engine, spec.engine, spec
        self.drafter = gen.drafter
        self.run, self.max_draft, self.budget = run, gen.max_draft_len, budget
        self._to_tgt = None  # (the drafter's source-to-target id map as a list, made on first use)
        task = getattr(self.hub, "task", None)  # symbols after every source's EOS (--source-suffix)
        self._suffix = task.source_suffix_ids() if hasattr(task, "source_suffix_ids") else []
        from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE

        bpe = getattr(self.hub, "bpe", None)
        # subword-nmt's segmenter (else None) and each word's source ids after it (_word_ids)
        self._segmenter = bpe.bpe if isinstance(bpe, SubwordNMTBPE) else None
        self._words = {}

    @classmethod
    def of(cls, translator) -> Optional["RunningDecoder"]:
        """The running batch of ``translator``'s decoding (None where it does not run there)."""
        return cls.of_generator(translator.generator, translator.settings.get("draft_cost"), translator)

    @classmethod
    def of_generator(cls, gen, draft_cost: Optional[str] = None, translator=None) -> Optional["RunningDecoder"]:
        """The running batch of a generator's decoding (None where it does not run
        there), its draft lengths by the engine's policy unless ``draft_cost`` says
        otherwise; ``translator``: the Translator of the text methods (:meth:`prepare`,
        :meth:`finish`), or None (token ids only: :meth:`prepared`)."""
        from ..generator import AggressiveGenerator
        from ..verifiers import NativeVerifier

        if not isinstance(gen, AggressiveGenerator) or not isinstance(gen.verifier, NativeVerifier):
            return None
        if gen.verifier.shortlist or not gen.engine_loop:
            return None
        spec = gen.drafter.engine_drafter(gen.verifier)
        if spec is None or not spec.joins:
            return None
        r = gen.verifier.rules
        start = getattr(gen, "start_token", None)  # (an imported model's own start token)
        run = dict(spec.settings, kind=spec.kind, first=gen.eos if start is None else start, min_len=r.min_len,
                   unk_penalty=r.unk_penalty, temperature=r.temperature, beta=gen.verifier.beta, tau=gen.verifier.tau,
                   forced=r.forced)
        return cls(gen, spec, run, draft_cost in (None, "auto"), translator)

    def engines(self, n: int, threads) -> list:
        """``n`` (verifier engine, drafter engine or None) pairs on one copy of the weights."""
        pair = (self.engine, self.drafter_engine)
        return [pair] + [(self.engine.share(threads), self.drafter_engine and self.drafter_engine.share(threads))
                         for _ in range(n - 1)]

    def lanes(self, rows: int, lanes: Optional[int] = None) -> int:
        """How many lanes (running batches, one thread each) ``rows`` rows are split among:
        ``lanes`` if given, else the engine's default (one per thread where the weights a pass
        reads stay in the caches: ``NativeEngine.default_lanes``, a stream's); never more than the rows."""
        return max(1, min(rows, lanes if lanes is not None else self.engine.default_lanes(stream=True)))

    def lane_rows(self) -> Optional[int]:
        """The most rows a lane decodes at once (``NativeEngine.lane_rows``: as many as keep
        their attention caches in the CPU's caches where the weights are small; None: no bound)."""
        return self.engine.lane_rows()

    def make_batches(self, lanes: int) -> list:
        """A running batch per lane: one on the Translator's engine, or (``lanes`` > 1) one
        on each of the engine's ``lanes`` one-thread lanes (``NativeEngine.lanes``, with
        the drafter engine's)."""
        if lanes <= 1:
            return [self.make_batch()]
        drafters = self.drafter_engine.lanes(lanes) if self.drafter_engine is not None else [None] * lanes
        return [self.make_batch(e, d) for e, d in zip(self.engine.lanes(lanes), drafters)]

    def make_batch(self, engine=None, drafter_engine=None):
        """A new running batch on ``engine`` (default: the Translator's).  Streams and the
        server read tokens only, so its passes compute no output scores."""
        from ..native.running import RunningBatch

        if engine is None:
            engine, drafter_engine = self.engine, self.drafter_engine
        return RunningBatch(engine, max_draft=self.max_draft, budget=self.budget, drafter=drafter_engine,
                            scores=False, **self.run)

    def prepare(self, text: str, max_tokens: Optional[int] = None) -> Prepared:
        """``text`` ready to join; :class:`TooLong` past ``max_tokens`` (the model's
        positions at most) after BPE."""
        limit, what = self.translator._limit, "the model takes at most"
        if max_tokens is not None and (limit is None or max_tokens < limit):
            limit, what = max_tokens, "the limit is"
        ids = self.ids(text)
        if limit is not None and len(ids) > limit:
            raise TooLong(f"is {len(ids)} tokens long after BPE; {what} {limit}")
        return self.prepared(ids)

    def prepared(self, tokens) -> Prepared:
        """Source ids (a list, or a tensor) ready to join."""
        from ..generator import length_cap

        src = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        gen, n = self.gen, len(src)
        max_len = length_cap(gen.max_len_a, gen.max_len_b, n, gen.max_len)
        if max_len < gen.min_len or not self.engine.can_decode(n, max_len):
            raise TooLong(f"({n} tokens) does not fit the model's positions")
        if not self.spec.copies:  # (a drafter that does not copy the source)
            return Prepared(src, [], max_len)
        d = self.drafter
        if d.src_to_tgt is not None:  # the source ids in the target dictionary
            if self._to_tgt is None:
                self._to_tgt = d.src_to_tgt.tolist()
            copy = [self._to_tgt[t] for t in src]
        else:
            copy = src
        return Prepared(src, [t for t in copy if t != d.pad], max_len)

    def ids(self, text: str) -> List[int]:
        """The hub's ``encode(text)`` as a list (tokenized, BPE, source ids with EOS
        and the task's ``--source-suffix``),
        the ids looked up in one pass instead of fairseq's ``encode_line`` (which
        fills a tensor item by item: most of a short sentence's time outside the engine)."""
        d = self.hub.src_dict
        tokens = self.hub.tokenize(text)
        ids = self._word_ids(tokens)
        if ids is None:
            ix, unk = d.indices, d.unk_index
            ids = [ix.get(w, unk) for w in self.hub.apply_bpe(tokens).split()]
        return ids + [d.eos_index] + self._suffix

    def _word_ids(self, tokens: str) -> Optional[List[int]]:
        """The source ids of ``tokens`` word by word, each word's kept once made,
        where the hub's BPE is subword-nmt's (else None): it segments each
        space-separated word on its own (``segment_tokens``), so a word's ids never
        depend on its neighbours, and its per-word Python is most of a short
        sentence's time before the engine."""
        if self._segmenter is None:
            return None
        d, cache, out = self.hub.src_dict, self._words, []
        ix, unk = d.indices, d.unk_index
        for word in tokens.strip("\r\n ").split(" "):  # (as subword-nmt's process_line splits)
            if not word:
                continue
            ids = cache.get(word)
            if ids is None:
                ids = [ix.get(w, unk) for w in " ".join(self._segmenter.segment_tokens([word])).split()]
                if len(cache) >= 1 << 17:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def encode(self, text: str):
        """The hub's ``encode(text)``: :meth:`ids` as a tensor."""
        import torch

        return torch.tensor(self.ids(text), dtype=torch.long)

    def finish(self, tokens: List[int]) -> str:
        """The hub's ``decode(tokens)``: the symbols but EOS joined, then BPE removed and detokenized."""
        d = self.hub.tgt_dict
        eos, symbols = d.eos_index, d.symbols
        return self.hub.detokenize(self.hub.remove_bpe(" ".join(symbols[t] for t in tokens if t != eos)))
