// Linear layers y = x W^T + b: the packed weight storage (float32, float16 or
// int8 with per-row scales) and the matrix-product kernels over it.
//
// Every output is accumulated sequentially over k with fused multiply-adds
// (int8: exact integer sums, then one scale and the bias), whatever the number
// of rows, the row's place in a call or the thread that computes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "pool/parallel.h"
#include "cpu/vec.h"

namespace fa {

#if defined(FA_AMX)
constexpr int kQ8GroupAlign = 16;  // an AMX tile's k groups (amx.h)
#else
constexpr int kQ8GroupAlign = 1;
#endif

// Storage that starts on a cache line: a panel's k step (64 bytes on
// AVX-512: 16 floats, or 16 outputs x 4 int8) is then one line, never two.
// The default allocator starts large blocks 16 bytes past a page, so every
// vector load of a weight would read two lines, and an AMX tile row two: on a
// 2-core Xeon guest with AMX, tiles streaming 64-byte rows from L2 ran at
// about half the rate of the same rows on line boundaries.
template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};
template <typename T>
using LineVector = std::vector<T, LineAligned<T>>;

// W (N x K) row-major, packed once as panels of PANEL outputs (8 or 16, by
// target): panel p holds W[PANEL * p + l][k] at [k * PANEL + l].
struct Linear {
  int N = 0, K = 0, P = 0;
  bool half = false;      // weights stored as float16 (only when every weight is a float16 value)
  bool q8 = false;        // int8 weights and activations (--inference-precision int8)
  LineVector<float> w;  // P * K * PANEL
  LineVector<uint16_t> wh;
  // int8: panel p, k group j (Q8_GROUP consecutive k), lane l, h < Q8_GROUP
  // at ((p * KG + j) * PANEL + l) * Q8_GROUP + h (k >= K: zeros)
  LineVector<int8_t> wq;
  std::vector<float> ws;      // int8: per output row scale (P * PANEL)
  std::vector<int32_t> wsum;  // int8: per output row, the sum of its weights (uint8 activations' offset)
  std::vector<float> b;    // N (zeros if no bias)
  bool has_bias = false;
  // the tiles ask for the weights ahead of use (set for the layers of an
  // encoder, or a decoder with its output projection, whose weights outgrow the
  // caches: see linear.cpp)
  bool prefetch = false;
  // k groups per row: AMX builds pad them to whole tiles (16 groups), with zero weights
  int KG() const { return (K + Q8_GROUP * kQ8GroupAlign - 1) / (Q8_GROUP * kQ8GroupAlign) * kQ8GroupAlign; }
  // bytes of weights one product reads
  size_t bytes() const { return w.size() * sizeof(float) + wh.size() * sizeof(uint16_t) + wq.size(); }
  size_t q8_index(int r, int c) const {
    return (((size_t)(r / PANEL) * KG() + c / Q8_GROUP) * PANEL + r % PANEL) * Q8_GROUP + c % Q8_GROUP;
  }
  // W as float, or as float16 bits (Wh, then W is unused) when given; bias may be null
  void pack(const float* W, const uint16_t* Wh, const float* bias, int n, int k);
  // int8 weights Wq (n x k) with per-row scales
  void pack_q8(const int8_t* Wq, const float* scale, const float* bias, int n, int k);
};

// y (M x N, row stride ldy) = x (M x K, row stride ldx) W^T + b, on the pool's threads
void linear(Pool& pool, const Linear& L, const float* x, int ldx, int M, float* y, int ldy);

// Outputs of one row x of a float layer (not int8): the panels panels[0..np)
// (outputs PANEL * p .. PANEL * p + PANEL - 1 each) into y at their columns,
// each output bit for bit linear()'s; the caller's thread only
void linear_panels(const Linear& L, const float* x, const int32_t* panels, int np, float* y);

// The order of a product's panel groups on the calling thread.  Each decoder
// pass sets the other order than its decoder's last pass (decoder_rows), so
// one pass reads each product's weights forward and the next backward.  A
// small decoder's weights with its output projection (the 9+3's 1.8 MB of
// int8) about fill a core's L2 (2 MB on recent Xeons): read in one order at
// every pass, each line is evicted before its next use, while the reversed
// order first reads the lines the last pass read last, still in the cache.
// On a 2-core Xeon guest with AMX, one thread: the 9+3's greedy 2-3% (int8)
// and 5% (float32) faster, IAD within 1.3%; two threads (half the weights
// per core) unchanged (docs/engine-kernels.md).  Products whose
// weights are asked for ahead (Linear::prefetch: they outgrow the caches)
// keep one order.  Each output is computed alone, so the order never changes
// a result (tests/test_native.py runs the kernels both ways).
bool panels_backward();
void set_panels_backward(bool backward);

// weight bytes of an encoder, or of a decoder with its output projection, beyond which
// its layers ask for their weights ahead (Linear::prefetch)
constexpr size_t kPrefetchModelBytes = (size_t)8 << 20;

// Projection weight bytes beyond which a pass projects every drafted position
// at once (pass.cpp): such weights come from L3 or memory, and reading them a
// second time costs more than the positions after an early rejection (about
// the L2 of one core: 1 MB on Zen 4/5, 2 MB on recent Xeons)
constexpr size_t kEagerProjectionBytes = (size_t)1 << 20;

// dst = rows ids[0..n) of src, stored as src is; a row's dot products are
// computed exactly as in src, so its outputs are bit for bit the same
void gather_rows(const Linear& src, const int32_t* ids, int n, Linear& dst);

}  // namespace fa
