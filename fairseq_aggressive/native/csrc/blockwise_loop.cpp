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

int heads_pass(Model& m, State& st, int n, const int32_t* sent, const float* x, int32_t* out) {
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

int decode_blockwise(Model& m, State& st, const BlockwiseLoopArgs& a, LoopStats& stats) {
  const int B = a.n, H = m.w.n_heads, C = m.cfg.C;
  if (H == 0 || B != (int)st.sents.size() || a.out_cap < a.max_len + 1) return -1;
  for (int b = 0; b < B; ++b)
    if (st.sents[b].len != 0) return -1;
  LoopOutputs out(B);
  std::vector<int32_t> last(B, a.first), active(B);
  for (int b = 0; b < B; ++b) active[b] = b, a.passes[b] = 0;
  std::vector<std::vector<int32_t>> block(B);  // each sentence's proposal for the next pass

  std::vector<int32_t> row_len, tokens, n_emit, n_match, done, choice, proposed;
  std::vector<float> score, feats, at_last;
  PassArgs p = pass_settings(a);
  using Clock = std::chrono::steady_clock;
  while (!active.empty()) {
    const int n = (int)active.size();
    const auto t0 = Clock::now();
    row_len.assign(n, 1);
    tokens.clear();
    for (int i = 0; i < n; ++i) {
      const int b = active[i];
      int cap = a.max_len - out.length(b);
      if (a.max_draft >= 0) cap = std::min(cap, a.max_draft);
      const int L = std::max(0, std::min(cap, (int)block[b].size()));
      tokens.push_back(last[b]);
      tokens.insert(tokens.end(), block[b].begin(), block[b].begin() + L);
      row_len[i] += L;
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();

    const size_t total = tokens.size();
    choice.resize(total);
    score.resize(total);
    feats.resize(total * C);
    n_emit.resize(n);
    n_match.resize(n);
    done.resize(n);
    p.n = n;
    p.sent = active.data();
    p.row_len = row_len.data();
    p.tokens = tokens.data();
    p.choice = choice.data();
    p.score = score.data();
    p.n_emit = n_emit.data();
    p.n_match = n_match.data();
    p.done = done.data();
    p.feats = feats.data();
    if (verify_pass(m, st, p) != 0) throw std::logic_error("a draft does not fit its sentence's cache");
    stats.passes += 1;
    stats.sentence_passes += n;

    const auto t1 = Clock::now();
    int kept = 0, o = 0;
    at_last.clear();
    for (int i = 0; i < n; o += row_len[i++]) {
      const int b = active[i];
      a.passes[b] += 1;
      stats.count(row_len[i] - 1, n_match[i]);
      out.emit(b, choice.data() + o, score.data() + o, n_emit[i]);
      if (done[i]) continue;
      active[kept++] = b;
      last[b] = out.tokens(b).back();
      const float* f = feats.data() + (size_t)(o + n_emit[i] - 1) * C;  // what chose the last emitted token
      at_last.insert(at_last.end(), f, f + C);
    }
    active.resize(kept);
    if (kept > 0) {
      proposed.resize((size_t)kept * H);
      heads_pass(m, st, kept, active.data(), at_last.data(), proposed.data());
      for (int i = 0; i < kept; ++i)
        block[active[i]].assign(proposed.begin() + (size_t)i * H, proposed.begin() + (size_t)(i + 1) * H);
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t1).count();
  }
  out.write(a.out_cap, a.out_tokens, a.out_scores, a.out_len);
  return 0;
}

}  // namespace fa
