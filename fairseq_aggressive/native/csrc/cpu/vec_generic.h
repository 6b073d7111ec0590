// The portable vector types: W lanes processed one at a time with the same
// IEEE operations, in the same order, as the SIMD specializations in
// vec_avx.h / vec_avx512.h (std::fma for every fused multiply-add), so every
// target computes the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

namespace fa {

template <int W>
struct VecF {
  float v[W];
  static VecF zero() { VecF r; for (int i = 0; i < W; ++i) r.v[i] = 0.f; return r; }
  static VecF load(const float* p) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = p[i]; return r; }
  static VecF load(const uint16_t* p) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = half_to_float(p[i]); return r; }
  template <typename T>
  static VecF load_kept(const T* p) { return load(p); }
  static VecF bcast(float a) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = a; return r; }
  static VecF fma(VecF a, VecF b, VecF c) {
    VecF r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static VecF add(VecF a, VecF b) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
  static VecF sub(VecF a, VecF b) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = a.v[i] - b.v[i]; return r; }
  static VecF mul(VecF a, VecF b) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i]; return r; }
  static VecF div(VecF a, VecF b) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = a.v[i] / b.v[i]; return r; }
  static VecF max(VecF a, VecF b) {
    VecF r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  static unsigned equal_lanes(VecF a, VecF b) {
    unsigned m = 0;
    for (int i = 0; i < W; ++i) m |= (unsigned)(a.v[i] == b.v[i]) << i;
    return m;
  }
  static unsigned at_least_lanes(VecF a, VecF b) {
    unsigned m = 0;
    for (int i = 0; i < W; ++i) m |= (unsigned)(a.v[i] >= b.v[i]) << i;
    return m;
  }
  static VecF exp(VecF x) { VecF r; for (int i = 0; i < W; ++i) r.v[i] = fexp(x.v[i]); return r; }
  void store(float* p) const { for (int i = 0; i < W; ++i) p[i] = v[i]; }
  // r[i] lane j <- r[j] lane i (W vectors of W lanes; moves only)
  static void transpose(VecF* r) {
    for (int i = 0; i < W; ++i)
      for (int j = i + 1; j < W; ++j) std::swap(r[i].v[j], r[j].v[i]);
  }
};

// The int8 activations of a k group: int16 pairs (vpmaddwd) or, for groups
// of 4, uint8 shifted by 128 (vpdpbusd multiplies unsigned by signed bytes;
// the kernel subtracts 128 * the weights' row sum, exactly)
template <int G>
struct Q8Input {
  using type = int16_t;
  static constexpr int offset = 0;
};
template <>
struct Q8Input<4> {
  using type = uint8_t;
  static constexpr int offset = 128;
};

// An activation's int8 level: round_half_even(x * inv) clamped to [-127, 127]
// (max(-127, v), then min(127, v)), plus the group's offset
template <int G>
inline typename Q8Input<G>::type q8_level(float x, float inv) {
  float v = std::nearbyint(x * inv);
  v = -127.f > v ? -127.f : v;
  v = 127.f < v ? 127.f : v;
  return (typename Q8Input<G>::type)((int)v + Q8Input<G>::offset);
}

// int8 products: W int32 lanes accumulating, per group of G consecutive k, the
// products of G activations with each lane's G weights (lane l's at w[l * G + h])
template <int W, int G>
struct Q8 {
  using In = typename Q8Input<G>::type;
  struct Acc {
    int32_t v[W];
  };
  struct Weights {
    const int8_t* p;
  };
  struct Group {
    int32_t a[G];
  };
  static Acc zero() { Acc r; for (int l = 0; l < W; ++l) r.v[l] = 0; return r; }
  static Weights load(const int8_t* p) { return {p}; }
  static Weights load_kept(const int8_t* p) { return {p}; }
  static Group group(const In* x) { Group r; for (int h = 0; h < G; ++h) r.a[h] = x[h]; return r; }
  static Acc madd(Group a, Weights w, Acc acc) {
    for (int l = 0; l < W; ++l) {
      int32_t s = 0;
      for (int h = 0; h < G; ++h) s += a.a[h] * (int32_t)w.p[l * G + h];
      acc.v[l] += s;
    }
    return acc;
  }
  static void store(int32_t* p, Acc a) { for (int l = 0; l < W; ++l) p[l] = a.v[l]; }
  // W activations' levels (q8_level)
  static void quantize(const float* x, float inv, In* q) {
    for (int l = 0; l < W; ++l) q[l] = q8_level<G>(x[l], inv);
  }
  // float(sums - offset * wsum) per lane (sums: a stored Acc): the exact integer sum, rounded once to float
  static VecF<W> to_float(const int32_t* sums, const int32_t* wsum) {
    VecF<W> r;
    for (int l = 0; l < W; ++l) r.v[l] = (float)(sums[l] - Q8Input<G>::offset * wsum[l]);
    return r;
  }
};

}  // namespace fa
