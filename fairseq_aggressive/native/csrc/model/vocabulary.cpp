// The output projection and the vocabulary shortlist: a sentence's output
// columns, their tokens, and its logits (decoder.h).
#include <algorithm>
#include <vector>

#include "model/decoder.h"

namespace fa {

int columns(const Decoder& m, const State& st, const Sentence& s) {
  return st.shortlist ? m.sl_n + (int)s.sl_ids.size() : m.cfg.tgt_vocab;
}

int token_of_column(const Decoder& m, const State& st, const Sentence& s, int u) {
  return (st.shortlist && u >= m.sl_n) ? s.sl_ids[u - m.sl_n] : u;
}

int column_of(const Decoder& m, const State& st, const Sentence& s, int tok) {
  if (tok < 0 || tok >= m.cfg.tgt_vocab) return -1;
  if (!st.shortlist || tok < m.sl_n) return tok;
  auto it = std::lower_bound(s.sl_ids.begin(), s.sl_ids.end(), tok);
  return it != s.sl_ids.end() && *it == tok ? m.sl_n + (int)(it - s.sl_ids.begin()) : -1;
}

// A row's logits with a shortlist: the common rows, then its sentence's own rows
void project(Decoder& m, const State& st, const float* h, int M, const int32_t* sent_of, float* out) {
  const int C = m.cfg.C, V = m.cfg.tgt_vocab;
  if (!st.shortlist) {
    linear(m.pool, m.w.proj, h, C, M, out, V);
    return;
  }
  linear(m.pool, m.sl_common, h, C, M, out, V);
  for (int k0 = 0; k0 < M;) {  // runs of rows of one sentence
    int k1 = k0;
    while (k1 < M && sent_of[k1] == sent_of[k0]) ++k1;
    const Sentence& s = st.sents[sent_of[k0]];
    if (!s.sl_ids.empty())
      linear(m.pool, s.sl_extra, h + (size_t)k0 * C, C, k1 - k0, out + (size_t)k0 * V + m.sl_n, V);
    k0 = k1;
  }
}

int set_common_shortlist(Decoder& m, int n) {
  if (n == 0) {
    m.sl_n = 0;
    m.sl_common = Linear();
    return 0;
  }
  const int V = m.cfg.tgt_vocab;
  if (n < 0 || n > V || n <= std::max(m.cfg.pad, std::max(m.cfg.unk, m.cfg.eos))) return -1;
  if (n == m.sl_n) return 0;
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  gather_rows(m.w.proj, ids.data(), n, m.sl_common);
  m.sl_n = n;
  return 0;
}

int set_sentence_shortlist(Decoder& m, State& st, int b, int n, const int32_t* ids) {
  if (m.sl_n == 0 || b < 0 || b >= (int)st.sents.size() || n < 0) return -1;
  for (int i = 0; i < n; ++i)
    if (ids[i] < m.sl_n || ids[i] >= m.cfg.tgt_vocab || (i > 0 && ids[i] <= ids[i - 1])) return -1;
  Sentence& s = st.sents[b];
  s.sl_ids.assign(ids, ids + n);
  if (n > 0) gather_rows(m.w.proj, ids, n, s.sl_extra);
  st.shortlist = true;
  return 0;
}

}  // namespace fa
