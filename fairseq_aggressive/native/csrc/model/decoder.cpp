// The encoder, the decoder over rows of tokens on top of each sentence's
// cache, and the per-batch state they work on (the output projection and its
// shortlist: vocabulary.cpp).
#include "model/decoder.h"

#include <string>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <stdexcept>

#include "loop/draft_lengths.h"
#include "cpu/ops.h"
#include "model/stages.h"

namespace fa {

Decoder::Decoder(const Config& c) : cfg(c), shared(std::make_shared<Weights>(c)), w(*shared) {
  D = cfg.C / cfg.H;
  // fairseq: self.scaling = self.head_dim ** -0.5 (a Python float, rounded to fp32 in the product)
  scaling = (float)std::pow((double)D, -0.5);
}

Decoder::Decoder(ShareWeightsOf s)
    : cfg(s.other.cfg), D(s.other.D), scaling(s.other.scaling), shared(s.other.shared), w(*shared) {}

// ------------------------------------------------------------ computation
void ensure(LineVector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

namespace {

// the scratch buffers of a computation over M rows
void reserve_rows(Decoder& m, int M) {
  const int C = m.cfg.C;
  ensure(m.x, (size_t)M * C);
  ensure(m.h, (size_t)M * C);
  ensure(m.q, (size_t)M * C);
  ensure(m.kv, (size_t)M * 3 * C);
  ensure(m.a, (size_t)M * C);
  ensure(m.f, (size_t)M * m.cfg.F);
}

// f(r0, r1) over the rows [0, M) of `width` values each: split across the pool
// where the rows hold enough values to pay for waking it (an encoder's group of
// sentences, a pass of many rows), else on the calling thread.  Each row is
// computed alone, so the split never changes a value.
template <typename F>
void over_rows(Decoder& m, int M, int width, const F& f) {
  const int chunks = (m.pool.size() > 1 && (int64_t)M * width >= 32768) ? std::min(M, m.pool.size()) : 1;
  if (chunks == 1) return f(0, M);
  m.pool.run([&](int c) { f((int)((int64_t)M * c / chunks), (int)((int64_t)M * (c + 1) / chunks)); }, chunks);
}

// y = layer_norm(x) and x += y over M rows of C values (y may be x), as over_rows splits them
void norm_rows(Decoder& m, const float* x, float* y, int M, const Norm& ln) {
  const int C = m.cfg.C;
  over_rows(m, M, C, [&](int r0, int r1) {
    layer_norm_rows(x + (size_t)r0 * C, y + (size_t)r0 * C, r1 - r0, C, ln.w, ln.b, m.cfg.ln_eps);
  });
}
void add_to(Decoder& m, float* x, const float* y, int M) {
  const int C = m.cfg.C;
  over_rows(m, M, C, [&](int r0, int r1) { add_rows(x + (size_t)r0 * C, y + (size_t)r0 * C, (size_t)(r1 - r0) * C); });
}

// f(group, head, scratch) for every head of every group of rows [first[g],
// first[g + 1]) (a group: one sentence's rows, which read the same keys and
// values), split across the pool by (group, head) when there is enough work
// (the rows' queries over max_keys keys); scratch holds scratch_floats.  Only
// the order of the calls changes with the split: each call computes the same
// values.
void for_head_groups(Decoder& m, const std::vector<int>& first, int max_keys, size_t scratch_floats,
                     const std::function<void(int, int, float*)>& f) {
  const int G = (int)first.size() - 1, H = m.cfg.H, tasks = G * H, M = first[G];
  const int chunks = (m.pool.size() > 1 && (int64_t)M * max_keys * m.cfg.C >= 16384)
                         ? std::min(tasks, m.pool.size() * 2) : 1;
  ensure(m.att, (size_t)chunks * scratch_floats);
  float* base = m.att.data();
  m.pool.run(
      [&](int c) {
        const int t0 = (int)((int64_t)tasks * c / chunks), t1 = (int)((int64_t)tasks * (c + 1) / chunks);
        for (int t = t0; t < t1; ++t) f(t / H, t % H, base + c * scratch_floats);
      },
      chunks);
}

// f(row, head, scratch) for every head and every row of the groups of
// for_head_groups.  For each head a group's rows run one after another, so
// the head's keys and values, read from the cache for the group's first row,
// are still in L1 for the others (a row over all its heads, then the next
// row, read every row's keys from L2 or beyond again); scratch holds
// max_keys + 16 floats (attend's).
void for_heads(Decoder& m, const std::vector<int>& first, int max_keys,
               const std::function<void(int, int, float*)>& f) {
  for_head_groups(m, first, max_keys, (size_t)max_keys + 16, [&](int g, int hh, float* scratch) {
    for (int row = first[g]; row < first[g + 1]; ++row) f(row, hh, scratch);
  });
}

// The keys and values of layer l, head h of sentence s (cross: its encoder's)
// asked for ahead of use, into L2.  A pass's attention reads each row's once;
// beyond a few dozen rows they are gone from L2 by the next pass, and the row
// before asks for them (with pass.cpp's row groups, 1.01-1.02x at 128 rows, int8
// 9+3, 2-core Zen 4: docs/pass-cost.md).  A hint: no result depends on it.
void prefetch_kv(const Sentence& s, int l, int h, int H, int D, bool cross) {
  const size_t at = cross ? kv_at(l, h, 0, H, s.src_len, D) : kv_at(l, h, 0, H, s.cap, D);
  const char* k = reinterpret_cast<const char*>((cross ? s.enc_k : s.self_k).data() + at);
  const char* v = reinterpret_cast<const char*>((cross ? s.enc_v : s.self_v).data() + at);
  for (size_t b = 0; b < (size_t)(cross ? s.src_len : s.len) * D * sizeof(float); b += 64) {
    __builtin_prefetch(k + b, 0, 2);
    __builtin_prefetch(v + b, 0, 2);
  }
}

// embeddings of tokens at positions pos (table row index) into m.x, then the embedding layer norm
void embed(Decoder& m, const int32_t* tok, const int32_t* pos, int M, bool target, const float* add = nullptr) {
  const std::vector<float>& E = target ? m.w.tgt_embed : m.w.src_embed;
  const std::vector<float>& P = target ? m.w.tgt_pos : m.w.src_pos;
  embed_rows(m.x.data(), m.cfg.C, M, tok, pos, E.data(), P.empty() ? nullptr : P.data(),
             target ? m.cfg.dec_embed_scale : m.cfg.enc_embed_scale, target ? m.w.mask_embed.data() : nullptr, add);
  const Norm& ln = target ? m.w.dec_ln_embed : m.w.enc_ln_embed;
  if (ln.on) layer_norm_rows(m.x.data(), m.x.data(), M, m.cfg.C, ln.w, ln.b, m.cfg.ln_eps);
}

// the feed-forward block of a pre- or post-norm layer on the M rows of m.x
void ffn(Decoder& m, int M, const Linear& fc1, const Linear& fc2, const Norm& ln, bool pre) {
  const int C = m.cfg.C, F = m.cfg.F;
  float* x = m.x.data();
  const float* in = x;
  if (pre) {
    norm_rows(m, x, m.h.data(), M, ln);
    in = m.h.data();
  }
  linear(m.pool, fc1, in, C, M, m.f.data(), F);
  over_rows(m, M, F, [&](int r0, int r1) {
    float* f = m.f.data() + (size_t)r0 * F;
    const size_t n = (size_t)(r1 - r0) * F;
    (m.cfg.act == kGelu ? gelu_rows : m.cfg.act == kSwish ? swish_rows : relu_rows)(f, n);
  });
  linear(m.pool, fc2, m.f.data(), F, M, m.a.data(), C);
  add_to(m, x, m.a.data(), M);
  if (!pre) norm_rows(m, x, x, M, ln);
}

// A state's sentences from their encoder output x (the rows of the B sentences
// concatenated): the output kept (fa_encoder_out), encoder-attention keys and
// values of every decoder layer, empty self-attention caches of cap positions.
void init_state(Decoder& m, State& st, int B, const int32_t* src_len, const float* x, int cap) {
  const int C = m.cfg.C, E = m.cfg.enc_width(), H = m.cfg.H, D = m.D;
  int M = 0;
  std::vector<int> start(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    start[b + 1] = start[b] + src_len[b];
    M += src_len[b];
  }
  st.sents.resize(B);
  st.enc_out.assign(x, x + (size_t)M * E);
  const int nl = (int)m.w.dec.size();
  for (int b = 0; b < B; ++b) {
    Sentence& s = st.sents[b];
    s.src_len = src_len[b];
    s.cap = cap;
    s.enc_k.resize((size_t)nl * s.src_len * C);
    s.enc_v.resize((size_t)nl * s.src_len * C);
    s.self_k.resize((size_t)nl * cap * C);  // (unset: see CacheAligned)
    s.self_v.resize((size_t)nl * cap * C);
  }
  ensure(m.kv, (size_t)M * 3 * C);
  for (int l = 0; l < nl; ++l) {
    linear(m.pool, m.w.dec[l].ckv, st.enc_out.data(), E, M, m.kv.data(), 2 * C);
    for (int b = 0; b < B; ++b) {
      Sentence& s = st.sents[b];
      for (int t = 0; t < s.src_len; ++t) {
        const float* r = m.kv.data() + (size_t)(start[b] + t) * 2 * C;
        for (int hh = 0; hh < H; ++hh) {
          std::copy(r + hh * D, r + (hh + 1) * D, s.enc_k.begin() + kv_at(l, hh, t, H, s.src_len, D));
          std::copy(r + C + hh * D, r + C + (hh + 1) * D, s.enc_v.begin() + kv_at(l, hh, t, H, s.src_len, D));
        }
      }
    }
  }
}

}  // namespace

State* encode(Decoder& m, int B, const int32_t* tokens, const int32_t* src_len, int cap) {
  StageClock clock(Stage::kEncoder);
  const int C = m.cfg.C, H = m.cfg.H, D = m.D;
  if (!m.cfg.has_encoder())
    throw std::invalid_argument("this decoder has no encoder: it starts from another model's encoder output");
  State* st = new State();
  st->sents.resize(B);
  int M = 0, max_s = 0;
  for (int b = 0; b < B; ++b) {
    M += src_len[b];
    max_s = std::max(max_s, (int)src_len[b]);
  }
  reserve_rows(m, M);
  std::vector<int32_t> pos(M);
  std::vector<int> start(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    start[b + 1] = start[b] + src_len[b];
    for (int t = 0; t < src_len[b]; ++t) pos[start[b] + t] = t;
  }
  embed(m, tokens, pos.data(), M, false);
  const bool pre = m.cfg.enc_normalize_before;
  float* x = m.x.data();
  for (auto& L : m.w.enc) {
    const float* in = x;
    if (pre) {
      norm_rows(m, x, m.h.data(), M, L.ln_attn);
      in = m.h.data();
    }
    linear(m.pool, L.qkv, in, C, M, m.kv.data(), 3 * C);
    float* qkv = m.kv.data();
    // keys and values head-major (kv_at's layout, M positions) in m.h and m.a,
    // free until the output projection: each head's keys contiguous
    float* keys = m.h.data();
    float* vals = m.a.data();
    over_rows(m, M, 3 * C, [&](int r0, int r1) {
      for (int r = r0; r < r1; ++r) {
        float* q = qkv + (size_t)r * 3 * C;
        for (int c = 0; c < C; ++c) q[c] *= m.scaling;
        for (int hh = 0; hh < H; ++hh) {
          std::copy(q + C + hh * D, q + C + (hh + 1) * D, keys + kv_at(0, hh, r, H, M, D));
          std::copy(q + 2 * C + hh * D, q + 2 * C + (hh + 1) * D, vals + kv_at(0, hh, r, H, M, D));
        }
      }
    });
    // a sentence's positions all read its keys and values: its queries go through them together
    for_head_groups(m, start, max_s, (size_t)kAttendQueries * (max_s + 16), [&](int b, int hh, float* scratch) {
      const size_t at = kv_at(0, hh, start[b], H, M, D);
      attend_queries(qkv + (size_t)start[b] * 3 * C + hh * D, 3 * C, src_len[b], keys + at, vals + at, D, src_len[b], D,
                     m.q.data() + (size_t)start[b] * C + hh * D, C, scratch);
    });
    linear(m.pool, L.out, m.q.data(), C, M, m.a.data(), C);
    add_to(m, x, m.a.data(), M);
    if (!pre) norm_rows(m, x, x, M, L.ln_attn);
    ffn(m, M, L.fc1, L.fc2, L.ln_ffn, pre);
  }
  if (m.w.enc_final.on) norm_rows(m, x, x, M, m.w.enc_final);
  init_state(m, *st, B, src_len, x, cap);
  return st;
}

State* state_from_encoder_out(Decoder& m, int B, const float* enc_out, const int32_t* src_len, int cap) {
  State* st = new State();
  init_state(m, *st, B, src_len, enc_out, cap);
  return st;
}

void decoder_rows(Decoder& m, State& st, int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
                  const std::vector<int>& off, int max_keys, const int32_t* bidir_from, const int32_t* branch_start,
                  const float* add) {
  m.panels_backward = !m.panels_backward;  // this pass reads the weights in the other order (linear.h)
  set_panels_backward(m.panels_backward);
  const int C = m.cfg.C, H = m.cfg.H, D = m.D;
  auto keys = [&](int r, int t) {
    const int len = st.sents[sent[r]].len;
    if (branch_start != nullptr && t > 0) return len + 1;  // then the branch segment
    return (bidir_from != nullptr && t >= bidir_from[r]) ? len + row_len[r] : len + t + 1;
  };
  const int M = off[n];
  reserve_rows(m, M);
  std::vector<int32_t> pos(M);
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < row_len[r]; ++t) {
      const int depth = (branch_start != nullptr && t > 0) ? t - branch_start[off[r] + t] + 1 : t;
      pos[off[r] + t] = st.sents[sent[r]].len + depth;
    }
  {
    StageClock clock(Stage::kEmbed);
    embed(m, tokens, pos.data(), M, true, add);
  }
  const bool pre = m.cfg.dec_normalize_before;
  float* x = m.x.data();
  for (size_t l = 0; l < m.w.dec.size(); ++l) {
    const DecLayer& L = m.w.dec[l];
    // self-attention over the cache and the new positions (causal)
    std::optional<StageClock> clock(Stage::kSelfQKV);
    const float* in = x;
    if (pre) {
      norm_rows(m, x, m.h.data(), M, L.ln_self);
      in = m.h.data();
    }
    linear(m.pool, L.qkv, in, C, M, m.kv.data(), 3 * C);
    for (int r = 0; r < n; ++r) {
      Sentence& s = st.sents[sent[r]];
      for (int t = 0; t < row_len[r]; ++t) {
        const float* kvr = m.kv.data() + (size_t)(off[r] + t) * 3 * C;
        for (int hh = 0; hh < H; ++hh) {
          const size_t at = kv_at((int)l, hh, s.len + t, H, s.cap, D);
          std::copy(kvr + C + hh * D, kvr + C + (hh + 1) * D, s.self_k.begin() + at);
          std::copy(kvr + 2 * C + hh * D, kvr + 2 * C + (hh + 1) * D, s.self_v.begin() + at);
        }
      }
    }
    clock.emplace(Stage::kSelfAttention);
    for (int row = 0; row < M; ++row) {
      float* qr = m.kv.data() + (size_t)row * 3 * C;
      for (int c = 0; c < C; ++c) qr[c] *= m.scaling;
    }
    for_heads(m, off, max_keys, [&](int row, int hh, float* scratch) {
      const int r = (int)(std::upper_bound(off.begin(), off.end(), row) - off.begin()) - 1, t = row - off[r];
      const Sentence& s = st.sents[sent[r]];
      const float* ck = s.self_k.data() + kv_at((int)l, hh, 0, H, s.cap, D);
      const float* cv = s.self_v.data() + kv_at((int)l, hh, 0, H, s.cap, D);
      const float* qr = m.kv.data() + (size_t)row * 3 * C;
      const int n1 = keys(r, t);
      if (t == 0 && r + 1 < n) prefetch_kv(st.sents[sent[r + 1]], (int)l, hh, H, D, false);  // the next row's
      int b0 = 0, n2 = 0;  // a tree row's branch segment: cache slots s.len + b0 .. s.len + t
      if (branch_start != nullptr && t > 0) {
        b0 = branch_start[row];
        n2 = t - b0 + 1;
      }
      const size_t seg = (size_t)(s.len + b0) * D;
      attend(qr + hh * D, ck, cv, D, n1, D, m.q.data() + (size_t)row * C + hh * D, scratch, ck + seg, cv + seg, n2);
    });
    clock.emplace(Stage::kSelfOut);
    linear(m.pool, L.out, m.q.data(), C, M, m.a.data(), C);
    add_to(m, x, m.a.data(), M);
    if (!pre) norm_rows(m, x, x, M, L.ln_self);
    // encoder attention
    clock.emplace(Stage::kCrossQ);
    in = x;
    if (pre) {
      norm_rows(m, x, m.h.data(), M, L.ln_cross);
      in = m.h.data();
    }
    linear(m.pool, L.cq, in, C, M, m.kv.data(), C);
    clock.emplace(Stage::kCrossAttention);
    for (int row = 0; row < M; ++row) {
      float* qr = m.kv.data() + (size_t)row * C;
      for (int c = 0; c < C; ++c) qr[c] *= m.scaling;
    }
    // a row's positions (a drafted row's several) all read its source's keys and values: together
    for_head_groups(m, off, max_keys, (size_t)kAttendQueries * (max_keys + 16), [&](int r, int hh, float* scratch) {
      const Sentence& s = st.sents[sent[r]].enc ? *st.sents[sent[r]].enc : st.sents[sent[r]];
      const float* ek = s.enc_k.data() + kv_at((int)l, hh, 0, H, s.src_len, D);
      const float* ev = s.enc_v.data() + kv_at((int)l, hh, 0, H, s.src_len, D);
      if (r + 1 < n) {  // the next row's
        const Sentence& next = st.sents[sent[r + 1]];
        prefetch_kv(next.enc ? *next.enc : next, (int)l, hh, H, D, true);
      }
      attend_queries(m.kv.data() + (size_t)off[r] * C + hh * D, C, off[r + 1] - off[r], ek, ev, D, s.src_len, D,
                     m.q.data() + (size_t)off[r] * C + hh * D, C, scratch);
    });
    clock.emplace(Stage::kCrossOut);
    linear(m.pool, L.cout, m.q.data(), C, M, m.a.data(), C);
    add_to(m, x, m.a.data(), M);
    if (!pre) norm_rows(m, x, x, M, L.ln_cross);
    clock.emplace(Stage::kFFN);
    ffn(m, M, L.fc1, L.fc2, L.ln_ffn, pre);
  }
  StageClock clock(Stage::kProjection);
  if (m.w.dec_final.on) norm_rows(m, x, x, M, m.w.dec_final);
}

}  // namespace fa
