// The whole draft -> verify -> accept loop of an autoregressive feature
// drafter (--decoding feature-ar: a block_nat --feature-ar decoder that reads
// the verifier's features) over one batch, in one call (fa_decode_feature):
// two decoders, the verifier's and the drafter's, each with its own state of
// the same sentences, and no return to Python between passes.  Each pass is a
// drafting pass (block_drafter.h, autoregressive) over the tokens emitted since
// the last one, then verify_pass (pass.h) over [last token, draft]; the drafts,
// their lengths and the counters are those of the generator's loop with
// drafters/feature_ar.py on the native engine, so the output and the
// statistics are the same.
#pragma once

#include <cstdint>

#include "decode_loop.h"
#include "decoder.h"

namespace fa {

// One batch's loop: inputs, then outputs (mirrored by FeatureLoopArgs in c_api.py).
//
// n sentences, none decoded yet, in both states (the drafter's begun from the
// verifier's encoder output).  The verifier's rows start from the token
// `first` (EOS, or a BOS); the drafter's row of a sentence is [bos, output]
// (bos with zero features, each output token with the verifier's features
// that chose it).  A pass drafts for every sentence still decoding, unless
// none may draft: sentence b may draft d_b = min(k, max_len - its length,
// max_draft (if >= 0), room - its length) tokens, and a pass drafts
// max_b d_b tokens for each and keeps d_b of them (at most up to an EOS, and
// with min_prob > 0 up to the first token below that probability under the
// drafter: DraftArgs) (max_len: rules.max_len).  The passes' rules and the
// outputs as CopyLoopArgs'.
struct FeatureLoopArgs {
  int32_t n;
  int32_t first, bos;
  int32_t k, max_draft, room;
  float min_prob;
  LoopRules rules;
  LoopOutput output;
};

// 0, or -1 (nothing decoded) if an argument does not fit the states (n, k,
// out_cap, a sentence already decoded) or the drafter does not read this
// verifier's features; a failed pass throws (as verify_pass and draft_pass do).
int decode_feature(Decoder& verifier, State& vs, Decoder& drafter, State& ds, const FeatureLoopArgs& a, LoopStats& stats);

}  // namespace fa
