// AArch64 NEON (Advanced SIMD) specializations: 8 float lanes in two
// float32x4_t, and the int8 pair products with widening multiplies.  Each
// operation is the generic one's (vec_generic.h) on all lanes at once, with
// the generic code's choice wherever NEON's own instruction would differ
// (maxima as "a > b ? a : b", as x86's maxps and the generic code take them;
// rounding to nearest even as nearbyint does), so the bits are every other
// target's.  NEON has 32 128-bit registers: 16 of these 8-lane vectors, as
// AVX2's 16 (vec.h's VECTOR_REGISTERS), so the tiling is AVX2's.
#pragma once

#include <arm_neon.h>

#include <cstring>

namespace fa {

template <>
struct VecF<8> {
  float32x4_t lo, hi;
  static VecF zero() { return {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; }
  static VecF load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
  static VecF load(const uint16_t* p) {
    return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)))};
  }
  template <typename T>
  static VecF load_kept(const T* p) { return load(p); }
  static VecF bcast(float a) { return {vdupq_n_f32(a), vdupq_n_f32(a)}; }
  // vfmaq_f32(c, a, b) = c + a * b rounded once: std::fma(a, b, c).  FA_NEON_MUTANT
  // (scripts/arm/check_bits.py, never a shipped build) rounds the product first,
  // a broken fma whose bits the check must see differ
#if defined(FA_NEON_MUTANT)
  static VecF fma(VecF a, VecF b, VecF c) {
    return {vaddq_f32(vmulq_f32(a.lo, b.lo), c.lo), vaddq_f32(vmulq_f32(a.hi, b.hi), c.hi)};
  }
#else
  static VecF fma(VecF a, VecF b, VecF c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
#endif
  static VecF add(VecF a, VecF b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
  static VecF sub(VecF a, VecF b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
  static VecF mul(VecF a, VecF b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
  static VecF div(VecF a, VecF b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
  static float32x4_t greater_of(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
  static float32x4_t less_of(float32x4_t a, float32x4_t b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
  static VecF max(VecF a, VecF b) { return {greater_of(a.lo, b.lo), greater_of(a.hi, b.hi)}; }
  static unsigned lanes(uint32x4_t lo, uint32x4_t hi) {
    static const uint32_t bit[4] = {1, 2, 4, 8};
    const uint32x4_t b = vld1q_u32(bit);
    return vaddvq_u32(vandq_u32(lo, b)) | (vaddvq_u32(vandq_u32(hi, b)) << 4);
  }
  // bit l set where lane l of a equals lane l of b
  static unsigned equal_lanes(VecF a, VecF b) { return lanes(vceqq_f32(a.lo, b.lo), vceqq_f32(a.hi, b.hi)); }
  // bit l set where lane l of a is at least lane l of b (NaN: not set)
  static unsigned at_least_lanes(VecF a, VecF b) { return lanes(vcgeq_f32(a.lo, b.lo), vcgeq_f32(a.hi, b.hi)); }
  // fexp on 4 lanes, the same operations in the same order (as vec_avx.h's on 8)
  static float32x4_t exp4(float32x4_t x) {
    const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.33654f));
    x = less_of(greater_of(x, vdupq_n_f32(-87.33654f)), vdupq_n_f32(88.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-0.693145751953125f));
    r = vfmaq_f32(r, n, vdupq_n_f32(-1.428606765330187e-06f));
    float32x4_t p = vdupq_n_f32(1.3981999507e-3f);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(r, p, vmulq_f32(r, r));
    p = vaddq_f32(p, vdupq_n_f32(1.f));
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(bits));
    return vbslq_f32(tiny, vdupq_n_f32(0.f), y);
  }
  static VecF exp(VecF x) { return {exp4(x.lo), exp4(x.hi)}; }
  void store(float* p) const {
    vst1q_f32(p, lo);
    vst1q_f32(p + 4, hi);
  }
  // r[i] lane j <- r[j] lane i (8 x 8; moves only)
  static void transpose(VecF* r) {
    float t[8][8];
    for (int i = 0; i < 8; ++i) r[i].store(t[i]);
    for (int i = 0; i < 8; ++i) {
      float c[8];
      for (int j = 0; j < 8; ++j) c[j] = t[j][i];
      r[i] = load(c);
    }
  }
};

// 4 activations' int8 levels (q8_level's operations, vec_generic.h): x * inv
// rounded half to even, then max(-127, v) and min(127, v) as compare-and-select
inline int32x4_t q8_levels4(const float* x, float32x4_t inv) {
  const float32x4_t lo = vdupq_n_f32(-127.f), hi = vdupq_n_f32(127.f);
  float32x4_t v = vrndnq_f32(vmulq_f32(vld1q_f32(x), inv));
  v = vbslq_f32(vcgtq_f32(lo, v), lo, v);  // -127 > v ? -127 : v
  v = vbslq_f32(vcltq_f32(hi, v), hi, v);  // 127 < v ? 127 : v
  return vcvtq_s32_f32(v);
}

// What both int8 product types share: 8 int32 sums in two vectors, whole
// integers that hold no offset (to_float subtracts nothing)
struct NeonQ8Sums {
  struct Acc {
    int32x4_t lo, hi;
  };
  static Acc zero() { return {vdupq_n_s32(0), vdupq_n_s32(0)}; }
  static void store(int32_t* p, Acc a) {
    vst1q_s32(p, a.lo);
    vst1q_s32(p + 4, a.hi);
  }
  static VecF<8> to_float(const int32_t* sums, const int32_t*) {
    return {vcvtq_f32_s32(vld1q_s32(sums)), vcvtq_f32_s32(vld1q_s32(sums + 4))};
  }
};

// int8 pairs on 8 lanes: 16 int8 weights widened to int16 (lane l's pair at
// 2l, 2l + 1), multiplied by the two activations repeated and added in pairs:
// w[2l] * a0 + w[2l + 1] * a1 per lane, exactly (vpmaddwd's sums)
template <>
struct Q8<8, 2> : NeonQ8Sums {
  using In = int16_t;
  struct Weights {
    int16x8_t lo, hi;  // lanes 0-3's pairs, lanes 4-7's
  };
  struct Group {
    int16x8_t v;  // a0, a1, a0, a1, ...
  };
  static Weights load(const int8_t* p) {
    const int8x16_t w = vld1q_s8(p);
    return {vmovl_s8(vget_low_s8(w)), vmovl_s8(vget_high_s8(w))};
  }
  static Weights load_kept(const int8_t* p) { return load(p); }
  static Group group(const In* x) {
    int32_t pair;
    std::memcpy(&pair, x, 4);
    return {vreinterpretq_s16_s32(vdupq_n_s32(pair))};
  }
  static int32x4_t pairs(int16x8_t a, int16x8_t w) {
    return vpaddq_s32(vmull_s16(vget_low_s16(a), vget_low_s16(w)), vmull_high_s16(a, w));
  }
  static Acc madd(Group a, Weights w, Acc acc) {
    return {vaddq_s32(acc.lo, pairs(a.v, w.lo)), vaddq_s32(acc.hi, pairs(a.v, w.hi))};
  }
  // 8 activations' levels, as int16
  static void quantize(const float* x, float inv, In* q) {
    const float32x4_t s = vdupq_n_f32(inv);
    vst1q_s16(q, vcombine_s16(vmovn_s32(q8_levels4(x, s)), vmovn_s32(q8_levels4(x + 4, s))));
  }
};

#if defined(FA_NEON_DOT)
#if !defined(__ARM_FEATURE_DOTPROD)
#error "FA_NEON_DOT needs the dot-product extension (-march=armv8.2-a+dotprod)"
#endif
// int8 quads on 8 lanes with the dot-product extension (sdot): the VNNI layout
// (activations stored as uint8 q + 128, lane l's 4 weights at w[4l .. 4l + 3]);
// sdot multiplies signed bytes, so the activations go in as q (the stored byte
// with its top bit flipped) and the sums are sum(q * w) already: to_float
// subtracts nothing (vpdpbusd's sums carry 128 * wsum, which its to_float
// removes: the same integers)
template <>
struct Q8<8, 4> : NeonQ8Sums {
  using In = uint8_t;
  struct Weights {
    int8x16_t lo, hi;  // lanes 0-3's quads, lanes 4-7's
  };
  struct Group {
    int8x16_t v;  // q0..q3, repeated
  };
  static Weights load(const int8_t* p) { return {vld1q_s8(p), vld1q_s8(p + 16)}; }
  static Weights load_kept(const int8_t* p) { return load(p); }
  static Group group(const In* x) {
    uint32_t quad;
    std::memcpy(&quad, x, 4);
    return {vreinterpretq_s8_u32(vdupq_n_u32(quad ^ 0x80808080u))};
  }
  static Acc madd(Group a, Weights w, Acc acc) { return {vdotq_s32(acc.lo, w.lo, a.v), vdotq_s32(acc.hi, w.hi, a.v)}; }
  // 8 activations' levels, as uint8 q + 128
  static void quantize(const float* x, float inv, In* q) {
    const float32x4_t s = vdupq_n_f32(inv);
    const int32x4_t off = vdupq_n_s32(128);
    const uint16x4_t a = vmovn_u32(vreinterpretq_u32_s32(vaddq_s32(q8_levels4(x, s), off)));
    const uint16x4_t b = vmovn_u32(vreinterpretq_u32_s32(vaddq_s32(q8_levels4(x + 4, s), off)));
    vst1_u8(q, vmovn_u16(vcombine_u16(a, b)));
  }
};
#endif

}  // namespace fa
