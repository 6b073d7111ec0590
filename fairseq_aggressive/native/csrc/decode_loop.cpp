// What the engine's decoding loops share (see decode_loop.h).
#include "decode_loop.h"

#include <algorithm>
#include <stdexcept>

namespace fa {

void LoopStats::count(int n_drafted, int n_accepted) {
  drafted += n_drafted;
  accepted += n_accepted;
  for (int j = 0; j < n_drafted; ++j) {
    const int slot = std::min(j, kLoopPositions - 1);
    position_drafted[slot] += 1;
    position_accepted[slot] += j < n_accepted;
  }
}

void LoopOutputs::write(int out_cap, int32_t* out_tokens, float* out_scores, int32_t* out_len) const {
  for (size_t b = 0; b < tokens_.size(); ++b) {
    if ((int)tokens_[b].size() > out_cap) throw std::logic_error("more tokens than out_cap");  // at most max_len + 1
    out_len[b] = (int)tokens_[b].size();
    std::copy(tokens_[b].begin(), tokens_[b].end(), out_tokens + b * out_cap);
    std::copy(scores_[b].begin(), scores_[b].end(), out_scores + b * out_cap);
  }
}

}  // namespace fa
