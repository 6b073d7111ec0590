// fairseq's adjustments of a position's output scores and greedy's choice
// under them (the verification pass's, pass.cpp)
#pragma once

#include <limits>

#include "cpu/ops.h"

namespace fa {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fairseq's adjustments of the output scores at an output position: pad is
// never chosen, unk pays unk_penalty, from max_len on only EOS remains, before
// min_len EOS is excluded; at output position 0 only the forced token remains
// where one is (fairseq's prefix token takes the place of its min_len rule
// there).  Columns of the special symbols are their ids.
struct ScoreRules {
  int pad, unk, eos, max_len, min_len;
  float unk_penalty;
  int forced;  // the column output position 0 must take, or -1

  // the adjusted score of column v of the logits lg at output position out_pos
  float adjusted(const float* lg, int v, int out_pos) const {
    if (out_pos == 0 && forced >= 0 && out_pos < max_len) {
      if (v != forced) return kNegInf;
      return v == unk ? lg[v] - unk_penalty : lg[v];
    }
    if (v == pad || (out_pos >= max_len && v != eos) || (out_pos < min_len && v == eos)) return kNegInf;
    return v == unk ? lg[v] - unk_penalty : lg[v];
  }

  // greedy's choice among the W columns of lg: the first maximum of the
  // adjusted scores.  Below max_len only the special columns differ from the
  // logits, so they are adjusted in place for the argmax and restored.
  int choose(float* lg, int W, int out_pos) const {
    if (out_pos >= max_len) return eos;  // every other column is excluded
    if (out_pos == 0 && forced >= 0) return forced;
    const int special[3] = {pad, unk, eos};
    float saved[3], adj[3];
    for (int i = 0; i < 3; ++i) {
      saved[i] = lg[special[i]];
      adj[i] = adjusted(lg, special[i], out_pos);
    }
    for (int i = 0; i < 3; ++i) lg[special[i]] = adj[i];
    const int u = argmax_first(lg, W);  // columns ascend by id: ties go to the lowest id
    for (int i = 2; i >= 0; --i) lg[special[i]] = saved[i];
    return u;
  }
};

}  // namespace fa
