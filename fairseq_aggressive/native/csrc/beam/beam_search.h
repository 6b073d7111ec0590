// Beam search in the engine (fa_decode_beam): fairseq's SequenceGenerator with
// BeamSearch, step for step, over a batch encoded once.
#pragma once

#include <cstdint>

#include "model/decoder.h"

namespace fa {

// One call's settings and outputs (mirrored by BeamArgs in c_api.py).
//
// The rules are fairseq's (sequence_generator.py, search.py): every
// hypothesis starts from `first` (EOS); at step t its log-probabilities (after
// the temperature) exclude pad, pay unk_penalty on unk, exclude EOS before
// min_len and everything but EOS from max_len on, and exclude a token that
// would repeat an n-gram of no_repeat_ngram tokens of the hypothesis (0: off).
// Each sentence's 2 x beam best continuations over its beam hypotheses (step
// 0: over the first) are its candidates, best first; an EOS among the first
// beam of them ends a hypothesis (its score divided by (t + 1)^len_penalty
// when normalize), and the sentence is done once beam hypotheses ended or at
// max_len; the first beam candidates that are not EOS go on (with fairseq's
// rule for the hypotheses it then ignores).  Ties between equal scores go to
// the lower hypothesis, then the lower token id.
//
// Outputs, per sentence b, its nbest ended hypotheses, best first (by score,
// the earlier ended first among equals), at row b * nbest + i: n_out (tokens,
// EOS included), tokens and positional scores (max_len + 1 per row), score.
//
// Drafting (src given; null: none) changes how the logits are computed, never
// what they are: sentence b's copy source is src_len[b] tokens of src (target
// ids, concatenated in order).  Each step, the hypotheses without features
// for it get one decoder pass together, each over its last token and, for the
// first draft_hyps hypotheses of a beam, its draft: the source from where its
// tokens follow the copy (found again after the unique occurrence of its
// shortest suffix of ngram_min .. ngram_max tokens that occurs once where they
// do not), at most max_draft tokens, none from an EOS on.  A child that
// extends its parent by the drafted token reads that position's features at
// the next step: the features of exactly its tokens at exactly its positions,
// over a cache that holds exactly its earlier positions, so its logits are the
// ones a pass of its own would give, and every choice made from them is
// plain beam search's (docs/how-it-works.md, "Drafted beam search").
struct BeamArgs {
  int32_t beam, nbest;
  int32_t first, max_len, min_len;
  float unk_penalty, temperature, len_penalty;
  int32_t normalize, no_repeat_ngram;
  int32_t* n_out;
  int32_t* tokens;
  float* positional;
  float* score;
  const int32_t* src;  // or null
  const int32_t* src_len;
  int32_t max_draft, ngram_min, ngram_max, draft_hyps;
};

// What a search did (mirrored by BeamCounts in c_api.py): steps (one per
// sentence and step), of these the ones drafts served whole (no hypothesis of
// the sentence in a pass), hypotheses read (their logits projected and
// scanned), of these the ones a draft served, decoder passes and the row
// positions they computed.
struct BeamCounts {
  int64_t steps, replayed, reads, drafted, passes, positions;
};

// 0, or -1 (nothing decoded) if an argument does not fit (beam, nbest, the
// lengths, the first token, the vocabulary, the target positions, the draft
// settings with a source; a state with a shortlist or already decoded from).
// The state's own caches are not used: the hypotheses have theirs, and a
// second search of the same state gives the same.  The engine's failures throw.
int decode_beam(Decoder& m, State& st, const BeamArgs& a, BeamCounts* counts = nullptr);

}  // namespace fa
