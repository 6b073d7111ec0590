"""The docs' tables made from stored results (:mod:`fairseq_aggressive.bench.results`): each
maker takes the stored results a block's glob selects and returns the table's lines; a block
names its maker by its key in :data:`TABLES`."""
from typing import Callable, Dict, List

from .decoding import (at_a_glance, beam_vs_ct2, bench, drafted_vs_greedy, drafters, edit_spans, gad_limits,
                       http_overhead, hub_latency, serving, streams_at_a_glance, targets, torch_pass)
from .engine import (exactness, loop_in_engine, pass_cost, pass_rows, pass_stages, pass_vs_step, side_by_side,
                     stage_profile, vs_ct2, workers)

TABLES: Dict[str, Callable[[List[Dict]], List[str]]] = {
    "at-a-glance": at_a_glance,
    "streams-at-a-glance": streams_at_a_glance,
    "bench": bench,
    "drafted-vs-greedy": drafted_vs_greedy,
    "serving": serving,
    "targets": targets,
    "drafters": drafters,
    "edit-spans": edit_spans,
    "beam-vs-ct2": beam_vs_ct2,
    "vs-ct2": vs_ct2,
    "loop-in-engine": loop_in_engine,
    "pass-vs-step": pass_vs_step,
    "exactness": exactness,
    "workers": workers,
    "side-by-side": side_by_side,
    "pass-cost": pass_cost,
    "pass-stages": pass_stages,
    "pass-rows": pass_rows,
    "stage-profile": stage_profile,
    "torch-pass": torch_pass,
    "gad-limits": gad_limits,
    "hub-latency": hub_latency,
    "http-overhead": http_overhead,
}
