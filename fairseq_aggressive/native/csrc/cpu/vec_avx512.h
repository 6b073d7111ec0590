// AVX-512 (F, BW, VL) specializations for the linear layers' 16-output panels:
// 16 float lanes in one __m512 (the same fused multiply-add per lane as every
// other target), int8 pairs with vpmaddwd, and with VNNI int8 quads with
// vpdpbusd (uint8 activations x int8 weights, four products summed exactly per
// int32 lane).  Row operations stay on 8 lanes (vec_avx.h).
#pragma once

#include "cpu/intrinsics.h"

#include <cstring>

namespace fa {

template <>
struct VecF<16> {
  __m512 v;
  static VecF zero() { return {_mm512_setzero_ps()}; }
  static VecF load(const float* p) { return {_mm512_loadu_ps(p)}; }
  // (the zero-masked forms here and in to_float: GCC 12 warns about the
  // unmasked ones' undefined source; every lane is converted either way)
  static VecF load(const uint16_t* p) {
    return {_mm512_maskz_cvtph_ps((__mmask16)0xffff, _mm256_loadu_si256((const __m256i*)p))};
  }
  // a load kept apart from the multiply-adds that use it (vec.h: load_kept)
  static VecF load_kept(const float* p) {
    __m512 r;
    asm("vmovups %1, %0" : "=v"(r) : "m"(*(const __m512*)p));
    return {r};
  }
  static VecF load_kept(const uint16_t* p) { return load(p); }  // a conversion: already its own instruction
  static VecF bcast(float a) { return {_mm512_set1_ps(a)}; }
  static VecF fma(VecF a, VecF b, VecF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static VecF add(VecF a, VecF b) { return {_mm512_add_ps(a.v, b.v)}; }
  static VecF mul(VecF a, VecF b) { return {_mm512_mul_ps(a.v, b.v)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  // fexp on 16 lanes, the same operations in the same order as VecF<8>::exp
  // (vec_avx.h), so each lane is the same bits
  static VecF exp(VecF xv) {
    __m512 x = xv.v;
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.3981999507e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.f));
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    return {_mm512_mask_blend_ps(tiny, y, _mm512_setzero_ps())};
  }
  // lanes 0-7 and 8-15
  VecF<8> low() const { return {_mm512_castps512_ps256(v)}; }
  VecF<8> high() const { return {_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))}; }
};

// 16 activations' int8 levels: round_half_even(x * inv) clamped to [-127, 127],
// as int32 (q8_level's operations, vec_generic.h: max(-127, v), then min(127, v))
inline __m512i q8_levels(const float* x, float inv) {
  const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(inv)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(127.f), _mm512_max_ps(_mm512_set1_ps(-127.f), v));
  return _mm512_cvtps_epi32(c);  // an integral value: exact
}

template <>
struct Q8<16, 2> {
  using In = int16_t;
  struct Acc {
    __m512i v;
  };
  struct Weights {
    __m512i v;
  };
  struct Group {
    __m512i v;
  };
  static Acc zero() { return {_mm512_setzero_si512()}; }
  static Weights load(const int8_t* p) { return {_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p))}; }
  static Weights load_kept(const int8_t* p) { return load(p); }  // a conversion: already its own instruction
  static Group group(const In* x) {
    int32_t pair;
    std::memcpy(&pair, x, 4);
    return {_mm512_set1_epi32(pair)};
  }
  static Acc madd(Group a, Weights w, Acc acc) { return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(a.v, w.v))}; }
  static void store(int32_t* p, Acc a) { _mm512_storeu_si512((void*)p, a.v); }
  static void quantize(const float* x, float inv, In* q) {
    _mm256_storeu_si256((__m256i*)q, _mm512_cvtepi32_epi16(q8_levels(x, inv)));
  }
  static VecF<16> to_float(const int32_t* sums, const int32_t*) {  // offset 0
    return {_mm512_maskz_cvtepi32_ps((__mmask16)0xffff, _mm512_loadu_si512((const void*)sums))};
  }
};

#ifdef FA_VNNI
template <>
struct Q8<16, 4> {
  using In = uint8_t;
  struct Acc {
    __m512i v;
  };
  struct Weights {
    __m512i v;
  };
  struct Group {
    __m512i v;
  };
  static Acc zero() { return {_mm512_setzero_si512()}; }
  static Weights load(const int8_t* p) { return {_mm512_loadu_si512((const void*)p)}; }
  // a load kept apart from the multiply-adds that use it (vec.h: load_kept)
  static Weights load_kept(const int8_t* p) {
    __m512i r;
    asm("vmovdqu64 %1, %0" : "=v"(r) : "m"(*(const __m512i*)p));
    return {r};
  }
  static Group group(const In* x) {
    int32_t quad;
    std::memcpy(&quad, x, 4);
    return {_mm512_set1_epi32(quad)};
  }
  static Acc madd(Group a, Weights w, Acc acc) { return {_mm512_dpbusd_epi32(acc.v, a.v, w.v)}; }
  static void store(int32_t* p, Acc a) { _mm512_storeu_si512((void*)p, a.v); }
  static void quantize(const float* x, float inv, In* q) {  // levels + 128: 1 .. 255
    _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(_mm512_add_epi32(q8_levels(x, inv), _mm512_set1_epi32(128))));
  }
  // float(acc - 128 * wsum): the uint8 activations' offset removed exactly, then one rounding
  static VecF<16> to_float(const int32_t* sums, const int32_t* wsum) {
    const __m512i off = _mm512_maskz_slli_epi32((__mmask16)0xffff, _mm512_loadu_si512((const void*)wsum), 7);
    return {_mm512_maskz_cvtepi32_ps((__mmask16)0xffff, _mm512_sub_epi32(_mm512_loadu_si512((const void*)sums), off))};
  }
};
#endif

}  // namespace fa
