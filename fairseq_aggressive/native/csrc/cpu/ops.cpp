// Row reductions, layer norm, activations, attention and embeddings (see ops.h).
#include "cpu/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/vec.h"

namespace fa {

namespace {

// the 8 lanes of v summed in lane order, from 0 (every row sum's fixed order)
inline float lane_sum(V8 v) {
  float t[LANES];
  v.store(t);
  float s = 0.f;
  for (int l = 0; l < LANES; ++l) s = s + t[l];
  return s;
}

// the largest of the 8 lanes of v
inline float lane_max(V8 v) {
  float t[LANES];
  v.store(t);
  float m = t[0];
  for (int l = 1; l < LANES; ++l) m = std::max(m, t[l]);
  return m;
}

// q . key[j] over D values for the 8 keys j < 8 into out[j], each with a
// score's fixed operations: 8 lane partial sums (lane l: the d = l mod 8, in
// order), added from lane 0, then the d past the last whole 8 by fused
// multiply-adds.  The keys' chains run side by side (one key's chain alone
// waits on each fused multiply-add's latency) and their lanes are added as
// vectors, after a transpose, instead of one scalar addition chain per key.
inline void dot8(const float* q, const float* const* key, int D, float* out) {
  V8 acc[LANES];
  for (int j = 0; j < LANES; ++j) acc[j] = V8::zero();
  int d = 0;
  for (; d + LANES <= D; d += LANES) {
    const V8 qv = V8::load(q + d);
    for (int j = 0; j < LANES; ++j) acc[j] = V8::fma(qv, V8::load(key[j] + d), acc[j]);
  }
  V8::transpose(acc);  // acc[l] lane j: key j's lane l
  V8 s = V8::zero();
  for (int l = 0; l < LANES; ++l) s = V8::add(s, acc[l]);
  s.store(out);
  for (; d < D; ++d)
    for (int j = 0; j < LANES; ++j) out[j] = std::fma(q[d], key[j][d], out[j]);
}

// the scores q[i] . k of n keys (rows of stride ld) into out[i] for each of
// the Q queries, 8 keys at a time (each query's dot8 over the same keys, so
// one query's scores do not depend on the others); the last few with the last
// key repeated in the unused places
inline void dots(const float* const* q, int Q, const float* k, size_t ld, int n, int D, float* const* out) {
  const float* key[LANES];
  for (int j = 0; j < n; j += LANES) {
    for (int i = 0; i < LANES; ++i) key[i] = k + (size_t)std::min(j + i, n - 1) * ld;
    for (int i = 0; i < Q; ++i) {
      if (j + LANES <= n) {
        dot8(q[i], key, D, out[i] + j);
      } else {
        float tail[LANES];
        dot8(q[i], key, D, tail);
        std::copy(tail, tail + (n - j), out[i] + j);
      }
    }
  }
}

inline float gelu(float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); }

}  // namespace

namespace {

// The maximum of x[0..n), or of |x[0..n)| (Abs; 0 for n = 0): 4 x 8 lane maxima
// side by side (one chain would wait on each maximum's latency: a vocabulary's
// 8424 logits are 1053 dependent steps), then the tail.  A maximum is exact, so
// any grouping gives the same value (NaN aside).
template <bool Abs>
float lane_maxima(const float* x, int n) {
  const V8 lo = Abs ? V8::zero() : V8::bcast(-std::numeric_limits<float>::infinity()), neg1 = V8::bcast(-1.f);
  auto value = [&](int at) {
    const V8 a = V8::load(x + at);
    return Abs ? V8::max(a, V8::mul(a, neg1)) : a;  // |a|: -a is exact
  };
  V8 m[4] = {lo, lo, lo, lo};
  int v = 0;
  for (; v + 4 * LANES <= n; v += 4 * LANES)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) m[i] = V8::max(m[i], value(v + i * LANES));
  for (; v + LANES <= n; v += LANES) m[0] = V8::max(m[0], value(v));
  float mx = lane_max(V8::max(V8::max(m[0], m[1]), V8::max(m[2], m[3])));
  for (; v < n; ++v) mx = std::max(mx, Abs ? std::fabs(x[v]) : x[v]);
  return mx;
}

}  // namespace

float max_of(const float* x, int n) { return lane_maxima<false>(x, n); }

float abs_max_of(const float* x, int n) { return lane_maxima<true>(x, n); }

// 8 partial sums combined in a fixed order (lane l: the x[j], j = l mod 8, in
// order).  With 16-lane vectors the exps run 16 at a time and their two halves
// join the 8 sums in the same order: the same additions, so the same bits.
float logsumexp(const float* x, int n) {
  const float mx = max_of(x, n);
  if (mx == -std::numeric_limits<float>::infinity()) return mx;
  const V8 mv = V8::bcast(mx), neg1 = V8::bcast(-1.f);
  V8 s8 = V8::zero();
  int v = 0;
#if defined(FA_ISA_AVX512)
  const VP mv16 = VP::bcast(mx), neg16 = VP::bcast(-1.f);
  for (; v + 2 * LANES <= n; v += 2 * LANES) {
    const VP e = VP::exp(VP::fma(mv16, neg16, VP::load(x + v)));
    s8 = V8::add(V8::add(s8, e.low()), e.high());
  }
#endif
  for (; v + LANES <= n; v += LANES) s8 = V8::add(s8, V8::exp(V8::fma(mv, neg1, V8::load(x + v))));
  float sum = lane_sum(s8);
  for (; v < n; ++v) sum = sum + fexp(x[v] - mx);
  return mx + std::log(sum);
}

// exp(x - m) as 2^y, y = (x - m) log2(e), its fraction linear: the float
// whose bits are y 2^23 + 127 2^23, computed as x a + b (a = log2(e) 2^23,
// b = 127 2^23 - m a) and at least 2^23 (y >= -126; a NaN gives that too),
// truncated to an integer: above exp by at most 6.2%, from a multiply, an add,
// a maximum and a conversion.  64 running sums, value j into sum j mod 64,
// added in order, then the values past the last 64 one by one: plain float
// operations in a fixed order that the compiler vectorises on every target
// alike (through a block of bits, not a call per value, which it would not).
float logsumexp_coarse(const float* x, int n) {
  const float mx = max_of(x, n);
  if (mx == -std::numeric_limits<float>::infinity()) return mx;
  constexpr float a = 12102203.f;  // log2(e) 2^23
  const float b = 1065353216.f - mx * a;
  auto bits = [a, b](float v) { return (int32_t)std::max(8388608.f, v * a + b); };
  constexpr int kSums = 64;
  float part[kSums] = {};
  const float* p = x;
  for (const float* const whole = x + n / kSums * kSums; p != whole; p += kSums) {
    int32_t w[kSums];
    float e[kSums];
    for (int l = 0; l < kSums; ++l) w[l] = bits(p[l]);
    std::memcpy(e, w, sizeof e);
    for (int l = 0; l < kSums; ++l) part[l] = part[l] + e[l];
  }
  float sum = 0.f;
  for (int l = 0; l < kSums; ++l) sum = sum + part[l];
  for (; p != x + n; ++p) {
    const int32_t w = bits(*p);
    float e;
    std::memcpy(&e, &w, 4);
    sum = sum + e;
  }
  return mx + std::log(sum);
}

int argmax_first(const float* x, int n) {
  const float mx = max_of(x, n);
  const V8 mv = V8::bcast(mx);
  int u = 0;
  for (; u + LANES <= n; u += LANES)  // 8 columns per comparison, the lowest equal one first
    if (const unsigned eq = V8::equal_lanes(V8::load(x + u), mv)) return u + __builtin_ctz(eq);
  for (; u < n; ++u)
    if (x[u] == mx) return u;
  return 0;  // all NaN
}

// The mean and the variance as 8 lane partial sums combined in a fixed order,
// then the tail (as dot): the same bits on every target, and no chain of C
// dependent additions per row
void layer_norm(const float* x, float* y, int C, const float* w, const float* b, float eps) {
  V8 acc = V8::zero();
  int c = 0;
  for (; c + LANES <= C; c += LANES) acc = V8::add(acc, V8::load(x + c));
  float mean = lane_sum(acc);
  for (; c < C; ++c) mean = mean + x[c];
  mean /= (float)C;
  const V8 neg_mean = V8::mul(V8::bcast(mean), V8::bcast(-1.f));  // x + (-mean) is x - mean exactly
  acc = V8::zero();
  for (c = 0; c + LANES <= C; c += LANES) {
    const V8 d = V8::add(V8::load(x + c), neg_mean);
    acc = V8::fma(d, d, acc);
  }
  float var = lane_sum(acc);
  for (; c < C; ++c) {
    const float d = x[c] - mean;
    var = std::fma(d, d, var);
  }
  var /= (float)C;
  float inv = 1.f / std::sqrt(var + eps);
  for (int c = 0; c < C; ++c) y[c] = (x[c] - mean) * inv * w[c] + b[c];
}

void layer_norm_rows(const float* x, float* y, int M, int C, const std::vector<float>& w,
                     const std::vector<float>& b, float eps) {
  for (int m = 0; m < M; ++m) layer_norm(x + (size_t)m * C, y + (size_t)m * C, C, w.data(), b.data(), eps);
}

void add_rows(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
}

void gelu_rows(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = gelu(x[i]);
}

void swish_rows(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / (1.f + std::exp(-x[i]));
}

void relu_rows(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
}

namespace {

// value row j of a head: from v below n, else from v2
inline const float* value_row(const float* v, const float* v2, size_t ld, int n, int j) {
  return j < n ? v + j * ld : v2 + (j - n) * ld;
}

// out[i] (NV vectors) = sum over the N keys j, in order, of p[i][j] * value
// row j, for each of the Q queries, each output one fused multiply-add chain
// (a query's operations do not depend on Q; the value rows are read once for
// all Q, whose chains run side by side)
template <int NV, int Q>
void weighted_values(const float* const* p, const float* v, const float* v2, size_t ld, int n, int N,
                     float* const* out) {
  V8 acc[Q][NV];
  for (int q = 0; q < Q; ++q)
    for (int i = 0; i < NV; ++i) acc[q][i] = V8::zero();
  for (int j = 0; j < N; ++j) {
    const float* vj = value_row(v, v2, ld, n, j);
    V8 vv[NV];
    for (int i = 0; i < NV; ++i) vv[i] = V8::load(vj + i * LANES);
    for (int q = 0; q < Q; ++q) {
      const V8 pj = V8::bcast(p[q][j]);
      for (int i = 0; i < NV; ++i) acc[q][i] = V8::fma(pj, vv[i], acc[q][i]);
    }
  }
  for (int q = 0; q < Q; ++q)
    for (int i = 0; i < NV; ++i) acc[q][i].store(out[q] + i * LANES);
}

// weighted_values of one query for head widths of 1 .. 16 vectors (the accumulators stay in registers)
using WeightedValues = void (*)(const float* const*, const float*, const float*, size_t, int, int, float* const*);
template <int... I>
constexpr std::array<WeightedValues, sizeof...(I)> weighted_values_table(std::integer_sequence<int, I...>) {
  return {&weighted_values<I + 1, 1>...};
}
constexpr auto kWeightedValues = weighted_values_table(std::make_integer_sequence<int, 16>{});

// weighted_values of Q = 1 .. kAttendQueries queries for head widths of 1 .. 4
// vectors ([NV - 1][Q - 1]; wider heads go one query at a time)
template <int NV, int... Q>
constexpr std::array<WeightedValues, sizeof...(Q)> queries_row(std::integer_sequence<int, Q...>) {
  return {&weighted_values<NV, Q + 1>...};
}
constexpr int kQueriesNV = 4;
using QueriesRow = std::array<WeightedValues, kAttendQueries>;
constexpr std::array<QueriesRow, kQueriesNV> kWeightedValuesQ = {
    queries_row<1>(std::make_integer_sequence<int, kAttendQueries>{}),
    queries_row<2>(std::make_integer_sequence<int, kAttendQueries>{}),
    queries_row<3>(std::make_integer_sequence<int, kAttendQueries>{}),
    queries_row<4>(std::make_integer_sequence<int, kAttendQueries>{})};

// scores s[0..N) into the softmax's weights, in place: exp(s - max) summed as
// 8-lane partial sums in a fixed order, each divided by the sum (s has room
// for N rounded up to a multiple of 8, plus 8)
void softmax_weights(float* s, int N) {
  const float mx = max_of(s, N);
  const V8 mv = V8::bcast(mx), neg1 = V8::bcast(-1.f);
  V8 s8 = V8::zero();
  int j = 0;
  for (; j + LANES <= N; j += LANES) {
    V8 e = V8::exp(V8::fma(mv, neg1, V8::load(s + j)));
    e.store(s + j);
    s8 = V8::add(s8, e);
  }
  float sum = lane_sum(s8);
  if (j < N) {  // the last few: the same exp on a vector (s has room), added one by one
    V8::exp(V8::fma(mv, neg1, V8::load(s + j))).store(s + j);
    for (; j < N; ++j) sum = sum + s[j];
  }
  const V8 sv = V8::bcast(sum);
  for (j = 0; j < N; j += LANES) V8::div(V8::load(s + j), sv).store(s + j);
}

}  // namespace

// Scores, softmax (8-lane partial sums in a fixed order), weighted sum of the
// values (each output accumulated over keys in order).  The same keys give
// the same operations whether they are one segment or two.
void attend(const float* q, const float* k, const float* v, size_t ld, int n, int D, float* out, float* scratch,
            const float* k2, const float* v2, int n2) {
  dots(&q, 1, k, ld, n, D, &scratch);
  if (n2 > 0) {
    float* after = scratch + n;
    dots(&q, 1, k2, ld, n2, D, &after);
  }
  const int N = n + n2;
  softmax_weights(scratch, N);
  if (D % LANES == 0 && D / LANES <= (int)kWeightedValues.size())
    return kWeightedValues[D / LANES - 1](&scratch, v, v2, ld, n, N, &out);
  // other head widths: the same operations one value at a time
  for (int d = 0; d < D; ++d) out[d] = 0.f;
  for (int j = 0; j < N; ++j) {
    const float* vj = value_row(v, v2, ld, n, j);
    for (int d = 0; d < D; ++d) out[d] = std::fma(scratch[j], vj[d], out[d]);
  }
}

void attend_queries(const float* q, size_t q_ld, int nq, const float* k, const float* v, size_t ld, int n, int D,
                    float* out, size_t out_ld, float* scratch) {
  const size_t stride = (size_t)n + 16;
  if (nq == 1 || D % LANES != 0 || D / LANES > kQueriesNV) {  // (one query: attend's own path, less to set up)
    for (int i = 0; i < nq; ++i) attend(q + i * q_ld, k, v, ld, n, D, out + i * out_ld, scratch);
    return;
  }
  const float* qs[kAttendQueries];
  float *ss[kAttendQueries], *os[kAttendQueries];
  for (int i0 = 0; i0 < nq; i0 += kAttendQueries) {
    const int Q = std::min(kAttendQueries, nq - i0);
    for (int i = 0; i < Q; ++i) {
      qs[i] = q + (size_t)(i0 + i) * q_ld;
      ss[i] = scratch + i * stride;
      os[i] = out + (size_t)(i0 + i) * out_ld;
    }
    dots(qs, Q, k, ld, n, D, ss);
    for (int i = 0; i < Q; ++i) softmax_weights(ss[i], n);
    kWeightedValuesQ[D / LANES - 1][Q - 1](ss, v, nullptr, ld, n, n, os);
  }
}

void embed_rows(float* x, int C, int M, const int32_t* tok, const int32_t* pos, const float* E, const float* P,
                float scale, const float* mask, const float* add) {
  for (int r = 0; r < M; ++r) {
    float* xr = x + (size_t)r * C;
    const float* e = tok[r] < 0 ? mask : E + (size_t)tok[r] * C;
    for (int c = 0; c < C; ++c) xr[c] = scale * e[c];
    if (P != nullptr) {
      const float* p = P + (size_t)pos[r] * C;
      for (int c = 0; c < C; ++c) xr[c] = xr[c] + p[c];
    }
    if (add != nullptr) {
      const float* a = add + (size_t)r * C;
      for (int c = 0; c < C; ++c) xr[c] = xr[c] + a[c];
    }
  }
}

}  // namespace fa

