// A block_nat drafter (GAD) in the engine: its decoder over [prefix, k slots]
// where the slots (target id -1) read the mask embedding and attend to the
// whole row.  With a causal prefix (--block-causal-prefix) the prefix's keys
// and values stay cached across passes and a pass runs only the new prefix
// tokens and the slots; without, every pass runs the whole row bidirectionally
// from an empty cache.  Proposals, not verification: float rounding may make
// them differ from the torch drafter's.
#pragma once

#include <cstdint>

#include "model/decoder.h"

namespace fa {

// One drafting pass's inputs and outputs (mirrored by DraftArgs in c_api.py).
//
// n rows: sentence sent[r]; row_len[r] prefix tokens not yet in its cache
// (rows concatenated in tokens), then k slots.  causal: keep the prefix tokens
// in the cache (the next pass sends only newer ones); else the row is the
// whole prefix, bidirectional, and nothing stays.  out[r * k + i]: the argmax
// of slot i (padding excluded, the first maximum).  feats (or null), for a
// --verifier-features drafter: per prefix token sent (rows concatenated) the
// verifier's features that chose it (m.feat_proj.K floats, zeros for BOS);
// their projection is added to the token's input before the embedding layer
// norm; the slots get none.
//
// autoregressive (a --feature-ar drafter; causal, feats given): no slots; the
// prefix tokens go into the cache, then k tokens are chosen one after the
// other, each from the drafter's output at the position before it, and each
// chosen token is read with the projection of that output in place of the
// verifier's features (own_feat_proj where the drafter is narrower than the
// verifier, else feat_proj); the drafted tokens leave the cache afterwards.
// A row's draft ends early at its first EOS and, with min_prob > 0, at its first
// token whose probability under the drafter (softmax over the row's columns) is
// below min_prob (that token kept); lens[r] (or null) gets each row's length
// (k where neither happened), out[r * k + i] for i >= lens[r] is undefined.
// Rows that ended leave the later steps (no work for them).
struct DraftArgs {
  int32_t n;
  const int32_t* sent;
  const int32_t* row_len;
  const int32_t* tokens;
  int32_t k;
  int32_t causal;
  int32_t* out;
  const float* feats;  // or null
  int32_t autoregressive;
  float min_prob;  // autoregressive only: 0 = off
  int32_t* lens;   // autoregressive only: or null
};

// The arguments of a --feature-ar drafter's pass (autoregressive, causal): n
// rows of sentences sent, row_len[r] new prefix tokens each (tokens, with the
// verifier's features feats that chose them), k tokens drafted into out (each
// row's length into lens), ending early below min_prob
inline DraftArgs feature_draft_args(int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
                                    const float* feats, int k, float min_prob, int32_t* out, int32_t* lens) {
  DraftArgs d{};
  d.n = n;
  d.sent = sent;
  d.row_len = row_len;
  d.tokens = tokens;
  d.k = k;
  d.causal = 1;
  d.autoregressive = 1;
  d.out = out;
  d.feats = feats;
  d.min_prob = min_prob;
  d.lens = lens;
  return d;
}

// The drafter's token for each of n feature rows h (C floats each): the argmax
// of its logits over sentence sent_of[r]'s columns, pad excluded, the first
// maximum; into out[r * stride].
void choose_rows(Decoder& m, State& st, const float* h, int n, const int32_t* sent_of, int32_t* out, int stride);

// 0, or -1 if a row does not fit (or the drafter's mask embedding or feature
// projection is missing, or an autoregressive pass lacks features or a causal
// prefix, or its projection of its own output is not C x C).
int draft_pass(Decoder& m, State& st, const DraftArgs& a);

}  // namespace fa
