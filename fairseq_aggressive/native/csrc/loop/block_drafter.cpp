// The block drafter's pass (see block_drafter.h).
#include "loop/block_drafter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/ops.h"

namespace fa {

void choose_rows(Decoder& m, State& st, const float* h, int n, const int32_t* sent_of, int32_t* out, int stride) {
  const int V = m.cfg.tgt_vocab;
  ensure(m.logits, (size_t)n * V);
  project(m, st, h, n, sent_of, m.logits.data());
  for (int r = 0; r < n; ++r) {
    const Sentence& s = st.sents[sent_of[r]];
    float* lg = m.logits.data() + (size_t)r * V;
    lg[m.cfg.pad] = -std::numeric_limits<float>::infinity();
    out[(size_t)r * stride] = token_of_column(m, st, s, argmax_first(lg, columns(m, st, s)));
  }
}

namespace {

// The probability of the argmax `best` of logits lg[0..W) under their softmax.
float top_probability(const float* lg, int W, int best) { return std::exp(lg[best] - logsumexp(lg, W)); }

// A --feature-ar drafter's pass (DraftArgs.autoregressive)
int ar_draft_pass(Decoder& m, State& st, const DraftArgs& a) {
  const int n = a.n, k = a.k, C = m.cfg.C, FC = m.w.feat_proj.K;  // FC: the verifier's feature width
  // its own output (C wide) stands in for the verifier's features from the second step on
  const Linear& own = m.w.own_feat_proj.N != 0 ? m.w.own_feat_proj : m.w.feat_proj;
  if (a.feats == nullptr || !a.causal || m.w.feat_proj.N != C || own.N != C || own.K != C || k < 1) return -1;
  std::vector<int> off(n + 1, 0), base(n);
  int max_keys = 0;
  for (int r = 0; r < n; ++r) {
    const Sentence& s = st.sents[a.sent[r]];
    if (a.row_len[r] < 1 || s.len + a.row_len[r] + k > s.cap) return -1;
    off[r + 1] = off[r] + a.row_len[r];
    max_keys = std::max(max_keys, std::max(s.len + a.row_len[r] + k, s.src_len));
  }
  // the new prefix tokens, each with the projection of the verifier's features that chose it
  std::vector<float> add((size_t)off[n] * C), h((size_t)n * C);
  linear(m.pool, m.w.feat_proj, a.feats, FC, off[n], add.data(), C);
  decoder_rows(m, st, n, a.sent, a.row_len, a.tokens, off, max_keys, nullptr, nullptr, add.data());
  for (int r = 0; r < n; ++r) {
    Sentence& s = st.sents[a.sent[r]];
    std::copy(m.x.data() + (size_t)(off[r + 1] - 1) * C, m.x.data() + (size_t)off[r + 1] * C, h.data() + (size_t)r * C);
    s.len += a.row_len[r];
    base[r] = s.len;
  }
  // k drafted tokens, one row position per sentence still drafting and step; act[i]: the row of
  // h's i-th row (rows that ended are dropped from h, act and the step's arguments)
  std::vector<int> one(n, 1), step_off(n + 1);
  for (int r = 0; r <= n; ++r) step_off[r] = r;
  std::vector<int32_t> act(n), act_sent(n), toks(n), chosen(n);
  for (int r = 0; r < n; ++r) act[r] = r, act_sent[r] = a.sent[r];
  std::vector<int32_t> lens(n, k);
  const int V = m.cfg.tgt_vocab;
  for (int j = 0;; ++j) {
    const int na = (int)act.size();
    choose_rows(m, st, h.data(), na, act_sent.data(), chosen.data(), 1);
    int kept = 0;
    for (int i = 0; i < na; ++i) {
      const int r = act[i];
      a.out[(size_t)r * k + j] = chosen[i];
      bool ends = chosen[i] == m.cfg.eos;
      if (!ends && a.min_prob > 0.f) {
        const Sentence& s = st.sents[a.sent[r]];
        const int W = columns(m, st, s);
        const float* lg = m.logits.data() + (size_t)i * V;  // choose_rows' logits of this row
        ends = top_probability(lg, W, argmax_first(lg, W)) < a.min_prob;
      }
      if (ends || j + 1 == k) {
        lens[r] = j + 1;
        continue;
      }
      if (kept != i) std::copy(h.data() + (size_t)i * C, h.data() + (size_t)(i + 1) * C, h.data() + (size_t)kept * C);
      act[kept] = r, act_sent[kept] = a.sent[r], toks[kept] = chosen[i];
      ++kept;
    }
    act.resize(kept), act_sent.resize(kept);
    if (kept == 0) break;
    add.resize((size_t)kept * C);
    linear(m.pool, own, h.data(), C, kept, add.data(), C);
    decoder_rows(m, st, kept, act_sent.data(), one.data(), toks.data(), step_off, max_keys, nullptr, nullptr,
                 add.data());
    std::copy(m.x.data(), m.x.data() + (size_t)kept * C, h.data());
    for (int i = 0; i < kept; ++i) st.sents[act_sent[i]].len += 1;
  }
  for (int r = 0; r < n; ++r) st.sents[a.sent[r]].len = base[r];  // the drafts leave the cache
  if (a.lens != nullptr) std::copy(lens.begin(), lens.end(), a.lens);
  return 0;
}

}  // namespace

int draft_pass(Decoder& m, State& st, const DraftArgs& a) {
  if (a.autoregressive) return ar_draft_pass(m, st, a);
  const int n = a.n, k = a.k;
  const bool causal = a.causal != 0;
  const int32_t *sent = a.sent, *row_len = a.row_len, *tokens = a.tokens;
  int32_t* out = a.out;
  const float* feats = a.feats;
  const int C = m.cfg.C, V = m.cfg.tgt_vocab;
  if (m.w.mask_embed.empty() || k < 1 || (feats != nullptr && m.w.feat_proj.N == 0)) return -1;
  std::vector<int> off(n + 1, 0);
  std::vector<int32_t> full(n), bidir(n);
  int max_keys = 0;
  for (int r = 0; r < n; ++r) {
    Sentence& s = st.sents[sent[r]];
    if (!causal) s.len = 0;
    full[r] = row_len[r] + k;
    bidir[r] = causal ? row_len[r] : 0;
    if (s.len + full[r] > s.cap) return -1;
    off[r + 1] = off[r] + full[r];
    max_keys = std::max(max_keys, std::max(s.len + full[r], s.src_len));
  }
  std::vector<int32_t> toks(off[n], -1);
  for (int r = 0, j = 0; r < n; ++r)
    for (int t = 0; t < row_len[r]; ++t) toks[off[r] + t] = tokens[j++];
  std::vector<float> adds;
  if (feats != nullptr) {  // the projected features at the prefix rows, zeros at the slots
    int sent_tokens = 0;
    for (int r = 0; r < n; ++r) sent_tokens += row_len[r];
    std::vector<float> proj((size_t)sent_tokens * C);
    linear(m.pool, m.w.feat_proj, feats, m.w.feat_proj.K, sent_tokens, proj.data(), C);
    adds.assign((size_t)off[n] * C, 0.f);
    for (int r = 0, j = 0; r < n; j += row_len[r], ++r)
      std::copy(proj.data() + (size_t)j * C, proj.data() + (size_t)(j + row_len[r]) * C,
                adds.data() + (size_t)off[r] * C);
  }
  decoder_rows(m, st, n, sent, full.data(), toks.data(), off, max_keys, bidir.data(), nullptr,
               feats != nullptr ? adds.data() : nullptr);
  // the slots' features, k rows per row, then their logits
  const float* x = m.x.data();
  ensure(m.h, (size_t)n * k * C);
  std::vector<int32_t> sent_of((size_t)n * k);
  for (int r = 0; r < n; ++r) {
    std::copy(x + (size_t)(off[r] + row_len[r]) * C, x + (size_t)off[r + 1] * C, m.h.data() + (size_t)r * k * C);
    std::fill(sent_of.begin() + (size_t)r * k, sent_of.begin() + (size_t)(r + 1) * k, sent[r]);
  }
  ensure(m.logits, (size_t)n * k * V);
  project(m, st, m.h.data(), n * k, sent_of.data(), m.logits.data());
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < n; ++r) {
    const Sentence& s = st.sents[sent[r]];
    const int W = columns(m, st, s);
    for (int i = r * k; i < (r + 1) * k; ++i) {
      float* lg = m.logits.data() + (size_t)i * V;
      lg[m.cfg.pad] = ninf;
      out[i] = token_of_column(m, st, s, argmax_first(lg, W));
    }
  }
  for (int r = 0; r < n; ++r) {
    Sentence& s = st.sents[sent[r]];
    s.len = causal ? s.len + row_len[r] : 0;
  }
  return 0;
}

}  // namespace fa
