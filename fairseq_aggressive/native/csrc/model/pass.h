// The verification pass: the decoder over [last token, draft(s)] for a batch
// of rows, greedy's choice at each position, exact acceptance, emission and
// the cache commit, in one call (fa_pass).
#pragma once

#include <cstdint>

#include "model/decoder.h"

namespace fa {

// One pass's inputs and outputs (mirrored by PassArgs in c_api.py).
//
// Row r: sentence sent[r], row_len[r] tokens (the last emitted token followed
// by the drafted tokens), rows concatenated in tokens.  Without n_branch a
// row's draft is one branch; with it, row r holds n_branch[r] drafts one after
// the other (their lengths in branch_len, all rows' concatenated), each a
// continuation of the last token (a tree row, see decoder_rows).
//
// Greedy's choice follows fairseq's rules (ScoreRules in pass.cpp): pad never,
// unk_penalty subtracted from unk, only EOS from output position max_len (or
// the row's row_max_len) on,
// no EOS before min_len; with has_forced, output position 0 takes only the
// token forced (transformers' forced_bos_token_id, fairseq's prefix token: its
// score is its log-probability); logits are divided by temperature first.  beta > 1
// accepts GAD++'s way (Xia et al. 2023): a drafted token passes if fewer than
// beta tokens score strictly higher than it and its score is within tau of
// the top one's (adjusted log-probabilities); else a drafted token passes when
// it is greedy's choice.
//
// Outputs per row: n_emit, n_match (accepted drafted tokens), done (EOS
// emitted), winner (the kept branch, if given); choice and score of the
// emitted tokens from the row's offset in the concatenation, and (if feats is
// given) the decoder features (C floats, after the last layer norm) each
// emitted token was chosen from, at the same offsets.
struct PassArgs {
  int32_t n;
  const int32_t* sent;
  const int32_t* row_len;
  const int32_t* tokens;
  const int32_t* n_branch;    // or null
  const int32_t* branch_len;  // with n_branch
  int32_t max_len, min_len;
  float unk_penalty, temperature;
  int32_t beta;
  float tau;
  int32_t* choice;
  float* score;
  int32_t* n_emit;
  int32_t* n_match;
  int32_t* done;
  int32_t* winner;  // or null
  float* feats;     // or null
  // per row, its own max_len (a running batch's rows each keep their
  // sentence's length limit); null: max_len for every row
  const int32_t* row_max_len;
  int32_t has_forced, forced;  // 1, token: output position 0 is that token (0: no rule)
  int32_t scores;              // which emitted tokens get a score (kScoresAll, ...); the others NaN
  int64_t* lse_ns;             // or null: the nanoseconds the scores' log-normalisers took, added
};

// PassArgs::scores: every emitted token's; each row's last emitted token's
// only, a confidence for a draft-length policy (Acceptance::confidence), its
// normaliser summed with a coarse exp (logsumexp_coarse: several times
// cheaper, the log-probability at most 0.06 low); none.  A score needs a
// log-normaliser over the vocabulary; the choices never do.
constexpr int32_t kScoresAll = 0, kScoresLast = 1, kScoresNone = 2;

// 0, or -1 (nothing changed) if a row does not fit its sentence's cache, its
// branches do not add up to it, or a forced token is outside the vocabulary
// (or comes with a shortlist).
int verify_pass(Decoder& m, State& st, const PassArgs& a);

}  // namespace fa
