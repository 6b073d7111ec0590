// AVX2 + FMA (+ F16C) specializations: 8 float lanes in one __m256, and the
// int8 pair products with vpmaddwd.  Each operation is the generic one's
// (vec_generic.h) on all lanes at once.
#pragma once

#include "cpu/intrinsics.h"

#include <cstring>

namespace fa {

template <>
struct VecF<8> {
  __m256 v;
  static VecF zero() { return {_mm256_setzero_ps()}; }
  static VecF load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecF load(const uint16_t* p) { return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p))}; }
  // a load kept apart from the multiply-adds that use it (vec.h: load_kept)
  static VecF load_kept(const float* p) {
    __m256 r;
    asm("vmovups %1, %0" : "=x"(r) : "m"(*(const __m256*)p));
    return {r};
  }
  static VecF load_kept(const uint16_t* p) { return load(p); }  // a conversion: already its own instruction
  static VecF bcast(float a) { return {_mm256_set1_ps(a)}; }
  static VecF fma(VecF a, VecF b, VecF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static VecF add(VecF a, VecF b) { return {_mm256_add_ps(a.v, b.v)}; }
  static VecF sub(VecF a, VecF b) { return {_mm256_sub_ps(a.v, b.v)}; }
  static VecF mul(VecF a, VecF b) { return {_mm256_mul_ps(a.v, b.v)}; }
  static VecF div(VecF a, VecF b) { return {_mm256_div_ps(a.v, b.v)}; }
  static VecF max(VecF a, VecF b) { return {_mm256_max_ps(a.v, b.v)}; }
  // bit l set where lane l of a equals lane l of b
  static unsigned equal_lanes(VecF a, VecF b) {
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ));
  }
  // bit l set where lane l of a is at least lane l of b (NaN: not set)
  static unsigned at_least_lanes(VecF a, VecF b) {
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a.v, b.v, _CMP_GE_OQ));
  }
  // fexp on 8 lanes, the same operations in the same order
  static VecF exp(VecF xv) {
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
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  // r[i] lane j <- r[j] lane i (8 x 8; moves only)
  static void transpose(VecF* r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i].v, r[i + 1].v);
      t[i + 1] = _mm256_unpackhi_ps(r[i].v, r[i + 1].v);
    }
    for (int i = 0; i < 8; i += 4)  // u[i + c]: column c (low half) and c + 4 of rows i .. i + 3
      for (int h = 0; h < 2; ++h) {
        u[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], _MM_SHUFFLE(3, 2, 3, 2));
      }
    for (int i = 0; i < 4; ++i) {
      r[i].v = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      r[i + 4].v = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }
};

// int8 pairs on 8 lanes: 16 int8 weights widened to int16, two int16
// activations broadcast, vpmaddwd into 8 int32 sums
template <>
struct Q8<8, 2> {
  using In = int16_t;
  struct Acc {
    __m256i v;
  };
  struct Weights {
    __m256i v;
  };
  struct Group {
    __m256i v;
  };
  static Acc zero() { return {_mm256_setzero_si256()}; }
  static Weights load(const int8_t* p) { return {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p))}; }
  static Weights load_kept(const int8_t* p) { return load(p); }  // a conversion: already its own instruction
  static Group group(const In* x) {
    int32_t pair;
    std::memcpy(&pair, x, 4);
    return {_mm256_set1_epi32(pair)};
  }
  static Acc madd(Group a, Weights w, Acc acc) { return {_mm256_add_epi32(acc.v, _mm256_madd_epi16(a.v, w.v))}; }
  static void store(int32_t* p, Acc a) { _mm256_storeu_si256((__m256i*)p, a.v); }
  // 8 activations' levels (q8_level's operations, vec_generic.h), as int16
  static void quantize(const float* x, float inv, In* q) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), _mm256_set1_ps(inv)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 c = _mm256_min_ps(_mm256_set1_ps(127.f), _mm256_max_ps(_mm256_set1_ps(-127.f), v));
    const __m256i i = _mm256_cvtps_epi32(c);
    _mm_storeu_si128((__m128i*)q, _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1)));
  }
  static VecF<8> to_float(const int32_t* sums, const int32_t*) {  // offset 0
    return {_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)sums))};
  }
};

}  // namespace fa
