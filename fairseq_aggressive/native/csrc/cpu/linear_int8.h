// The int8 product's parts shared by its vector tiles (linear.cpp) and its AMX
// tiles (linear_amx.cpp): the activations' offset and quantization, the outputs
// from the int32 sums, and how a product is split across the pool's threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/linear.h"
#include "cpu/ops.h"

namespace fa {

// uint8 activations hold qx + 128 (VNNI's and AMX's unsigned x signed
// products); the sums then carry 128 * wsum[n], removed exactly
constexpr int Q8_OFFSET = Q8Input<Q8_GROUP>::offset;
// what the products' sums carry: the stored offset times the weights' row sum,
// except with sdot (vec_neon.h), which reads the stored bytes back as q
#if defined(FA_NEON_DOT)
constexpr int Q8_SUM_OFFSET = 0;
#else
constexpr int Q8_SUM_OFFSET = Q8_OFFSET;
#endif

// Each of M rows of x (row stride ldx, K values) quantized into q (row stride
// ldq: the k >= K padded with the offset zero) with its scale sx (the
// definition above linear.cpp's int8 tiles)
inline void quantize_rows(const float* x, int ldx, int M, int K, Q8In* q, int ldq, float* sx) {
  for (int m = 0; m < M; ++m) {
    const float* r = x + (size_t)m * ldx;
    const float amax = abs_max_of(r, K);  // vectorized: a scalar max chain cost more than the tiles of a pass
    const float inv = 127.f / (amax == 0.f ? 1.f : amax);
    Q8In* qr = q + (size_t)m * ldq;
    int k = 0;
    for (; k + PANEL <= K; k += PANEL) Q8P::quantize(r + k, inv, qr + k);  // vectors: the same operations
    for (; k < K; ++k) qr[k] = q8_level<Q8_GROUP>(r[k], inv);
    for (k = K; k < ldq; ++k) qr[k] = (Q8In)Q8_OFFSET;
    sx[m] = amax / 127.f;
  }
}

// y = float(sum - Q8_SUM_OFFSET * wsum[n]) * (sx[i] * ws[n]) (+ b[n]) for rows i <
// MR and panels j < NR starting at output n0, the sum of row i, panel j at
// sums + i * rstride + j * pstride.  Whole panels as vectors with the same
// operations as a single output (the build never fuses a multiply-add).
inline void q8_outputs(const int32_t* sums, size_t rstride, size_t pstride, int MR, int NR, const float* sx,
                       float* y, int ldy, int n0, int N, const float* ws, const int32_t* wsum, const float* bias,
                       bool has_bias) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const int32_t* s = sums + i * rstride + j * pstride;
      const int c0 = n0 + j * PANEL, c1 = std::min(c0 + PANEL, N);
      float* out = y + (size_t)i * ldy;
      if (c1 - c0 == PANEL) {
        const VP comb = VP::mul(VP::bcast(sx[i]), VP::load(ws + c0));
        const VP v = VP::mul(Q8P::to_float(s, wsum + c0), comb);
        (has_bias ? VP::add(v, VP::load(bias + c0)) : v).store(out + c0);
        continue;
      }
      for (int c = c0; c < c1; ++c) {
        const float comb = sx[i] * ws[c];
        const int32_t sum = s[c - c0] - Q8_SUM_OFFSET * wsum[c];
        float v = (float)sum * comb;
        if (has_bias) v = v + bias[c];
        out[c] = v;
      }
    }
}

// Pieces per thread of a shared product: one.  The pool hands out items in
// claim order, so with one piece per thread the caller takes the first and a
// worker the second in nearly every call, and each thread keeps reading the
// same panels (their weights stay in its core's caches); with more pieces the
// threads' shares change from call to call, each claim is a round trip of the
// pool's word between the cores, and a core reads panels the other core read
// last.  On a 2-core Zen 4 EPYC guest, both in one process, sentences
// alternating (scripts/diagnostics/product_pieces.py): int8 decodes with one
// piece per thread up to 6% faster than with four (9+3 and d=512, quiet;
// under load the pool shares few calls), a d=512 layer's products of 25 rows
// 5-20% (linear_rate).  The test library can change it
// (fa_set_product_pieces); results never depend on it.
#if defined(FA_TEST_HOOKS)
int product_pieces();
void set_product_pieces(int pieces);
#else
constexpr int product_pieces() { return 1; }
#endif

// The pieces an M-row product over n_groups groups of output panels is cut
// into for the pool: one where the product is too small to share
inline int product_chunks(const Pool& pool, const Linear& L, int M, int n_groups) {
  const double flops = 2.0 * M * L.N * L.K;
  return (pool.size() > 1 && flops > 4e5) ? std::min(n_groups, pool.size() * product_pieces()) : 1;
}

#if defined(FA_AMX)
// The fewest rows an int8 product runs on AMX tiles (fewer: the vector tiles,
// the same bits; linear_amx.cpp says why 10).  The test library can change it
// (fa_set_amx_min_rows: the tests and scripts/diagnostics/pass_cost.py).
constexpr int kAmxMinRows = 10;
#if defined(FA_TEST_HOOKS)
int amx_min_rows();
void set_amx_min_rows(int rows);
int64_t amx_products();  // products run on AMX tiles in this process
#else
constexpr int amx_min_rows() { return kAmxMinRows; }
#endif

// y (M x N) from the quantized rows q (M x ldq, ldq = Q8_GROUP * L.KG()) and
// their scales sx, on AMX tiles; needs amx::state() == 1
void linear_q8_amx(Pool& pool, const Linear& L, const Q8In* q, int ldq, const float* sx, int M, float* y, int ldy);
#endif

}  // namespace fa
