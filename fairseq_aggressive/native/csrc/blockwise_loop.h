// Blockwise parallel decoding (Stern et al. 2018) in the engine: the proposal
// heads of a transformer_blockwise model (heads_pass), and its whole draft ->
// verify -> accept loop over one batch in one call (fa_decode_blockwise).
// Predict and verify are merged: a pass emits tokens, and the heads read the
// features that chose its last emitted token to propose the next block, so
// each iteration is one pass of the model plus the heads on one row per
// sentence.  The drafts and counters are those of the generator's loop with
// drafters/blockwise_heads.py on the native verifier (whose heads are these).
#pragma once

#include <cstdint>

#include "decode_loop.h"
#include "decoder.h"

namespace fa {

// The heads' proposals for n sentences sent[r] from their feature rows x (C
// floats each): m.n_heads tokens each, at out[r * n_heads + j] (each the argmax
// of its logits over the sentence's columns, pad excluded).  0, or -1 if the
// model has no heads.
int heads_pass(Decoder& m, State& st, int n, const int32_t* sent, const float* x, int32_t* out);

// One batch's loop (mirrored by BlockwiseLoopArgs in c_api.py): n sentences,
// none decoded yet; rows start from the token `first`; the first pass drafts
// nothing, each later one the heads' block after the last pass, at most
// max_draft tokens (-1: no cap) and at most the tokens left before
// rules.max_len.  The passes' rules and the outputs as CopyLoopArgs'.
struct BlockwiseLoopArgs {
  int32_t n;
  int32_t first, max_draft;
  LoopRules rules;
  LoopOutput output;
};

// 0, or -1 (nothing decoded) if an argument does not fit the state or the model
// has no heads; a failed pass throws.
int decode_blockwise(Decoder& m, State& st, const BlockwiseLoopArgs& a, LoopStats& stats);

}  // namespace fa
