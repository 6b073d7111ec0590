// Eight float lanes (V8) and the scalar helpers every kernel shares: exp with a
// fixed operation sequence, IEEE half -> float, and the int8 pair product of
// the int8 kernels.
//
// With AVX2 + FMA (+ F16C) the lanes are one __m256 register; otherwise (the
// generic build, -DFA_GENERIC, and non-x86 CPUs) they are 8 floats processed
// one at a time with the same IEEE operations in the same order (std::fma for
// the fused multiply-adds), so both builds give bit-identical results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && !defined(FA_GENERIC)
#include <immintrin.h>
#define FA_AVX2 1
#endif

namespace fa {

constexpr int LANES = 8;  // outputs per packed weight panel, floats per V8

// IEEE half -> float (exact; the generic build's F16C replacement)
inline float half_to_float(uint16_t h) {
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

// exp with a fixed sequence of operations (Cody-Waite reduction, degree-6
// polynomial); ~1 ulp, the same on every machine.  Branch-free so that loops
// over it vectorize; inputs below -87.3 give 0 (callers pass x <= 0).
inline float fexp(float x) {
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

#ifdef FA_AVX2
struct V8 {
  __m256 v;
};
inline V8 vzero() { return {_mm256_setzero_ps()}; }
inline V8 vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V8 vload(const uint16_t* p) { return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p))}; }
inline V8 vbcast(float a) { return {_mm256_set1_ps(a)}; }
inline V8 vfma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline void vstore(float* p, V8 a) { _mm256_storeu_ps(p, a.v); }
inline V8 vadd(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V8 vmax(V8 a, V8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// fexp on 8 lanes, the same operations in the same order
inline V8 vexp(V8 xv) {
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

// int8 products: 8 int32 lanes accumulating, per k pair (2k, 2k + 1), the
// products of two int16 activations with the 8 lanes' two int8 weights.
struct Q8Acc {
  __m256i v;
};
struct Q8Weights {  // one k pair of one panel: 16 int8 weights widened to int16
  __m256i v;
};
inline Q8Acc q8_zero() { return {_mm256_setzero_si256()}; }
inline Q8Weights q8_load(const int8_t* p) { return {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p))}; }
struct Q8Pair {  // two int16 activations, broadcast
  __m256i v;
};
inline Q8Pair q8_pair(const int16_t* x) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return {_mm256_set1_epi32(pair)};
}
inline Q8Acc q8_madd(Q8Pair a, Q8Weights w, Q8Acc acc) { return {_mm256_add_epi32(acc.v, _mm256_madd_epi16(a.v, w.v))}; }
inline void q8_store(int32_t* p, Q8Acc a) { _mm256_storeu_si256((__m256i*)p, a.v); }
#else
struct V8 {
  float v[LANES];
};
inline V8 vzero() { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = 0.f; return r; }
inline V8 vload(const float* p) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = p[i]; return r; }
inline V8 vload(const uint16_t* p) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = half_to_float(p[i]); return r; }
inline V8 vbcast(float a) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = a; return r; }
inline V8 vfma(V8 a, V8 b, V8 c) {
  V8 r;
  for (int i = 0; i < LANES; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}
inline void vstore(float* p, V8 a) { for (int i = 0; i < LANES; ++i) p[i] = a.v[i]; }
inline V8 vadd(V8 a, V8 b) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
inline V8 vmax(V8 a, V8 b) {
  V8 r;
  for (int i = 0; i < LANES; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return r;
}
inline V8 vexp(V8 x) { V8 r; for (int i = 0; i < LANES; ++i) r.v[i] = fexp(x.v[i]); return r; }

// int8 products (integer arithmetic is exact, so the lane-at-a-time version
// gives the same sums)
struct Q8Acc {
  int32_t v[LANES];
};
struct Q8Weights {
  const int8_t* p;  // lane l's weights for k = 2j, 2j + 1 at p[2l], p[2l + 1]
};
struct Q8Pair {
  int32_t a0, a1;
};
inline Q8Acc q8_zero() { Q8Acc r; for (int l = 0; l < LANES; ++l) r.v[l] = 0; return r; }
inline Q8Weights q8_load(const int8_t* p) { return {p}; }
inline Q8Pair q8_pair(const int16_t* x) { return {x[0], x[1]}; }
inline Q8Acc q8_madd(Q8Pair a, Q8Weights w, Q8Acc acc) {
  for (int l = 0; l < LANES; ++l) acc.v[l] += a.a0 * w.p[2 * l] + a.a1 * w.p[2 * l + 1];
  return acc;
}
inline void q8_store(int32_t* p, Q8Acc a) { for (int l = 0; l < LANES; ++l) p[l] = a.v[l]; }
#endif

}  // namespace fa
