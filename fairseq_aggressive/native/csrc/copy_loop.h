// The whole draft -> verify -> accept loop of source-copy drafting (IAD with
// one draft per pass, Sun et al. 2021) and of greedy search (drafts of length
// 0) over one encoded batch, in one call (fa_decode_copy): no return to Python
// between passes.  Each pass is verify_pass (pass.h); the drafts are those of
// drafters/input_copy.py with branches = 1, so the output, the statistics and
// what the drafter learns are the same as that drafter's in the generator's loop.
#pragma once

#include <cstdint>

#include "decode_loop.h"
#include "decoder.h"

namespace fa {

// One batch's loop: inputs, then outputs (mirrored by CopyLoopArgs in c_api.py).
//
// Sentence b of the state (n: all of them, none decoded yet): its copy source,
// src_len[b] tokens of src (the sentences' sources in target ids, padding
// removed, concatenated in order); the loop starts
// from the token `first` (EOS, or a BOS).  A draft is the source from the
// copy position on, at most max_draft tokens (-1: no cap; 0: greedy search)
// and at most the tokens left before max_len; after a rejection the copy position is found again right
// after the unique occurrence in the source of the output's shortest suffix of
// ngram_min .. ngram_max tokens that occurs once (no draft while there is none).
// The passes' score rules and acceptance are `rules`; the outputs go to `output`
// (decode_loop.h).
struct CopyLoopArgs {
  int32_t n;
  const int32_t* src;
  const int32_t* src_len;
  int32_t first;
  int32_t max_draft, ngram_min, ngram_max;
  // 0: every draft verified as made (up to max_draft); 1: each pass keeps the
  // lengths (up to max_draft) the decoder's draft-length policy chooses
  // (draft_lengths.h), the same output
  int32_t budget;
  LoopRules rules;
  LoopOutput output;
};

// Counters of one loop (mirrored by CopyLoopStats in c_api.py): the loop's
// (decode_loop.h), then the drafter's rates (input_copy.py), for the passes
// after which a sentence went on (update() is not called on a finished
// sentence): per kind of draft (copy: continuing a copy; sync: the first after
// re-anchoring) the drafts verified and those whose first token was accepted,
// and over the drafts whose first token was accepted, the tokens after an
// accepted one that could have been accepted and those that were.
struct CopyLoopStats {
  LoopStats loop;
  int64_t copy_trials, copy_hits, sync_trials, sync_hits;
  int64_t cont_trials, cont_hits;
};

// 0, or -1 (nothing decoded) if an argument does not fit the state (n, a
// source length, out_cap, the draft settings, a sentence already decoded); a
// failed pass throws (as verify_pass does).
int decode_copy(Decoder& m, State& st, const CopyLoopArgs& a, CopyLoopStats& stats);

}  // namespace fa
