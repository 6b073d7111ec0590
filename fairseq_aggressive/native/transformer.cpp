// A fairseq Transformer (encoder + cached decoder + exact greedy verification)
// for CPU inference at batch 1 and batch N, called from Python through ctypes.
//
// Exactness: every output value is a fixed sequence of IEEE float operations
// that does not depend on how many rows a call processes, on where a row sits in
// a call, or on the instruction set: matrix products accumulate each output
// sequentially over k with fused multiply-adds (AVX2 + FMA intrinsics, or the
// same fmas one lane at a time), other reductions are sequential loops (the
// build uses -ffp-contract=off, so the compiler fuses nothing on its own).  So a
// pass over [last, draft] gives bit for bit the logits that one-token greedy
// steps of this engine give, and the aggressive output equals this engine's
// greedy output.  Against fairseq's own (MKL) greedy the logits differ by float
// rounding only.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "parallel.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(FA_GENERIC)
#include <immintrin.h>
#define FA_AVX2 1
#endif

namespace {

constexpr int LANES = 8;  // outputs per packed weight panel

// ------------------------------------------------------------------ 8 lanes
#ifdef FA_AVX2
struct V8 {
  __m256 v;
};
static inline V8 vzero() { return {_mm256_setzero_ps()}; }
static inline V8 vload(const float* p) { return {_mm256_loadu_ps(p)}; }
static inline V8 vload(const uint16_t* p) { return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p))}; }
static inline V8 vbcast(float a) { return {_mm256_set1_ps(a)}; }
static inline V8 vfma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
static inline void vstore(float* p, V8 a) { _mm256_storeu_ps(p, a.v); }
static inline V8 vadd(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
static inline V8 vmax(V8 a, V8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// fexp (below) on 8 lanes, the same operations in the same order
static inline V8 vexp(V8 xv) {
  __m256 x = xv.v;
  __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.3981999507e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return {_mm256_blendv_ps(y, _mm256_setzero_ps(), tiny)};
}
#else
struct V8 {
  float v[LANES];
};
static inline V8 vzero() { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = 0.f; return r; }
static inline V8 vload(const float* p) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = p[i]; return r; }
static inline float half_to_float(uint16_t h);
static inline V8 vload(const uint16_t* p) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = half_to_float(p[i]); return r; }
static inline V8 vbcast(float a) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = a; return r; }
static inline V8 vfma(V8 a, V8 b, V8 c) {
  V8 r;
  for (int i = 0; i < LANES; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}
static inline void vstore(float* p, V8 a) { for (int i = 0; i < LANES; ++i) p[i] = a.v[i]; }
static inline V8 vadd(V8 a, V8 b) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
static inline V8 vmax(V8 a, V8 b) {
  V8 r;
  for (int i = 0; i < LANES; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return r;
}
static inline float fexp(float x);
static inline V8 vexp(V8 x) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = fexp(x.v[i]); return r; }
#endif

// IEEE half -> float (exact; the generic build's F16C replacement)
static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (e == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int s = 0;
      while (!(man & 0x400u)) {
        man <<= 1;
        ++s;
      }
      bits = sign | ((uint32_t)(127 - 14 - s) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((e - 15 + 127) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---------------------------------------------------------------- threads
// parallel.h: the pool (calls complete when their items are done, whoever ran them)
using fa::Pool;

// ------------------------------------------------------------------ linear
// y = x W^T + b with W (N x K) row-major, packed once as panels of 8 outputs:
// panel p holds W[8p + l][k] at [k * 8 + l].
struct Linear {
  int N = 0, K = 0, P = 0;
  bool half = false;      // weights stored as float16 (only when every weight is a float16 value)
  bool q8 = false;        // int8 weights and activations (--inference-precision int8)
  std::vector<float> w;   // P * K * 8
  std::vector<uint16_t> wh;
  std::vector<int8_t> wq;  // int8: panel p, k pair j, lane l, k parity h at ((p * K2 + j) * 8 + l) * 2 + h
  std::vector<float> ws;   // int8: per output row scale (P * 8)
  std::vector<float> b;   // N (zeros if no bias)
  bool has_bias = false;
  int K2() const { return (K + 1) / 2; }
  // int8 weights Wq (n x k) with per-row scales
  void pack_q8(const int8_t* Wq, const float* scale, const float* bias, int n, int k) {
    N = n;
    K = k;
    P = (n + LANES - 1) / LANES;
    q8 = true;
    half = false;
    w.clear();
    wh.clear();
    const int k2 = K2();
    wq.assign((size_t)P * k2 * LANES * 2, 0);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < k; ++c)
        wq[(((size_t)(r / LANES) * k2 + c / 2) * LANES + r % LANES) * 2 + c % 2] = Wq[(size_t)r * k + c];
    ws.assign((size_t)P * LANES, 0.f);
    std::copy(scale, scale + n, ws.begin());
    b.assign(n, 0.f);
    if (bias) std::copy(bias, bias + n, b.begin());
    has_bias = bias != nullptr;
  }
  template <typename T>
  static void pack_into(std::vector<T>& dst, const T* W, int n, int k, int P) {
    dst.assign((size_t)P * k * LANES, T(0));
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < k; ++c) dst[((size_t)(r / LANES) * k + c) * LANES + r % LANES] = W[(size_t)r * k + c];
  }
  // W as float, or as float16 bits (Wh) when given
  void pack(const float* W, const uint16_t* Wh, const float* bias, int n, int k) {
    N = n;
    K = k;
    P = (n + LANES - 1) / LANES;
    half = Wh != nullptr;
    if (half) {
      pack_into(wh, Wh, n, k, P);
      w.clear();
    } else {
      pack_into(w, W, n, k, P);
      wh.clear();
    }
    b.assign(n, 0.f);
    if (bias) std::copy(bias, bias + n, b.begin());
    has_bias = bias != nullptr;
  }
};

// dst = rows ids[0..n) of src (any storage: float, float16, int8 with row
// scales), packed like src; a row's dot products are computed exactly as in
// src (the same per-lane sequence over k), so its logits are bit for bit the same
static void gather_rows(const Linear& src, const int32_t* ids, int n, Linear& dst) {
  const int K = src.K;
  std::vector<float> bias(n);
  for (int i = 0; i < n; ++i) bias[i] = src.b[ids[i]];
  const float* bp = src.has_bias ? bias.data() : nullptr;
  if (src.q8) {
    const int k2 = src.K2();
    std::vector<int8_t> q((size_t)n * K);
    std::vector<float> scale(n);
    for (int i = 0; i < n; ++i) {
      const int r = ids[i];
      for (int c = 0; c < K; ++c)
        q[(size_t)i * K + c] = src.wq[(((size_t)(r / LANES) * k2 + c / 2) * LANES + r % LANES) * 2 + c % 2];
      scale[i] = src.ws[r];
    }
    dst.pack_q8(q.data(), scale.data(), bp, n, K);
  } else if (src.half) {
    std::vector<uint16_t> wh((size_t)n * K);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < K; ++c)
        wh[(size_t)i * K + c] = src.wh[((size_t)(ids[i] / LANES) * K + c) * LANES + ids[i] % LANES];
    dst.pack(nullptr, wh.data(), bp, n, K);
  } else {
    std::vector<float> w((size_t)n * K);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < K; ++c)
        w[(size_t)i * K + c] = src.w[((size_t)(ids[i] / LANES) * K + c) * LANES + ids[i] % LANES];
    dst.pack(w.data(), nullptr, bp, n, K);
  }
}

template <int MR, int NR, typename WT>
static void tile(const float* x, int ldx, int K, const WT* panel, size_t pstride, float* y, int ldy,
                 int n0, int N, const float* bias, bool has_bias) {
  V8 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
  for (int k = 0; k < K; ++k) {
    V8 w[NR];
    for (int j = 0; j < NR; ++j) w[j] = vload(panel + j * pstride + (size_t)k * LANES);
    for (int i = 0; i < MR; ++i) {
      V8 a = vbcast(x[(size_t)i * ldx + k]);
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(a, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float tmp[LANES];
      vstore(tmp, acc[i][j]);
      int c0 = n0 + j * LANES;
      int c1 = std::min(c0 + LANES, N);
      float* out = y + (size_t)i * ldy;
      if (has_bias)
        for (int c = c0; c < c1; ++c) out[c] = tmp[c - c0] + bias[c];
      else
        for (int c = c0; c < c1; ++c) out[c] = tmp[c - c0];
    }
}

template <typename WT>
using TileFn = void (*)(const float*, int, int, const WT*, size_t, float*, int, int, int, const float*, bool);

template <int MR, typename WT>
static TileFn<WT> tile_for(int nr) {
  switch (nr) {
    case 1: return tile<MR, 1, WT>;
    case 2: return tile<MR, 2, WT>;
    case 3: return tile<MR, 3, WT>;
    case 4: return tile<MR, 4, WT>;
    case 5: return tile<MR, 5, WT>;
    case 6: return tile<MR, 6, WT>;
    case 7: return tile<MR, 7, WT>;
    default: return tile<MR, 8, WT>;
  }
}
template <typename WT>
static TileFn<WT> tile_fn(int mr, int nr) {
  switch (mr) {
    case 1: return tile_for<1, WT>(nr);
    case 2: return tile_for<2, WT>(nr);
    case 3: return tile_for<3, WT>(nr);
    case 4: return tile_for<4, WT>(nr);
    case 5: return tile_for<5, WT>(nr);
    default: return tile_for<6, WT>(nr);
  }
}
// panels per tile for a row block of mr rows (about 8-12 accumulators)
static int panels_for(int mr) {
  static const int t[7] = {0, 8, 6, 4, 3, 2, 2};
  return t[mr];
}

// The tiles of an M x N product: output panels split into groups across the
// pool's threads (when there is enough work), rows in blocks of at most 6, as
// even as possible (a lone last row would run a latency-bound 1-row tile);
// tile(mr, m0, p, cnt) computes rows [m0, m0 + mr) of panels [p, p + cnt).
template <typename TileCall>
static void for_tiles(Pool& pool, const Linear& L, int M, const TileCall& tile) {
  if (M <= 0) return;
  const int group = panels_for(std::min(M, 6));
  const int n_groups = (L.P + group - 1) / group;
  const double flops = 2.0 * M * L.N * L.K;
  const int chunks = (pool.size() > 1 && flops > 4e5) ? std::min(n_groups, pool.size() * 4) : 1;
  const int nb = (M + 5) / 6;
  auto body = [&](int c) {
    int g0 = (int)((int64_t)n_groups * c / chunks), g1 = (int)((int64_t)n_groups * (c + 1) / chunks);
    for (int g = g0; g < g1; ++g) {
      const int p0 = g * group, np = std::min(group, L.P - p0);
      for (int bi = 0, m0 = 0; bi < nb; ++bi) {
        const int mr = (M * (bi + 1)) / nb - (M * bi) / nb;
        const int nr = std::min(np, panels_for(mr));
        for (int pp = 0; pp < np; pp += nr) tile(mr, m0, p0 + pp, std::min(nr, np - pp));
        m0 += mr;
      }
    }
  };
  pool.run(body, chunks);
}

// y (M x N, row stride ldy) = x (M x K, row stride ldx) W^T + b
template <typename WT>
static void linear_t(Pool& pool, const Linear& L, const WT* weights, const float* x, int ldx, int M, float* y,
                     int ldy) {
  const size_t pstride = (size_t)L.K * LANES;
  for_tiles(pool, L, M, [&](int mr, int m0, int p, int cnt) {
    tile_fn<WT>(mr, cnt)(x + (size_t)m0 * ldx, ldx, L.K, weights + (size_t)p * pstride, pstride,
                         y + (size_t)m0 * ldy, ldy, p * LANES, L.N, L.b.data(), L.has_bias);
  });
}

// ------------------------------------------------------------ int8 linear
// Per input row: qx = round(x * (127 / amax)) (half to even), sx = amax / 127;
// acc = sum_k qx[k] * qw[n][k] in int32 (exact, so any order);
// y = float(acc) * (sx * sw[n]) + b[n].  The same definition as
// fairseq_aggressive/quantization.py, which the tests compare bit for bit.
static void quantize_rows(const float* x, int ldx, int M, int K, int16_t* q, int ldq, float* sx) {
  for (int m = 0; m < M; ++m) {
    const float* r = x + (size_t)m * ldx;
    float amax = 0.f;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));
    const float inv = 127.f / (amax == 0.f ? 1.f : amax);
    int16_t* qr = q + (size_t)m * ldq;
    for (int k = 0; k < K; ++k) {
      float v = std::nearbyint(r[k] * inv);
      v = std::min(std::max(v, -127.f), 127.f);
      qr[k] = (int16_t)v;
    }
    for (int k = K; k < ldq; ++k) qr[k] = 0;
    sx[m] = amax / 127.f;
  }
}

template <int MR, int NR>
static void tile_q8(const int16_t* xq, int ldq, int K2, const int8_t* panel, size_t pstride, const float* sx,
                    float* y, int ldy, int n0, int N, const float* ws, const float* bias, bool has_bias) {
  int32_t res[MR][NR][LANES];
#ifdef FA_AVX2
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  for (int k = 0; k < K2; ++k) {
    __m256i w[NR];
    for (int j = 0; j < NR; ++j)
      w[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(panel + j * pstride + (size_t)k * 2 * LANES)));
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, xq + (size_t)i * ldq + 2 * k, 4);
      const __m256i a = _mm256_set1_epi32(pair);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a, w[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) _mm256_storeu_si256((__m256i*)res[i][j], acc[i][j]);
#else
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      for (int l = 0; l < LANES; ++l) res[i][j][l] = 0;
  for (int k = 0; k < K2; ++k)
    for (int j = 0; j < NR; ++j) {
      const int8_t* wk = panel + j * pstride + (size_t)k * 2 * LANES;
      for (int i = 0; i < MR; ++i) {
        const int32_t a0 = xq[(size_t)i * ldq + 2 * k], a1 = xq[(size_t)i * ldq + 2 * k + 1];
        for (int l = 0; l < LANES; ++l) res[i][j][l] += a0 * wk[2 * l] + a1 * wk[2 * l + 1];
      }
    }
#endif
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const int c0 = n0 + j * LANES, c1 = std::min(c0 + LANES, N);
      float* out = y + (size_t)i * ldy;
      for (int c = c0; c < c1; ++c) {
        const float comb = sx[i] * ws[c];
        float v = (float)res[i][j][c - c0] * comb;
        if (has_bias) v = v + bias[c];
        out[c] = v;
      }
    }
}

using TileQ8Fn = void (*)(const int16_t*, int, int, const int8_t*, size_t, const float*, float*, int, int, int,
                          const float*, const float*, bool);
template <int MR>
static TileQ8Fn tile_q8_for(int nr) {
  switch (nr) {
    case 1: return tile_q8<MR, 1>;
    case 2: return tile_q8<MR, 2>;
    case 3: return tile_q8<MR, 3>;
    case 4: return tile_q8<MR, 4>;
    case 5: return tile_q8<MR, 5>;
    case 6: return tile_q8<MR, 6>;
    case 7: return tile_q8<MR, 7>;
    default: return tile_q8<MR, 8>;
  }
}
static TileQ8Fn tile_q8_fn(int mr, int nr) {
  switch (mr) {
    case 1: return tile_q8_for<1>(nr);
    case 2: return tile_q8_for<2>(nr);
    case 3: return tile_q8_for<3>(nr);
    case 4: return tile_q8_for<4>(nr);
    case 5: return tile_q8_for<5>(nr);
    default: return tile_q8_for<6>(nr);
  }
}

static void linear_q8(Pool& pool, const Linear& L, const float* x, int ldx, int M, float* y, int ldy) {
  if (M <= 0) return;
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<float> sx;
  const int K2 = L.K2(), ldq = 2 * K2;
  if (xq.size() < (size_t)M * ldq) xq.resize((size_t)M * ldq);
  if (sx.size() < (size_t)M) sx.resize(M);
  quantize_rows(x, ldx, M, L.K, xq.data(), ldq, sx.data());
  const int16_t* q = xq.data();
  const float* s = sx.data();
  const size_t pstride = (size_t)K2 * 2 * LANES;
  for_tiles(pool, L, M, [&](int mr, int m0, int p, int cnt) {
    tile_q8_fn(mr, cnt)(q + (size_t)m0 * ldq, ldq, K2, L.wq.data() + (size_t)p * pstride, pstride, s + m0,
                        y + (size_t)m0 * ldy, ldy, p * LANES, L.N, L.ws.data(), L.b.data(), L.has_bias);
  });
}

static void linear(Pool& pool, const Linear& L, const float* x, int ldx, int M, float* y, int ldy) {
  if (L.q8)
    linear_q8(pool, L, x, ldx, M, y, ldy);
  else if (L.half)
    linear_t(pool, L, L.wh.data(), x, ldx, M, y, ldy);
  else
    linear_t(pool, L, L.w.data(), x, ldx, M, y, ldy);
}

// ------------------------------------------------------------- elementwise
// exp with a fixed sequence of operations (Cody-Waite reduction, degree-6
// polynomial); ~1 ulp, the same on every machine.
static inline float fexp(float x) {
  // branch-free so that loops over it vectorize; inputs below -87.3 give 0
  // (callers pass x <= 0)
  const bool tiny = x < -87.33654f;
  x = std::min(std::max(x, -87.33654f), 88.0f);
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187e-06f, r);
  float p = 1.3981999507e-3f;
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r);
  p = p + 1.f;
  int32_t bits = ((int32_t)n + 127) << 23;  // 2^n, n in [-126, 127]
  float s;
  std::memcpy(&s, &bits, 4);
  float y = p * s;
  return tiny ? 0.f : y;
}

// max of x[0..n): 8 lane maxima, then the tail (max is exact in any order)
static float max_of(const float* x, int n) {
  V8 m = vbcast(-std::numeric_limits<float>::infinity());
  int v = 0;
  for (; v + LANES <= n; v += LANES) m = vmax(m, vload(x + v));
  float t[LANES];
  vstore(t, m);
  float mx = t[0];
  for (int l = 1; l < LANES; ++l) mx = std::max(mx, t[l]);
  for (; v < n; ++v) mx = std::max(mx, x[v]);
  return mx;
}

// log(sum(exp(x))) over n values: 8 partial sums combined in a fixed order
static float logsumexp(const float* x, int n) {
  const float mx = max_of(x, n);
  if (mx == -std::numeric_limits<float>::infinity()) return mx;
  const V8 mv = vbcast(mx), neg1 = vbcast(-1.f);
  V8 s8 = vzero();
  int v = 0;
  for (; v + LANES <= n; v += LANES) s8 = vadd(s8, vexp(vfma(mv, neg1, vload(x + v))));
  float t[LANES];
  vstore(t, s8);
  float sum = 0.f;
  for (int l = 0; l < LANES; ++l) sum = sum + t[l];
  for (; v < n; ++v) sum = sum + fexp(x[v] - mx);
  return mx + std::log(sum);
}

// index of the first maximum of x[0..n)
static int argmax_first(const float* x, int n) {
  const float mx = max_of(x, n);
  for (int u = 0; u < n; ++u)
    if (x[u] == mx) return u;
  return 0;  // all NaN
}

// q . k over D values: 8 partial sums (d mod 8) combined in a fixed order
static inline float dot(const float* q, const float* k, int D) {
  int d = 0;
  float s = 0.f;
  if (D >= LANES) {
    V8 acc = vzero();
    for (; d + LANES <= D; d += LANES) acc = vfma(vload(q + d), vload(k + d), acc);
    float t[LANES];
    vstore(t, acc);
    for (int l = 0; l < LANES; ++l) s = s + t[l];
  }
  for (; d < D; ++d) s = std::fma(q[d], k[d], s);
  return s;
}

static void layer_norm(const float* x, float* y, int C, const float* w, const float* b, float eps) {
  float mean = 0.f;
  for (int c = 0; c < C; ++c) mean += x[c];
  mean /= (float)C;
  float var = 0.f;
  for (int c = 0; c < C; ++c) {
    float d = x[c] - mean;
    var += d * d;
  }
  var /= (float)C;
  float inv = 1.f / std::sqrt(var + eps);
  for (int c = 0; c < C; ++c) y[c] = (x[c] - mean) * inv * w[c] + b[c];
}

static void layer_norm_rows(const float* x, float* y, int M, int C, const std::vector<float>& w,
                            const std::vector<float>& b, float eps) {
  for (int m = 0; m < M; ++m) layer_norm(x + (size_t)m * C, y + (size_t)m * C, C, w.data(), b.data(), eps);
}

static inline float gelu(float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); }

// attention of one query row over keys/values [0, n) of one head (rows of
// stride ld), then n2 more at k2/v2 (a branch of a tree row, after the shared
// prefix): scores, softmax (8-lane partial sums in a fixed order), weighted
// sum of the values (each output accumulated over keys in order).  The same
// keys give the same operations whether they are one segment or two.
static void attend(const float* q, const float* k, const float* v, size_t ld, int n, int D, float* out,
                   float* scratch, const float* k2 = nullptr, const float* v2 = nullptr, int n2 = 0) {
  for (int j = 0; j < n; ++j) scratch[j] = dot(q, k + j * ld, D);
  for (int j = 0; j < n2; ++j) scratch[n + j] = dot(q, k2 + j * ld, D);
  const int N = n + n2;
  auto vrow = [&](int j) { return j < n ? v + j * ld : v2 + (j - n) * ld; };
  const float mx = max_of(scratch, N);
  const V8 mv = vbcast(mx), neg1 = vbcast(-1.f);
  V8 s8 = vzero();
  int j = 0;
  for (; j + LANES <= N; j += LANES) {
    V8 e = vexp(vfma(mv, neg1, vload(scratch + j)));
    vstore(scratch + j, e);
    s8 = vadd(s8, e);
  }
  float t[LANES];
  vstore(t, s8);
  float sum = 0.f;
  for (int l = 0; l < LANES; ++l) sum = sum + t[l];
  for (; j < N; ++j) {
    scratch[j] = fexp(scratch[j] - mx);
    sum = sum + scratch[j];
  }
  if (D % LANES == 0) {
    V8 acc[16];
    const int nv = D / LANES;
    if (nv <= 16) {
      for (int i = 0; i < nv; ++i) acc[i] = vzero();
      for (j = 0; j < N; ++j) {
        const V8 p = vbcast(scratch[j] / sum);
        const float* vj = vrow(j);
        for (int i = 0; i < nv; ++i) acc[i] = vfma(p, vload(vj + i * LANES), acc[i]);
      }
      for (int i = 0; i < nv; ++i) vstore(out + i * LANES, acc[i]);
      return;
    }
  }
  for (int d = 0; d < D; ++d) out[d] = 0.f;
  for (j = 0; j < N; ++j) {
    const float p = scratch[j] / sum;
    const float* vj = vrow(j);
    for (int d = 0; d < D; ++d) out[d] = std::fma(p, vj[d], out[d]);
  }
}

// ------------------------------------------------------------------ model
struct Config {
  int32_t C, H, F, enc_layers, dec_layers, src_vocab, tgt_vocab, src_positions, tgt_positions;
  int32_t enc_normalize_before, dec_normalize_before, gelu, pad, unk, eos;
  float enc_embed_scale, dec_embed_scale, ln_eps;
};

struct Norm {
  std::vector<float> w, b;
  bool on = false;
  void set(const float* wp, const float* bp, int C) {
    on = wp != nullptr;
    if (on) {
      w.assign(wp, wp + C);
      b.assign(bp, bp + C);
    }
  }
};

struct EncLayer {
  Linear qkv, out, fc1, fc2;
  Norm ln_attn, ln_ffn;
};
struct DecLayer {
  Linear qkv, out, cq, ckv, cout, fc1, fc2;
  Norm ln_self, ln_cross, ln_ffn;
};

struct Model {
  Config cfg;
  int D = 0;
  float scaling = 1.f;
  std::vector<float> src_embed, tgt_embed, src_pos, tgt_pos;  // pos tables may be empty
  std::vector<float> mask_embed;  // a block drafter's slot input (fa_set_mask_embed): target id -1
  Linear feat_proj;  // a --verifier-features drafter's projection of the verifier's features (fa_set_feature_proj)
  Norm enc_ln_embed, enc_final, dec_ln_embed, dec_final;
  std::vector<EncLayer> enc;
  std::vector<DecLayer> dec;
  Linear proj;
  // vocabulary shortlist (fa_shortlist_common): output rows [0, sl_n) of proj,
  // the special symbols and the most frequent tokens; 0 = no shortlist
  int sl_n = 0;
  Linear sl_common;
  Pool pool{1};
  // scratch
  std::vector<float> x, h, q, kv, a, f, logits, att;
};

// rows (M x C): self-attention block + FFN block of a pre- or post-norm layer
struct Sentence {
  int src_len = 0, len = 0, cap = 0;
  std::vector<float> enc_k, enc_v;  // per layer S x C
  std::vector<float> self_k, self_v;  // per layer cap x C
  std::vector<int32_t> sl_ids;  // shortlist rows of this sentence beyond the common ones (ascending)
  Linear sl_extra;
};

struct State {
  std::vector<Sentence> sents;
  std::vector<float> enc_out;  // the encoder output, sentences' rows concatenated (fa_encoder_out)
  bool shortlist = false;  // project to the shortlist (common rows + each sentence's sl_ids)
};

static void add_rows(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
}

static void ffn(Model& m, int M, const Linear& fc1, const Linear& fc2, const Norm& ln, bool pre) {
  const int C = m.cfg.C, F = m.cfg.F;
  float* x = m.x.data();
  const float* in = x;
  if (pre) {
    layer_norm_rows(x, m.h.data(), M, C, ln.w, ln.b, m.cfg.ln_eps);
    in = m.h.data();
  }
  linear(m.pool, fc1, in, C, M, m.f.data(), F);
  float* f = m.f.data();
  if (m.cfg.gelu)
    for (size_t i = 0; i < (size_t)M * F; ++i) f[i] = gelu(f[i]);
  else
    for (size_t i = 0; i < (size_t)M * F; ++i) f[i] = f[i] > 0.f ? f[i] : 0.f;
  linear(m.pool, fc2, f, F, M, m.a.data(), C);
  add_rows(x, m.a.data(), (size_t)M * C);
  if (!pre) layer_norm_rows(x, x, M, C, ln.w, ln.b, m.cfg.ln_eps);
}

static void ensure(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

static void reserve_rows(Model& m, int M, int max_keys) {
  const int C = m.cfg.C;
  ensure(m.x, (size_t)M * C);
  ensure(m.h, (size_t)M * C);
  ensure(m.q, (size_t)M * C);
  ensure(m.kv, (size_t)M * 3 * C);
  ensure(m.a, (size_t)M * C);
  ensure(m.f, (size_t)M * m.cfg.F);
}

// f(row, scratch) for rows [0, M), split across the pool when there are enough
static void for_rows(Model& m, int M, int max_keys, const std::function<void(int, float*)>& f) {
  const int chunks = (m.pool.size() > 1 && (int64_t)M * max_keys * m.cfg.C >= 16384) ? std::min(M, m.pool.size() * 2) : 1;
  ensure(m.att, (size_t)chunks * (max_keys + 16));
  float* base = m.att.data();
  const size_t stride = (size_t)max_keys + 16;
  m.pool.run([&](int c) {
    const int r0 = (int)((int64_t)M * c / chunks), r1 = (int)((int64_t)M * (c + 1) / chunks);
    for (int row = r0; row < r1; ++row) f(row, base + c * stride);
  }, chunks);
}

// embeddings of tokens at positions pos (table row index) into m.x
static void embed(Model& m, const int32_t* tok, const int32_t* pos, int M, bool target,
                  const float* add = nullptr) {
  const int C = m.cfg.C;
  const std::vector<float>& E = target ? m.tgt_embed : m.src_embed;
  const std::vector<float>& P = target ? m.tgt_pos : m.src_pos;
  float scale = target ? m.cfg.dec_embed_scale : m.cfg.enc_embed_scale;
  for (int r = 0; r < M; ++r) {
    float* x = m.x.data() + (size_t)r * C;
    const float* e = (target && tok[r] < 0) ? m.mask_embed.data() : E.data() + (size_t)tok[r] * C;
    for (int c = 0; c < C; ++c) x[c] = scale * e[c];
    if (!P.empty()) {
      const float* p = P.data() + (size_t)pos[r] * C;
      for (int c = 0; c < C; ++c) x[c] = x[c] + p[c];
    }
    if (add != nullptr) {  // a drafter's projection of the verifier's features
      const float* a = add + (size_t)r * C;
      for (int c = 0; c < C; ++c) x[c] = x[c] + a[c];
    }
  }
  const Norm& ln = target ? m.dec_ln_embed : m.enc_ln_embed;
  if (ln.on) layer_norm_rows(m.x.data(), m.x.data(), M, C, ln.w, ln.b, m.cfg.ln_eps);
}

// A state's sentences from their encoder output x (the rows of the B sentences
// concatenated): the output kept (fa_encoder_out), encoder-attention keys and
// values of every decoder layer, empty self-attention caches of cap positions.
static void init_state(Model& m, State& st, int B, const int32_t* src_len, const float* x, int cap) {
  const int C = m.cfg.C;
  int M = 0;
  std::vector<int> start(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    start[b + 1] = start[b] + src_len[b];
    M += src_len[b];
  }
  st.sents.resize(B);
  st.enc_out.assign(x, x + (size_t)M * C);
  const int nl = (int)m.dec.size();
  for (int b = 0; b < B; ++b) {
    Sentence& s = st.sents[b];
    s.src_len = src_len[b];
    s.cap = cap;
    s.enc_k.resize((size_t)nl * s.src_len * C);
    s.enc_v.resize((size_t)nl * s.src_len * C);
    s.self_k.assign((size_t)nl * cap * C, 0.f);
    s.self_v.assign((size_t)nl * cap * C, 0.f);
  }
  ensure(m.kv, (size_t)M * 3 * C);
  for (int l = 0; l < nl; ++l) {
    linear(m.pool, m.dec[l].ckv, st.enc_out.data(), C, M, m.kv.data(), 2 * C);
    for (int b = 0; b < B; ++b) {
      Sentence& s = st.sents[b];
      for (int t = 0; t < s.src_len; ++t) {
        const float* r = m.kv.data() + (size_t)(start[b] + t) * 2 * C;
        std::copy(r, r + C, s.enc_k.begin() + ((size_t)l * s.src_len + t) * C);
        std::copy(r + C, r + 2 * C, s.enc_v.begin() + ((size_t)l * s.src_len + t) * C);
      }
    }
  }
}

// The decoder over n rows on top of their sentences' caches: row r (tokens at
// off[r] .. off[r + 1], target id -1 = a block drafter's slot) at positions
// s.len .. s.len + row_len[r]; keys and values of every row position go into
// the cache (fa_pass and fa_draft decide what stays).  Position t attends
// causally (cache and positions <= t), or, from t = bidir_from[r] on (when
// given), to every position of the row.  Tree rows (branch_start given, a
// verification pass over several drafts): the row is [last, branch 1, branch
// 2, ...]; flat position i > 0 of a row belongs to the branch that starts at
// row position branch_start[i] >= 1, sits at the output position of its depth
// in the branch, and attends to the cache, the row's first position and its
// own branch up to itself.  The final features are in m.x.
static void decoder_rows(Model& m, State& st, int n, const int32_t* sent, const int32_t* row_len,
                         const int32_t* tokens, const std::vector<int>& off, int max_keys, const int32_t* bidir_from,
                         const int32_t* branch_start = nullptr, const float* add = nullptr) {
  const int C = m.cfg.C, H = m.cfg.H, D = m.D;
  auto keys = [&](int r, int t) {
    const int len = st.sents[sent[r]].len;
    if (branch_start != nullptr && t > 0) return len + 1;  // then the branch segment
    return (bidir_from != nullptr && t >= bidir_from[r]) ? len + row_len[r] : len + t + 1;
  };
  const int M = off[n];
  reserve_rows(m, M, max_keys);
  std::vector<int32_t> pos(M);
  for (int r = 0; r < n; ++r)
    for (int t = 0; t < row_len[r]; ++t) {
      const int depth = (branch_start != nullptr && t > 0) ? t - branch_start[off[r] + t] + 1 : t;
      pos[off[r] + t] = st.sents[sent[r]].len + depth;
    }
  embed(m, tokens, pos.data(), M, true, add);
  const bool pre = m.cfg.dec_normalize_before;
  float* x = m.x.data();
  for (size_t l = 0; l < m.dec.size(); ++l) {
    DecLayer& L = m.dec[l];
    // self-attention over the cache and the new positions (causal)
    const float* in = x;
    if (pre) {
      layer_norm_rows(x, m.h.data(), M, C, L.ln_self.w, L.ln_self.b, m.cfg.ln_eps);
      in = m.h.data();
    }
    linear(m.pool, L.qkv, in, C, M, m.kv.data(), 3 * C);
    for (int r = 0; r < n; ++r) {
      Sentence& s = st.sents[sent[r]];
      float* ck = s.self_k.data() + (size_t)l * s.cap * C;
      float* cv = s.self_v.data() + (size_t)l * s.cap * C;
      for (int t = 0; t < row_len[r]; ++t) {
        const float* kvr = m.kv.data() + (size_t)(off[r] + t) * 3 * C;
        std::copy(kvr + C, kvr + 2 * C, ck + (size_t)(s.len + t) * C);
        std::copy(kvr + 2 * C, kvr + 3 * C, cv + (size_t)(s.len + t) * C);
      }
    }
    for_rows(m, M, max_keys, [&](int row, float* scratch) {
      const int r = (int)(std::upper_bound(off.begin(), off.end(), row) - off.begin()) - 1, t = row - off[r];
      const Sentence& s = st.sents[sent[r]];
      const float* ck = s.self_k.data() + (size_t)l * s.cap * C;
      const float* cv = s.self_v.data() + (size_t)l * s.cap * C;
      float* qr = m.kv.data() + (size_t)row * 3 * C;
      for (int c = 0; c < C; ++c) qr[c] *= m.scaling;
      const int n1 = keys(r, t);
      int b0 = 0, n2 = 0;  // a tree row's branch segment: cache slots s.len + b0 .. s.len + t
      if (branch_start != nullptr && t > 0) {
        b0 = branch_start[row];
        n2 = t - b0 + 1;
      }
      const size_t seg = (size_t)(s.len + b0) * C;
      for (int hh = 0; hh < H; ++hh)
        attend(qr + hh * D, ck + hh * D, cv + hh * D, C, n1, D, m.q.data() + (size_t)row * C + hh * D,
               scratch, ck + seg + hh * D, cv + seg + hh * D, n2);
    });
    linear(m.pool, L.out, m.q.data(), C, M, m.a.data(), C);
    add_rows(x, m.a.data(), (size_t)M * C);
    if (!pre) layer_norm_rows(x, x, M, C, L.ln_self.w, L.ln_self.b, m.cfg.ln_eps);
    // encoder attention
    in = x;
    if (pre) {
      layer_norm_rows(x, m.h.data(), M, C, L.ln_cross.w, L.ln_cross.b, m.cfg.ln_eps);
      in = m.h.data();
    }
    linear(m.pool, L.cq, in, C, M, m.kv.data(), C);
    for_rows(m, M, max_keys, [&](int row, float* scratch) {
      const int r = (int)(std::upper_bound(off.begin(), off.end(), row) - off.begin()) - 1;
      const Sentence& s = st.sents[sent[r]];
      const float* ek = s.enc_k.data() + (size_t)l * s.src_len * C;
      const float* ev = s.enc_v.data() + (size_t)l * s.src_len * C;
      float* qr = m.kv.data() + (size_t)row * C;
      for (int c = 0; c < C; ++c) qr[c] *= m.scaling;
      for (int hh = 0; hh < H; ++hh)
        attend(qr + hh * D, ek + hh * D, ev + hh * D, C, s.src_len, D, m.q.data() + (size_t)row * C + hh * D,
               scratch);
    });
    linear(m.pool, L.cout, m.q.data(), C, M, m.a.data(), C);
    add_rows(x, m.a.data(), (size_t)M * C);
    if (!pre) layer_norm_rows(x, x, M, C, L.ln_cross.w, L.ln_cross.b, m.cfg.ln_eps);
    ffn(m, M, L.fc1, L.fc2, L.ln_ffn, pre);
  }
  if (m.dec_final.on) layer_norm_rows(x, x, M, C, m.dec_final.w, m.dec_final.b, m.cfg.ln_eps);

}

}  // namespace

static void put_stats(const fa::PoolStats& s, int64_t* out) {
  const int64_t v[6] = {s.calls, s.parallel, s.worker_items, s.waits, s.stalls, s.wait_ns};
  std::memcpy(out, v, sizeof v);
}

extern "C" {

int fa_version() { return 1; }

int fa_half_linears(void* mp) {
  Model& m = *static_cast<Model*>(mp);
  int n = m.proj.half;
  for (auto& L : m.enc) n += L.qkv.half + L.out.half + L.fc1.half + L.fc2.half;
  for (auto& L : m.dec) n += L.qkv.half + L.out.half + L.cq.half + L.ckv.half + L.cout.half + L.fc1.half + L.fc2.half;
  return n;
}

int fa_simd() {
#ifdef FA_AVX2
  return 1;
#else
  return 0;
#endif
}

int fa_int8_linears(void* mp) {
  Model& m = *static_cast<Model*>(mp);
  int n = m.proj.q8;
  for (auto& L : m.enc) n += L.qkv.q8 + L.out.q8 + L.fc1.q8 + L.fc2.q8;
  for (auto& L : m.dec) n += L.qkv.q8 + L.out.q8 + L.cq.q8 + L.ckv.q8 + L.cout.q8 + L.fc1.q8 + L.fc2.q8;
  return n;
}

// weights: see fairseq_aggressive/native/engine.py for the order.  For a linear
// layer at slot i (weight) and i + 1 (bias):
// wh[i]: the weight as float16 bits when every value of w[i] is a float16 value
//   (then stored and streamed at half the bytes, with identical results), else null;
// wq[i], ws[i]: int8 weights and per-row scales of an int8 layer (then w[i] is null)
void* fa_model_create(const Config* cfg, const float* const* w, const uint16_t* const* wh,
                      const int8_t* const* wq, const float* const* ws) {
  Model* m = new Model();
  m->cfg = *cfg;
  const int C = cfg->C, F = cfg->F;
  m->D = C / cfg->H;
  // fairseq: self.scaling = self.head_dim ** -0.5 (a Python float, rounded to fp32 in the product)
  m->scaling = (float)std::pow((double)m->D, -0.5);
  int i = 0;
  m->src_embed.assign(w[i], w[i] + (size_t)cfg->src_vocab * C); ++i;
  if (w[i]) m->src_pos.assign(w[i], w[i] + (size_t)cfg->src_positions * C); ++i;
  m->enc_ln_embed.set(w[i], w[i + 1], C); i += 2;
  m->enc_final.set(w[i], w[i + 1], C); i += 2;
  m->tgt_embed.assign(w[i], w[i] + (size_t)cfg->tgt_vocab * C); ++i;
  if (w[i]) m->tgt_pos.assign(w[i], w[i] + (size_t)cfg->tgt_positions * C); ++i;
  m->dec_ln_embed.set(w[i], w[i + 1], C); i += 2;
  m->dec_final.set(w[i], w[i + 1], C); i += 2;
  // n_parts linear layers (weight, bias slots from `at`), each n x k, stacked into one
  auto pack = [&](Linear& L, int n_parts, int at, int n, int k) {
    bool q8 = true, half = true;
    for (int p = 0; p < n_parts; ++p) {
      q8 = q8 && wq[at + 2 * p] != nullptr;
      half = half && wh[at + 2 * p] != nullptr;
    }
    const size_t sz = (size_t)n * k;
    std::vector<float> bias((size_t)n_parts * n, 0.f);
    bool has_bias = false;
    for (int p = 0; p < n_parts; ++p)
      if (w[at + 2 * p + 1]) {
        has_bias = true;
        std::copy(w[at + 2 * p + 1], w[at + 2 * p + 1] + n, bias.begin() + (size_t)p * n);
      }
    const float* bp = has_bias ? bias.data() : nullptr;
    if (q8) {
      std::vector<int8_t> cat((size_t)n_parts * sz);
      std::vector<float> scale((size_t)n_parts * n);
      for (int p = 0; p < n_parts; ++p) {
        std::copy(wq[at + 2 * p], wq[at + 2 * p] + sz, cat.begin() + p * sz);
        std::copy(ws[at + 2 * p], ws[at + 2 * p] + n, scale.begin() + (size_t)p * n);
      }
      L.pack_q8(cat.data(), scale.data(), bp, n_parts * n, k);
    } else {
      std::vector<float> cat((size_t)n_parts * sz);
      std::vector<uint16_t> cath(half ? (size_t)n_parts * sz : 0);
      for (int p = 0; p < n_parts; ++p) {
        std::copy(w[at + 2 * p], w[at + 2 * p] + sz, cat.begin() + p * sz);
        if (half) std::copy(wh[at + 2 * p], wh[at + 2 * p] + sz, cath.begin() + p * sz);
      }
      L.pack(cat.data(), half ? cath.data() : nullptr, bp, n_parts * n, k);
    }
  };
  pack(m->proj, 1, i, cfg->tgt_vocab, C); i += 2;
  // the parts every layer has, in the order engine.py lays them out
  auto self_attention = [&](Linear& qkv, Linear& out, Norm& ln) {  // q, k, v, out, norm
    pack(qkv, 3, i, C, C); i += 6;
    pack(out, 1, i, C, C); i += 2;
    ln.set(w[i], w[i + 1], C); i += 2;
  };
  auto feed_forward = [&](Linear& fc1, Linear& fc2, Norm& ln) {  // fc1, fc2, norm
    pack(fc1, 1, i, F, C); i += 2;
    pack(fc2, 1, i, C, F); i += 2;
    ln.set(w[i], w[i + 1], C); i += 2;
  };
  m->enc.resize(cfg->enc_layers);
  for (auto& L : m->enc) {
    self_attention(L.qkv, L.out, L.ln_attn);
    feed_forward(L.fc1, L.fc2, L.ln_ffn);
  }
  m->dec.resize(cfg->dec_layers);
  for (auto& L : m->dec) {
    self_attention(L.qkv, L.out, L.ln_self);
    pack(L.cq, 1, i, C, C); i += 2;  // encoder attention: q, k + v, out, norm
    pack(L.ckv, 2, i, C, C); i += 4;
    pack(L.cout, 1, i, C, C); i += 2;
    L.ln_cross.set(w[i], w[i + 1], C); i += 2;
    feed_forward(L.fc1, L.fc2, L.ln_ffn);
  }
  return m;
}

void fa_model_free(void* mp) { delete static_cast<Model*>(mp); }

void fa_set_threads(void* mp, int n) { static_cast<Model*>(mp)->pool.resize(n); }

// the pool's counters (fa::PoolStats, in its order): calls, parallel, worker_items,
// waits, stalls, wait_ns
void fa_pool_stats(void* mp, int64_t* out) { put_stats(static_cast<Model*>(mp)->pool.stats(), out); }

// A pool of `threads` runs `calls` calls of `items` items each; every item records
// that it ran.  In every `slow`-th call (0: none) the items the workers run sleep
// `slow_us` microseconds, as a descheduled worker would, and the caller gives the
// workers up to 2 ms to come before it takes its first item.  Returns the number of
// items that did not run exactly once (0 when the pool is right); its counters go
// to stats (6 values, as fa_pool_stats).
int64_t fa_pool_selftest(int threads, int calls, int items, int slow, int slow_us, int64_t* stats) {
  Pool pool(threads);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> hits(items);
  std::atomic<int> worker_came{0};
  int64_t bad = 0;
  for (int c = 0; c < calls; ++c) {
    for (auto& h : hits) h.store(0, std::memory_order_relaxed);
    worker_came.store(0, std::memory_order_relaxed);
    const bool slow_call = slow > 0 && c % slow == 0;
    bool caller_waited = false;
    pool.run([&](int i) {
      const bool on_caller = std::this_thread::get_id() == caller;
      if (slow_call && on_caller && !caller_waited) {
        caller_waited = true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
        while (worker_came.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
      }
      if (!on_caller) worker_came.store(1, std::memory_order_release);
      hits[i].fetch_add(1, std::memory_order_relaxed);
      volatile uint64_t spin = 0;
      for (int j = 0; j < 200; ++j) spin = spin + j;  // an item's work: about a microsecond
      if (slow_call && !on_caller) std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
    }, items);
    for (auto& h : hits) bad += h.load(std::memory_order_relaxed) != 1;
  }
  if (stats != nullptr) put_stats(pool.stats(), stats);
  return bad;
}

// Encode B sentences (tokens without padding, concatenated; lengths src_len)
// and allocate decoder caches for cap positions each.
void* fa_begin(void* mp, int B, const int32_t* tokens, const int32_t* src_len, int cap) {
  Model& m = *static_cast<Model*>(mp);
  const int C = m.cfg.C, H = m.cfg.H, D = m.D;
  State* st = new State();
  st->sents.resize(B);
  int M = 0, max_s = 0;
  for (int b = 0; b < B; ++b) {
    M += src_len[b];
    max_s = std::max(max_s, (int)src_len[b]);
  }
  reserve_rows(m, M, max_s);
  std::vector<int32_t> pos(M);
  std::vector<int> start(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    start[b + 1] = start[b] + src_len[b];
    for (int t = 0; t < src_len[b]; ++t) pos[start[b] + t] = t;
  }
  embed(m, tokens, pos.data(), M, false);
  const bool pre = m.cfg.enc_normalize_before;
  float* x = m.x.data();
  for (auto& L : m.enc) {
    const float* in = x;
    if (pre) {
      layer_norm_rows(x, m.h.data(), M, C, L.ln_attn.w, L.ln_attn.b, m.cfg.ln_eps);
      in = m.h.data();
    }
    linear(m.pool, L.qkv, in, C, M, m.kv.data(), 3 * C);
    float* qkv = m.kv.data();
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < C; ++c) qkv[(size_t)r * 3 * C + c] *= m.scaling;
    for_rows(m, M, max_s, [&](int row, float* scratch) {
      const int b = (int)(std::upper_bound(start.begin(), start.end(), row) - start.begin()) - 1;
      const int s0 = start[b], S = src_len[b];
      for (int hh = 0; hh < H; ++hh)
        attend(qkv + (size_t)row * 3 * C + hh * D, qkv + (size_t)s0 * 3 * C + C + hh * D,
               qkv + (size_t)s0 * 3 * C + 2 * C + hh * D, (size_t)3 * C, S, D,
               m.q.data() + (size_t)row * C + hh * D, scratch);
    });
    linear(m.pool, L.out, m.q.data(), C, M, m.a.data(), C);
    add_rows(x, m.a.data(), (size_t)M * C);
    if (!pre) layer_norm_rows(x, x, M, C, L.ln_attn.w, L.ln_attn.b, m.cfg.ln_eps);
    ffn(m, M, L.fc1, L.fc2, L.ln_ffn, pre);
  }
  if (m.enc_final.on) layer_norm_rows(x, x, M, C, m.enc_final.w, m.enc_final.b, m.cfg.ln_eps);
  init_state(m, *st, B, src_len, x, cap);
  return st;
}

void fa_state_free(void* sp) { delete static_cast<State*>(sp); }

// Vocabulary shortlist (approximate decoding, Devlin 2017): every sentence of
// a batch chooses among output ids [0, n) (the special symbols and the most
// frequent tokens: fairseq dictionaries are sorted by frequency) and its own
// ids set by fa_shortlist; log-probs are normalized over that set.
// fa_shortlist_common(n): n = 0 turns it off; -1 if n does not cover the special symbols.
int fa_shortlist_common(void* mp, int n) {
  Model& m = *static_cast<Model*>(mp);
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
  gather_rows(m.proj, ids.data(), n, m.sl_common);
  m.sl_n = n;
  return 0;
}

// Sentence b of a batch (after fa_shortlist_common): its ids beyond the common
// ones, ascending, each in [n_common, vocab); -1 if not.  Once any sentence of
// the batch has been given a list, the whole batch decodes on the shortlist.
int fa_shortlist(void* mp, void* sp, int b, int n, const int32_t* ids) {
  Model& m = *static_cast<Model*>(mp);
  State& st = *static_cast<State*>(sp);
  if (m.sl_n == 0 || b < 0 || b >= (int)st.sents.size() || n < 0) return -1;
  for (int i = 0; i < n; ++i)
    if (ids[i] < m.sl_n || ids[i] >= m.cfg.tgt_vocab || (i > 0 && ids[i] <= ids[i - 1])) return -1;
  Sentence& s = st.sents[b];
  s.sl_ids.assign(ids, ids + n);
  if (n > 0) gather_rows(m.proj, ids, n, s.sl_extra);
  st.shortlist = true;
  return 0;
}

// The encoder output of the batch (sum of src_len rows x C, sentences in order)
// into out; the number of floats written.  A drafter that shares the
// verifier's encoder reads it (GAD with a --shared-encoder drafter).
int64_t fa_encoder_out(void* sp, float* out) {
  const State& st = *static_cast<State*>(sp);
  std::copy(st.enc_out.begin(), st.enc_out.end(), out);
  return (int64_t)st.enc_out.size();
}

int fa_length(void* sp, int b) { return static_cast<State*>(sp)->sents[b].len; }

// One verification pass.  For each of n rows: sentence sent[r], row_len[r]
// tokens (the last emitted token followed by the drafted tokens),
// concatenated in tokens.  Without n_branch a row's draft is one branch; with
// it, row r holds n_branch[r] drafts one after the other (their lengths in
// branch_len, all rows' concatenated), each a continuation of the last token
// (a tree row, see decoder_rows).  Runs the decoder over the rows on top of
// each sentence's cache, chooses greedy's token at each position (fairseq's
// adjustments: pad never, unk penalty, only EOS at max_len, no EOS before
// min_len), accepts along each branch the leading drafted tokens that equal
// the choices, keeps the branch that accepted most (the first of equals),
// emits its accepted tokens plus the choice at its first mismatch, cut after
// EOS, and commits the cache (the kept branch's keys and values move right
// after the last token).  Outputs per row: n_emit, n_match, done, winner (if
// given); choice and score of the emitted tokens from the row's offset in the
// concatenation, and (if feats is given) the decoder features (C floats, after
// the last layer norm) each emitted token was chosen from, at the same offsets.
// beta > 1 accepts GAD++'s way instead (Xia et al. 2023): a drafted token passes
// if fewer than beta tokens score strictly higher than it and its score is
// within tau of the top one's (fairseq's adjusted log-probabilities; accepted
// slots emit the drafted token, the first rejected one greedy's choice).
// -1 (nothing changed) if a row does not fit its sentence's cache or its
// branches do not add up to it.
int fa_pass(void* mp, void* sp, int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
            int max_len, int min_len, float unk_penalty, float temperature, int beta, float tau,
            int32_t* choice, float* score,
            int32_t* n_emit, int32_t* n_match, int32_t* done, const int32_t* n_branch, const int32_t* branch_len,
            int32_t* winner, float* feats) {
  Model& m = *static_cast<Model*>(mp);
  State& st = *static_cast<State*>(sp);
  const int C = m.cfg.C, V = m.cfg.tgt_vocab;
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int> off(n + 1, 0), first_branch(n + 1, 0), b_start, b_len;
  int max_keys = 0;
  bool tree = false;
  for (int r = 0, k = 0; r < n; ++r) {
    const Sentence& s = st.sents[sent[r]];
    if (row_len[r] < 1 || s.len + row_len[r] > s.cap) return -1;
    const int nb = n_branch ? n_branch[r] : 1;
    if (nb < 1) return -1;
    tree = tree || nb > 1;
    int used = 1;
    for (int i = 0; i < nb; ++i) {
      const int L = n_branch ? branch_len[k++] : row_len[r] - 1;
      if (L < 0 || (nb > 1 && L < 1)) return -1;
      b_start.push_back(used);
      b_len.push_back(L);
      used += L;
    }
    if (used != row_len[r]) return -1;
    first_branch[r + 1] = (int)b_start.size();
    off[r + 1] = off[r] + row_len[r];
    max_keys = std::max(max_keys, std::max(s.len + row_len[r], s.src_len));
  }
  const int M = off[n], NB = (int)b_start.size();
  std::vector<int32_t> bstart;
  if (tree) {  // per flat position: the row position its branch starts at
    bstart.assign(M, 0);
    for (int r = 0; r < n; ++r)
      for (int i = first_branch[r]; i < first_branch[r + 1]; ++i)
        for (int t = 0; t < b_len[i]; ++t) bstart[off[r] + b_start[i] + t] = b_start[i];
  }
  decoder_rows(m, st, n, sent, row_len, tokens, off, max_keys, nullptr, tree ? bstart.data() : nullptr);
  float* x = m.x.data();
  std::vector<int> row_of(NB);
  for (int r = 0; r < n; ++r)
    for (int i = first_branch[r]; i < first_branch[r + 1]; ++i) row_of[i] = r;
  // flat position of path index j of branch i: the last token, then the branch
  auto path = [&](int i, int j) { return off[row_of[i]] + (j == 0 ? 0 : b_start[i] + j - 1); };

  // project chunks of the positions still on a matching path (8, 16, 32, ...;
  // a tree row first projects its last token only, which every branch shares);
  // the logits of flat position p are row at[p] of m.logits
  std::vector<int> checked(NB, 0), matched(NB, 0), open(NB, 1), at(M, -1), column(M, 0), queued(M, 0);
  std::vector<int32_t> chosen(M, 0);
  std::vector<int> todo;
  int arena = 0;
  // the column of token id tok in the logits of sentence s (-1: not projected)
  auto column_of = [&](const Sentence& s, int tok) {
    if (tok < 0 || tok >= V) return -1;
    if (!st.shortlist || tok < m.sl_n) return tok;
    auto it = std::lower_bound(s.sl_ids.begin(), s.sl_ids.end(), tok);
    return it != s.sl_ids.end() && *it == tok ? m.sl_n + (int)(it - s.sl_ids.begin()) : -1;
  };
  // adjusted score of column v (pad never, unk penalty, only EOS at max_len, no EOS before min_len)
  auto adjusted = [&](const float* lg, int v, int out_pos) {
    if (v == m.cfg.pad || (out_pos >= max_len && v != m.cfg.eos) || (out_pos < min_len && v == m.cfg.eos))
      return ninf;
    return v == m.cfg.unk ? lg[v] - unk_penalty : lg[v];
  };
  // where the flat position p of row r predicts output position s.len + out_step
  auto out_step = [&](int r, int p) {
    const int t = p - off[r];
    return tree && t > 0 ? t - bstart[p] + 1 : t;
  };
  // GAD++: whether the drafted token tok passes at flat position p of row r (beta > 1)
  auto rank_pass = [&](int r, int p, int tok) {
    const Sentence& s = st.sents[sent[r]];
    const int col = column_of(s, tok);
    if (col < 0) return false;
    const int W = st.shortlist ? m.sl_n + (int)s.sl_ids.size() : V, out_pos = s.len + out_step(r, p);
    const float* lg = m.logits.data() + (size_t)at[p] * V;
    const float a = adjusted(lg, col, out_pos);
    if (a == ninf || a < adjusted(lg, column[p], out_pos) - tau) return false;
    int better = 0;
    for (int v = 0; v < W && better < beta; ++v) better += adjusted(lg, v, out_pos) > a;
    return better < beta;
  };
  for (int round = 0;; ++round) {
    todo.clear();
    for (int i = 0; i < NB; ++i) {
      if (!open[i]) continue;
      const int r = row_of[i];
      const bool shared_first = first_branch[r + 1] - first_branch[r] > 1;
      const int sz = !shared_first ? 8 << std::min(round, 20) : round == 0 ? 1 : 8 << std::min(round - 1, 20);
      for (int j = checked[i]; j < std::min(b_len[i] + 1, checked[i] + sz); ++j) {
        const int p = path(i, j);
        if (at[p] < 0 && !queued[p]) {
          queued[p] = 1;
          todo.push_back(p);
        }
      }
    }
    if (todo.empty()) break;
    std::sort(todo.begin(), todo.end());  // grouped by row (a sentence's shortlist rows are its own)
    const int cnt = (int)todo.size();
    ensure(m.h, (size_t)cnt * C);
    for (int k = 0; k < cnt; ++k) {
      std::copy(x + (size_t)todo[k] * C, x + (size_t)(todo[k] + 1) * C, m.h.data() + (size_t)k * C);
      at[todo[k]] = arena + k;
    }
    ensure(m.logits, (size_t)(arena + cnt) * V);
    float* out = m.logits.data() + (size_t)arena * V;
    if (!st.shortlist) {
      linear(m.pool, m.proj, m.h.data(), C, cnt, out, V);
    } else {  // a row's logits: the common rows, then its sentence's own rows (ascending ids)
      linear(m.pool, m.sl_common, m.h.data(), C, cnt, out, V);
      for (int k0 = 0; k0 < cnt;) {
        const int r = (int)(std::upper_bound(off.begin(), off.end(), todo[k0]) - off.begin()) - 1;
        int k1 = k0;
        while (k1 < cnt && todo[k1] < off[r + 1]) ++k1;
        if (!st.sents[sent[r]].sl_ids.empty())
          linear(m.pool, st.sents[sent[r]].sl_extra, m.h.data() + (size_t)k0 * C, C, k1 - k0,
                 out + (size_t)k0 * V + m.sl_n, V);
        k0 = k1;
      }
    }
    arena += cnt;
    for (int k = 0; k < cnt; ++k) {  // greedy's choice at each projected position
      const int p = todo[k];
      const int r = (int)(std::upper_bound(off.begin(), off.end(), p) - off.begin()) - 1;
      const Sentence& s = st.sents[sent[r]];
      const int W = st.shortlist ? m.sl_n + (int)s.sl_ids.size() : V;  // logits in the row
      float* lg = m.logits.data() + (size_t)at[p] * V;
      if (temperature != 1.f)
        for (int v = 0; v < W; ++v) lg[v] = lg[v] / temperature;
      const int t = p - off[r];
      const int out_pos = s.len + (tree && t > 0 ? t - bstart[p] + 1 : t);
      int u;  // the chosen column; the special symbols' columns are their ids
      if (out_pos >= max_len) {
        u = m.cfg.eos;
      } else {  // greedy's choice among the adjusted logits
        const int special[3] = {m.cfg.pad, m.cfg.unk, m.cfg.eos};
        float saved[3];
        for (int i = 0; i < 3; ++i) saved[i] = lg[special[i]];
        lg[m.cfg.unk] = lg[m.cfg.unk] - unk_penalty;
        lg[m.cfg.pad] = ninf;
        if (out_pos < min_len) lg[m.cfg.eos] = ninf;
        u = argmax_first(lg, W);  // columns ascend by id: ties go to the lowest id, as without a shortlist
        for (int i = 2; i >= 0; --i) lg[special[i]] = saved[i];
      }
      column[p] = u;
      chosen[p] = (st.shortlist && u >= m.sl_n) ? s.sl_ids[u - m.sl_n] : u;
    }
    for (int i = 0; i < NB; ++i) {  // walk each open branch as far as its projected positions go
      while (open[i] && checked[i] <= b_len[i] && at[path(i, checked[i])] >= 0) {
        const int j = checked[i]++;
        const int p = path(i, j), r = row_of[i];
        const int drafted = j < b_len[i] ? tokens[off[r] + b_start[i] + j] : -1;
        if (j < b_len[i] && (beta > 1 ? rank_pass(r, p, drafted) : chosen[p] == drafted)) {
          matched[i] = j + 1;
        } else {
          open[i] = 0;
        }
      }
      if (checked[i] > b_len[i]) open[i] = 0;
    }
  }
  // per row: the winning branch; emit, cut after EOS, scores, commit
  const int nl = (int)m.dec.size();
  for (int r = 0; r < n; ++r) {
    Sentence& s = st.sents[sent[r]];
    int w = first_branch[r];
    for (int i = first_branch[r] + 1; i < first_branch[r + 1]; ++i)
      if (matched[i] > matched[w]) w = i;
    // accepted slots emit the drafted tokens (greedy's choices there unless beta > 1)
    auto emitted = [&](int j) { return j < matched[w] ? tokens[off[r] + b_start[w] + j] : chosen[path(w, j)]; };
    int ne = matched[w] + 1, fin = 0;
    for (int j = 0; j < ne; ++j)
      if (emitted(j) == m.cfg.eos) {
        ne = j + 1;
        fin = 1;
        break;
      }
    const int W = st.shortlist ? m.sl_n + (int)s.sl_ids.size() : V;
    for (int j = 0; j < ne; ++j) {
      const int p = path(w, j);
      const float* lg = m.logits.data() + (size_t)at[p] * V;
      float lse = logsumexp(lg, W);
      int c = emitted(j);
      float val = lg[c == chosen[p] ? column[p] : column_of(s, c)];
      if (c == m.cfg.unk) val = val - unk_penalty;
      choice[off[r] + j] = c;
      score[off[r] + j] = val - lse;
      if (feats != nullptr) std::copy(x + (size_t)p * C, x + (size_t)(p + 1) * C, feats + (size_t)(off[r] + j) * C);
    }
    if (b_start[w] != 1)  // the kept branch's cache entries follow the last token
      for (int l = 0; l < nl; ++l) {
        float* ck = s.self_k.data() + (size_t)l * s.cap * C;
        float* cv = s.self_v.data() + (size_t)l * s.cap * C;
        for (int j = 0; j < ne - 1; ++j) {
          const size_t from = (size_t)(s.len + b_start[w] + j) * C, to = (size_t)(s.len + 1 + j) * C;
          std::copy(ck + from, ck + from + C, ck + to);
          std::copy(cv + from, cv + from + C, cv + to);
        }
      }
    n_emit[r] = ne;
    n_match[r] = matched[w];
    done[r] = fin;
    if (winner != nullptr) winner[r] = w - first_branch[r];
    s.len += ne;
  }
  return 0;
}

// ------------------------------------------------------------- block drafter
// A block_nat drafter (GAD) in the engine: its decoder over [prefix, k slots]
// where the slots (target id -1) read the mask embedding and attend to the
// whole row.  With a causal prefix (--block-causal-prefix) the prefix's keys
// and values stay cached across passes and a pass runs only the new prefix
// tokens and the slots; without, every pass runs the whole row bidirectionally
// from an empty cache.  Proposals, not verification: float rounding may make
// them differ from the torch drafter's.

// The slot input vector (C floats) of a block drafter.
void fa_set_mask_embed(void* mp, const float* v) {
  Model& m = *static_cast<Model*>(mp);
  m.mask_embed.assign(v, v + m.cfg.C);
}

// A --verifier-features drafter's projection (C x n_in weights W, bias b) of
// the verifier's features into its prefix inputs.
void fa_set_feature_proj(void* mp, const float* W, const float* b, int n_in) {
  Model& m = *static_cast<Model*>(mp);
  m.feat_proj.pack(W, nullptr, b, m.cfg.C, n_in);
}

// A state from an encoder output computed elsewhere (the verifier's, for a
// --shared-encoder drafter): rows of the B sentences concatenated (src_len[b]
// rows of C floats each).
void* fa_begin_encoded(void* mp, int B, const float* enc_out, const int32_t* src_len, int cap) {
  Model& m = *static_cast<Model*>(mp);
  State* st = new State();
  init_state(m, *st, B, src_len, enc_out, cap);
  return st;
}

// One drafting pass over n rows: sentence sent[r]; row_len[r] prefix tokens
// not yet in its cache, then k slots.  causal: keep the prefix tokens in the
// cache (the next pass sends only newer ones); else the row is the whole
// prefix, bidirectional, and nothing stays.  out[r * k + i]: the argmax of
// slot i (padding excluded, the first maximum).  feats (or null), for a
// --verifier-features drafter: per prefix token sent (rows concatenated) the
// verifier's features that chose it (n_in floats, zeros for BOS); their
// projection (fa_set_feature_proj) is added to the token's input before the
// embedding layer norm; the slots get none.  -1 if a row does not fit.
int fa_draft(void* mp, void* sp, int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
             int k, int causal, int32_t* out, const float* feats) {
  Model& m = *static_cast<Model*>(mp);
  State& st = *static_cast<State*>(sp);
  const int C = m.cfg.C, V = m.cfg.tgt_vocab;
  if (m.mask_embed.empty() || k < 1 || (feats != nullptr && m.feat_proj.N == 0)) return -1;
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
    linear(m.pool, m.feat_proj, feats, m.feat_proj.K, sent_tokens, proj.data(), C);
    adds.assign((size_t)off[n] * C, 0.f);
    for (int r = 0, j = 0; r < n; j += row_len[r], ++r)
      std::copy(proj.data() + (size_t)j * C, proj.data() + (size_t)(j + row_len[r]) * C,
                adds.data() + (size_t)off[r] * C);
  }
  decoder_rows(m, st, n, sent, full.data(), toks.data(), off, max_keys, bidir.data(), nullptr,
               feats != nullptr ? adds.data() : nullptr);
  float* x = m.x.data();
  ensure(m.h, (size_t)n * k * C);
  for (int r = 0; r < n; ++r)
    std::copy(x + (size_t)(off[r] + row_len[r]) * C, x + (size_t)off[r + 1] * C, m.h.data() + (size_t)r * k * C);
  ensure(m.logits, (size_t)n * k * V);
  if (!st.shortlist) {
    linear(m.pool, m.proj, m.h.data(), C, n * k, m.logits.data(), V);
  } else {  // the shortlist (fa_shortlist): common rows, then the sentence's own
    linear(m.pool, m.sl_common, m.h.data(), C, n * k, m.logits.data(), V);
    for (int r = 0; r < n; ++r) {
      const Sentence& s = st.sents[sent[r]];
      if (!s.sl_ids.empty())
        linear(m.pool, s.sl_extra, m.h.data() + (size_t)r * k * C, C, k, m.logits.data() + (size_t)r * k * V + m.sl_n, V);
    }
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < n; ++r) {
    const Sentence& s = st.sents[sent[r]];
    const int W = st.shortlist ? m.sl_n + (int)s.sl_ids.size() : V;
    for (int i = r * k; i < (r + 1) * k; ++i) {
      float* lg = m.logits.data() + (size_t)i * V;
      lg[m.cfg.pad] = ninf;
      const int u = argmax_first(lg, W);
      out[i] = (st.shortlist && u >= m.sl_n) ? s.sl_ids[u - m.sl_n] : u;
    }
  }
  for (int r = 0; r < n; ++r) {
    Sentence& s = st.sents[sent[r]];
    s.len = causal ? s.len + row_len[r] : 0;
  }
  return 0;
}

}  // extern "C"
