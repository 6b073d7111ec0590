// The engine's counters of decoding: one record per running batch
// (RunStats), which the generator's statistics, the benchmark and the
// server's metrics all read.
#pragma once

#include <cstdint>

namespace fa {

// Passes and drafts (mirrored by LoopStats in c_api.py).  Per draft position
// i < kLoopPositions (the last slot counts every later one): the passes whose
// draft had a position i and those whose drafted token i was accepted.
constexpr int kLoopPositions = 32;
struct LoopStats {
  int64_t passes;           // decoder invocations
  int64_t sentence_passes;  // sum over sentences of the passes they took part in
  int64_t drafted, accepted;
  int64_t draft_ns;         // time spent making drafts
  int64_t position_drafted[kLoopPositions], position_accepted[kLoopPositions];

  // one sentence's pass: `drafted` tokens verified, the first `accepted` of them accepted
  void count(int drafted, int accepted);
};

// What source-copy drafts learnt (input_copy.py's rates), for the passes
// after which a sentence went on: per kind of draft (copy: continuing a copy;
// sync: the first after re-anchoring) the drafts verified and those whose
// first token was accepted, and over the drafts whose first token was
// accepted, the tokens after an accepted one that could have been accepted
// and those that were (mirrored by CopyRates in c_api.py)
struct CopyRates {
  int64_t copy_trials, copy_hits, sync_trials, sync_hits;
  int64_t cont_trials, cont_hits;
};

// Counters of a running batch since it was made (mirrored by RunStats in c_api.py)
constexpr int kRunRowsHist = 65;  // passes by their rows; the last slot counts 64 rows or more
struct RunStats {
  LoopStats loop;
  int64_t emitted;       // tokens emitted
  int64_t joined, left;  // rows
  int64_t dropped;       // rows that left before they finished (drop)
  int64_t pass_rows[kRunRowsHist];
  CopyRates copy;
};

}  // namespace fa
