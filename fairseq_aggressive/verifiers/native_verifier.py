"""The native verifier: the compiled CPU engine
(:class:`~fairseq_aggressive.native.NativeEngine`) applies fairseq's score
rules and the acceptance rule's description itself, and verifies several
branches of a sentence in one pass.  A batch the engine cannot take (a GPU
tensor, a length beyond its position tables) goes to a torch verifier."""
from ..acceptance import AcceptanceRule
from ..constants import DEFAULT_MAX_DRAFT_LEN
from ..native.lanes import decode_in_lanes
from ..native.running import run_settings
from ..runtime.threads import torch_single_threaded
from .base import PassResult, ScoreRules, Verifier
from .torch_verifier import TorchVerifier



class NativeVerifier(Verifier):
    """:class:`~fairseq_aggressive.verifiers.base.Verifier` on the native engine."""

    name = "native"
    branch_capable = True
    open_draft_cap = DEFAULT_MAX_DRAFT_LEN["native"]  # (of open-ended drafters: IAD drafts the rest of the source)

    def __init__(self, engine, model, rules: ScoreRules, acceptance: AcceptanceRule, shortlist=None):
        rank = acceptance.params.native
        if rank is None:
            raise ValueError(f"the native engine cannot apply {acceptance!r}")
        self.engine, self.rules, self.acceptance, self.shortlist = engine, rules, acceptance, shortlist
        self.beta, self.tau = rank
        self.fallback = TorchVerifier(model, rules, acceptance, shortlist)
        self._on_torch = False
        self._batch = self._pending = None
        # the lanes a batch decoded by the engine's loop is dealt among (None: the engine's default_lanes)
        self.lanes = None

    def begin(self, sample, max_len: int, tree_room: int = 0) -> None:
        src_tokens = sample["net_input"]["src_tokens"]
        self._on_torch = src_tokens.device.type != "cpu" or not self.engine.can_decode(src_tokens.size(1), max_len)
        self._batch = self._pending = None
        if self._on_torch:
            return self.fallback.begin(sample, max_len, tree_room)
        self.max_len = max_len
        self._pending = (src_tokens, tree_room)  # encoded on first use (decode_in_engine: by each lane)

    @property
    def batch(self):
        """The engine's state of the batch begun last (encoded here on first use)."""
        if self._batch is None and self._pending is not None:
            src_tokens, room = self._pending
            self._pending = None
            self._batch = self.engine.begin(src_tokens, self.max_len, self.shortlist, tree_room=room)
        return self._batch

    @property
    def takes_branches(self) -> bool:
        return not self._on_torch

    def encoder_out(self):
        return self.fallback.encoder_out() if self._on_torch else self.batch.encoder_out()

    def running(self):
        # torch's idle OpenMP workers would take turns with the engine's threads
        return self.fallback.running() if self._on_torch else torch_single_threaded()

    def pass_cost(self, src_tokens):
        from ..draft_budget import measure_pass_cost

        return measure_pass_cost(self.engine, src_tokens)

    @property
    def runs_engine_loops(self) -> bool:
        return not self._on_torch

    def decode_in_engine(self, kind: str, first: int, max_draft, budget: bool = False, copy=None, drafter=None,
                         **settings):
        r = self.rules
        run = run_settings(kind, first, max_draft, budget=budget, min_len=r.min_len, unk_penalty=r.unk_penalty,
                           temperature=r.temperature, beta=self.beta, tau=self.tau, forced=r.forced, **settings)
        copy, copy_len = copy if copy is not None else (None, None)
        lanes = [] if drafter is not None or self.shortlist else self._lanes()
        if lanes:  # the sentences dealt among one-thread lanes
            if self._batch is None:  # each lane encodes its own
                (src_tokens, room), self._pending = self._pending, None
                return decode_in_lanes(lanes, run, self.max_len, copy, copy_len, src_tokens=src_tokens,
                                       tree_room=room)
            return decode_in_lanes(lanes, run, self.max_len, copy, copy_len, batch=self._batch)
        engine, state = drafter if drafter is not None else (None, None)
        return self.batch.decode(run, self.max_len, copy, copy_len, engine, state)

    def _lanes(self) -> list:
        """The lanes the batch begun last decodes in (none: decoded whole)."""
        b, pending = self._batch, self._pending
        n = b.src_keep.numel() if b is not None else pending[0].size(0) if pending is not None else 0
        lanes = self.engine.lanes(self.lanes if self.lanes is not None else self.engine.default_lanes())
        return lanes if n > 1 and len(lanes) > 1 else []

    def step(self, sents, rows, branches=None, emitted_features=False, pass_features=False) -> PassResult:
        if self._on_torch:
            return self.fallback.step(sents, rows, branches, emitted_features, pass_features)
        if pass_features:
            raise ValueError("the native engine hands over the emitted tokens' features, not whole passes")
        r = self.rules
        emit, scores, n_match, done, kept = self.batch.step(
            sents, rows, self.max_len, r.min_len, r.unk_penalty, r.temperature, branches=branches,
            features=emitted_features, beta=self.beta, tau=self.tau, forced=r.forced)
        return PassResult(emit=emit, scores=scores, n_match=list(n_match), done=[bool(x) for x in done],
                          kept=list(kept), emitted_features=self.batch.features if emitted_features else None)
