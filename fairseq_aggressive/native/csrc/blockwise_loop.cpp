// Blockwise parallel decoding in the engine (see blockwise_loop.h).
#include "blockwise_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "block_drafter.h"
#include "ops.h"
#include "pass.h"

namespace fa {

int heads_pass(Decoder& m, State& st, int n, const int32_t* sent, const float* x, int32_t* out) {
  const Linear &fc1 = m.w.heads_fc1, &fc2 = m.w.heads_fc2;
  const int H = m.w.n_heads, C = m.cfg.C, hidden = fc1.N;
  if (H == 0) return -1;
  std::vector<float> inner((size_t)n * hidden), heads((size_t)n * H * C);
  linear(m.pool, fc1, x, C, n, inner.data(), hidden);
  relu_rows(inner.data(), inner.size());
  linear(m.pool, fc2, inner.data(), hidden, n, heads.data(), H * C);
  std::vector<int32_t> sent_of((size_t)n * H);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < H; ++j) {
      add_rows(heads.data() + ((size_t)r * H + j) * C, x + (size_t)r * C, C);  // each head's residual
      sent_of[(size_t)r * H + j] = sent[r];
    }
  choose_rows(m, st, heads.data(), n * H, sent_of.data(), out, 1);
  return 0;
}

int decode_blockwise(Decoder& m, State& st, const BlockwiseLoopArgs& a, LoopStats& stats) {
  const int B = a.n, H = m.w.n_heads, max_len = a.rules.max_len;
  if (H == 0 || B != (int)st.sents.size() || a.output.out_cap < max_len + 1) return -1;
  for (int b = 0; b < B; ++b)
    if (st.sents[b].len != 0) return -1;
  LoopBatch batch(B, a.first, a.rules, a.output);
  std::vector<std::vector<int32_t>> block(B);  // each sentence's proposal for the next pass
  std::vector<int32_t> proposed;
  std::vector<float> at_last;
  using Clock = std::chrono::steady_clock;
  while (!batch.active().empty()) {
    const auto t0 = Clock::now();
    for (int b : batch.active()) {
      int cap = max_len - batch.outputs().length(b);
      if (a.max_draft >= 0) cap = std::min(cap, a.max_draft);
      batch.add_row(b, block[b].data(), std::max(0, std::min(cap, (int)block[b].size())));
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    batch.verify(m, st, stats, true);
    const auto t1 = Clock::now();
    at_last.clear();
    batch.settle(stats, [&](int, int, int o, int n_emit) {  // the features that chose the last emitted token
      at_last.insert(at_last.end(), batch.feats(o + n_emit - 1), batch.feats(o + n_emit));
    });
    const std::vector<int32_t>& active = batch.active();
    const int kept = (int)active.size();
    if (kept > 0) {
      proposed.resize((size_t)kept * H);
      heads_pass(m, st, kept, active.data(), at_last.data(), proposed.data());
      for (int i = 0; i < kept; ++i)
        block[active[i]].assign(proposed.begin() + (size_t)i * H, proposed.begin() + (size_t)(i + 1) * H);
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t1).count();
  }
  batch.finish();
  return 0;
}

}  // namespace fa
