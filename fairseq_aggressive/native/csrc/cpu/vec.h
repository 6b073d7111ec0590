// The vector types every kernel is written over, chosen per build target, and
// the scalar helpers they share (exp with a fixed operation sequence, IEEE
// half -> float).
//
//   VecF<8>        row operations (dot products, maxima, softmax sums): 8 lanes
//                  on every target, so their partial sums are combined in one
//                  canonical order everywhere (an element-wise step may run
//                  wider, as the log-softmax's exps on VecF<16>: each lane's
//                  own operations, the same bits)
//   VecF<PANEL>    the linear layers' weight panels: PANEL outputs per vector,
//                  each output accumulated over k on its own (so the panel width
//                  does not change a single result)
//   Q8<PANEL, Q8_GROUP>  int8 products: exact integer sums, so any grouping of
//                  k gives the same sums
//
// load_kept (VecF<PANEL>, Q8): a weight vector loaded into a register of its
// own, where a tile's rows all multiply by it.  GCC otherwise folds the load
// into each row's multiply-add, so a tile of 2 or 3 rows loaded every weight
// 2 or 3 times, and each of those multiply-adds waited on its own load of a
// line still on its way from L3 or memory (on a 2-core Zen 4 guest, the int8
// products of a d=512 decoder pass over 3 positions: 1.33x a one-row pass's
// time with folded loads, 0.95-0.98x with kept ones).  Same values, so the
// same results.
//
// Targets (the build passes one; see fairseq_aggressive/native/targets.py):
//   FA_ISA_AVX512 [+ FA_VNNI]  vec_avx512.h over vec_avx.h: 16-lane panels,
//                              int8 with vpdpbusd (VNNI) or vpmaddwd
//   FA_ISA_AVX2                vec_avx.h: 8-lane panels, int8 with vpmaddwd
//   FA_ISA_NEON                vec_neon.h (aarch64): 8-lane panels in two
//                              128-bit registers, int8 pairs with widening
//                              multiplies (vmull_s16) and pairwise adds
//   FA_AMX (+ the above)       the int8 products of several rows on AMX tiles
//                              (amx.h, linear_amx.cpp)
//   neither                    vec_generic.h only: the same IEEE operations one
//                              lane at a time (std::fma), on any CPU with FMA;
//                              FA_PANEL / FA_Q8_GROUP choose its layout (the
//                              tests build the AVX-512 layout this way)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace fa {

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

}  // namespace fa

#include "cpu/vec_generic.h"

#if defined(FA_ISA_AVX512)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__))
#error "FA_ISA_AVX512 needs -mavx512f -mavx512bw -mavx512vl -mfma -mf16c"
#endif
#if defined(FA_VNNI) && !defined(__AVX512VNNI__)
#error "FA_VNNI needs -mavx512vnni"
#endif
#include "cpu/vec_avx.h"
#include "cpu/vec_avx512.h"
#define FA_ISA_NAME (FA_VNNI_ON ? "avx512vnni" : "avx512")
#elif defined(FA_ISA_AVX2)
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "FA_ISA_AVX2 needs -mavx2 -mfma -mf16c"
#endif
#include "cpu/vec_avx.h"
#define FA_ISA_NAME "avx2"
#elif defined(FA_ISA_NEON)
#if !defined(__aarch64__)
#error "FA_ISA_NEON is an aarch64 target"
#endif
#include "cpu/vec_neon.h"
#if defined(FA_NEON_DOT)
#define FA_ISA_NAME "neon-dotprod"
#else
#define FA_ISA_NAME "neon"
#endif
#else
#define FA_ISA_NAME "generic"
#endif

namespace fa {

constexpr int LANES = 8;  // row operations' lanes, on every target

// Whether the target's instructions work on vectors: one widens a vector of float16 weights, one
// multiplies int8 pairs or quadruples several to a float product's one.  The generic build computes
// one lane at a time, so storage and screens that pay only through those instructions stay off there.
#if defined(FA_ISA_AVX2) || defined(FA_ISA_AVX512) || defined(FA_ISA_NEON)
constexpr bool kVectorISA = true;
#else
constexpr bool kVectorISA = false;
#endif

#if defined(FA_ISA_AVX512)
constexpr int PANEL = 16;
#ifdef FA_VNNI
#define FA_VNNI_ON 1
constexpr int Q8_GROUP = 4;
#else
#define FA_VNNI_ON 0
constexpr int Q8_GROUP = 2;
#endif
#elif defined(FA_ISA_NEON) && defined(FA_NEON_DOT)
constexpr int PANEL = 8;
constexpr int Q8_GROUP = 4;
#elif defined(FA_ISA_AVX2) || defined(FA_ISA_NEON)
constexpr int PANEL = 8;
constexpr int Q8_GROUP = 2;
#else
#ifndef FA_PANEL
#define FA_PANEL 8
#endif
#ifndef FA_Q8_GROUP
#define FA_Q8_GROUP 2
#endif
constexpr int PANEL = FA_PANEL;
constexpr int Q8_GROUP = FA_Q8_GROUP;
#endif
static_assert(PANEL == 8 || PANEL == 16, "PANEL: 8 or 16 outputs");
static_assert(Q8_GROUP == 2 || Q8_GROUP == 4, "Q8_GROUP: 2 (int16 pairs) or 4 (uint8 quads)");

// FA_AMX: int8 products of several rows on AMX tiles (amx.h), over the VNNI
// layout (a panel's k groups are the rows of a B tile); FA_AMX_EMULATE: the
// tiles in software over the portable code (a test-only target)
#if defined(FA_AMX)
static_assert(PANEL == 16 && Q8_GROUP == 4, "FA_AMX needs 16-output panels and int8 groups of 4");
#undef FA_ISA_NAME
#if defined(FA_AMX_EMULATE)
#define FA_ISA_NAME "generic-amx"
#else
#define FA_ISA_NAME "avx512amx"
#endif
#endif

using V8 = VecF<LANES>;
using VP = VecF<PANEL>;
using Q8P = Q8<PANEL, Q8_GROUP>;
using Q8In = typename Q8Input<Q8_GROUP>::type;

// The vector registers a linear tile's accumulators, weight vectors and
// broadcast input share; a tile of MR rows x NR panels keeps its weight
// vectors in registers (load_kept) where they fit beside its accumulators
#if defined(FA_ISA_AVX512)
constexpr int VECTOR_REGISTERS = 32;
#else
constexpr int VECTOR_REGISTERS = 16;
#endif
template <int MR, int NR>
constexpr bool keeps_weights() {
  return MR > 1 && MR * NR + NR + 1 <= VECTOR_REGISTERS;
}

}  // namespace fa
