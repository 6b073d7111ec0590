// The linear-layer kernels: register tiles of up to 6 rows x 8 panels, or 9
// rows x 3 (float32 / float16 weights, and int8), and their split across the
// pool's threads (the panels they read: linear_pack.cpp).  Written once over
// vec.h's VecF<PANEL> and Q8 types; the target decides their width and
// instructions, never the result.  On AMX builds int8 products of several rows
// go to linear_amx.cpp's tiles.
#include "cpu/linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "cpu/amx.h"
#include "cpu/linear_int8.h"
#include "cpu/ops.h"
#include "cpu/weight_hints.h"

namespace fa {

namespace {

// panels per tile for a row block of mr rows: mr x panels accumulators, the
// panels' weight vectors and a broadcast input fill the vector registers (16 on
// AVX2 and the generic layout: 8-12 accumulators; 32 with AVX-512: 16-24), so
// each weight vector loaded feeds as many rows as the registers allow.  int8
// with 16 registers (q8): vpmaddwd does not accumulate, so each multiply-add
// also needs a register for its products; a tile of 4 rows x 3 panels (12
// sums, 3 weights, the input, the products: 17) spilled sums to the stack on
// every k pair (linear_rate.py --isa avx2: 4 rows at 115 GOPS against 155 for
// 5 rows x 2 panels).  The tiling never changes a result: each output sums
// over k in order.
// A tile is compiled only for the panel counts up to this, the only ones
// for_tiles asks for (cnt <= panels_for(mr)).
constexpr int panels_for(int mr, bool q8) {
#if defined(FA_ISA_AVX512)
  constexpr int t[] = {0, 8, 8, 6, 5, 4, 4, 3, 3, 3};
  (void)q8;
  return t[mr];
#else
  constexpr int t[] = {0, 8, 6, 4, 3, 2, 2};
  constexpr int tq[] = {0, 8, 4, 3, 2, 2, 2};
  return q8 ? tq[mr] : t[mr];
#endif
}

// ------------------------------------------------------------ float tiles
// H: the tile asks for weights ahead (Ahead); the tiles without never test for it
template <int MR, int NR, typename WT, bool H>
void tile(const float* x, int ldx, int K, const WT* panel, size_t pstride, float* y, int ldy, int n0, int N,
          const float* bias, bool has_bias, Ahead ahead) {
  VP acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = VP::zero();
  AheadCursor cursor(ahead);
  StreamHints streams;
  if (H && MR >= kStreamMinRows && !ahead.lines && ahead.end)
    streams = StreamHints((const char*)panel, pstride * sizeof(WT), NR, K, PANEL * sizeof(WT), ahead.end);
  for (int k = 0; k < K; ++k) {
    VP w[NR];
    const WT* cur = panel + (size_t)k * PANEL;
    if constexpr (H) {
      if (ahead.lines)
        cursor.step(K);
      else if (MR >= kStreamMinRows)
        streams.ask<PANEL * sizeof(WT)>(cur, pstride * sizeof(WT), NR, k);
    }
    for (int j = 0; j < NR; ++j)
      w[j] = keeps_weights<MR, NR>() ? VP::load_kept(cur + j * pstride) : VP::load(cur + j * pstride);
    for (int i = 0; i < MR; ++i) {
      VP a = VP::bcast(x[(size_t)i * ldx + k]);
      for (int j = 0; j < NR; ++j) acc[i][j] = VP::fma(a, w[j], acc[i][j]);
    }
  }
  // the sums leave the registers in one unrolled block: an epilogue that
  // indexed the accumulators in a loop kept them in memory (GCC 12 then
  // stored every accumulator on each k, as many stores as fused multiply-adds)
  alignas(64) float res[MR][NR][PANEL];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int j = 0; j < NR; ++j) acc[i][j].store(res[i][j]);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const int c0 = n0 + j * PANEL;
      float* out = y + (size_t)i * ldy;
      if (c0 + PANEL <= N) {  // a whole panel: one vector (the same additions)
        const VP v = VP::load(res[i][j]);
        (has_bias ? VP::add(v, VP::load(bias + c0)) : v).store(out + c0);
        continue;
      }
      for (int c = c0; c < N; ++c) out[c] = has_bias ? res[i][j][c - c0] + bias[c] : res[i][j][c - c0];
    }
}

template <typename WT>
using TileFn = void (*)(const float*, int, int, const WT*, size_t, float*, int, int, int, const float*, bool, Ahead);

// the tile of MR rows and nr panels (nr <= NR, the most this row count covers)
template <int MR, int NR, typename WT, bool H>
TileFn<WT> tile_upto(int nr) {
  if constexpr (NR > 1)
    if (nr < NR) return tile_upto<MR, NR - 1, WT, H>(nr);
  return tile<MR, NR, WT, H>;
}
template <int MR, typename WT, bool H>
TileFn<WT> tile_for(int nr) {
  return tile_upto<MR, panels_for(MR, false), WT, H>(nr);
}
template <typename WT, bool H>
TileFn<WT> tile_fn_h(int mr, int nr) {
  switch (mr) {
    case 1: return tile_for<1, WT, H>(nr);
    case 2: return tile_for<2, WT, H>(nr);
    case 3: return tile_for<3, WT, H>(nr);
    case 4: return tile_for<4, WT, H>(nr);
    case 5: return tile_for<5, WT, H>(nr);
#if defined(FA_ISA_AVX512)
    case 6: return tile_for<6, WT, H>(nr);
    case 7: return tile_for<7, WT, H>(nr);
    case 8: return tile_for<8, WT, H>(nr);
    default: return tile_for<9, WT, H>(nr);
#else
    default: return tile_for<6, WT, H>(nr);
#endif
  }
}
template <typename WT>
TileFn<WT> tile_fn(int mr, int nr, bool hints) {
  return hints ? tile_fn_h<WT, true>(mr, nr) : tile_fn_h<WT, false>(mr, nr);
}

// The most rows of one call that run as one block: AVX-512's 32 vector
// registers hold 9 rows x 3 panels of accumulators beside the 3 weight vectors,
// so a pass over 7-9 positions reads each weight once instead of twice (on a
// 2-core Zen 5 guest, d=512 layer shapes: 7 rows 23-30% and 8-9 rows up to 15% faster,
// float32 and int8).  More rows run in blocks of at most 6 (4 panels each),
// which was a few percent faster for 16-40 rows (an encoder's) than blocks of
// 7-9; 16 registers elsewhere: blocks of at most 6.
#if defined(FA_ISA_AVX512)
constexpr int kOneBlockRows = 9;
#else
constexpr int kOneBlockRows = 6;
#endif

// The tiles of an M x N product: output panels split into groups across the
// pool's threads (when there is enough work), rows in one block up to
// kOneBlockRows, else in blocks of at most 6, as even as possible (a lone last
// row would run a latency-bound 1-row tile); tile(mr, m0, p, cnt, ahead)
// computes rows [m0, m0 + mr) of panels [p, p + cnt) and asks for the weights
// `ahead` names.  weights: the layer's packed weights, panel_bytes apart.
template <typename TileCall>
void for_tiles(Pool& pool, const Linear& L, int M, const void* weights, size_t panel_bytes, bool q8,
               const TileCall& tile) {
  if (M <= 0) return;
  const int nb = M <= kOneBlockRows ? 1 : (M + 5) / 6;
  const int group = panels_for((M + nb - 1) / nb, q8);  // the largest block's
  const int n_groups = (L.P + group - 1) / group;
  const int chunks = product_chunks(pool, L, M, n_groups);
  const bool backward = !L.prefetch && panels_backward();  // see set_panels_backward
  auto body = [&](int c) {
    int g0 = (int)((int64_t)n_groups * c / chunks), g1 = (int)((int64_t)n_groups * (c + 1) / chunks);
    const int p_end = std::min(g1 * group, L.P);
    for (int i = g0; i < g1; ++i) {
      const int g = backward ? g0 + g1 - 1 - i : i;
      const int p0 = g * group, np = std::min(group, L.P - p0);
      // the next group's lines in this share, and the tiles they are spread over
      const int next_lines = nb > 1 && L.prefetch
                                 ? (int)((size_t)(std::min(p0 + np + group, p_end) - std::min(p0 + np, p_end)) *
                                         panel_bytes / 64)
                                 : 0;
      int calls = 0;
      for (int bi = 0; next_lines && bi < nb; ++bi) {
        const int nr = std::min(np, panels_for((M * (bi + 1)) / nb - (M * bi) / nb, q8));
        calls += (np + nr - 1) / nr;
      }
      const char* next = static_cast<const char*>(weights) + (size_t)(p0 + np) * panel_bytes;
      for (int bi = 0, m0 = 0, t = 0; bi < nb; ++bi) {
        const int mr = (M * (bi + 1)) / nb - (M * bi) / nb;
        const int nr = std::min(np, panels_for(mr, q8));
        for (int pp = 0; pp < np; pp += nr, ++t) {
          Ahead a;
          if (nb == 1 && L.prefetch) a.end = static_cast<const char*>(weights) + (size_t)p_end * panel_bytes;
          if (next_lines) {
            const int l0 = (int)((int64_t)next_lines * t / calls), l1 = (int)((int64_t)next_lines * (t + 1) / calls);
            a.first = next + (size_t)l0 * 64;
            a.lines = l1 - l0;
          }
          tile(mr, m0, p0 + pp, std::min(nr, np - pp), a);
        }
        m0 += mr;
      }
    }
  };
  pool.run(body, chunks);
}

template <typename WT>
void linear_t(Pool& pool, const Linear& L, const WT* weights, const float* x, int ldx, int M, float* y, int ldy) {
  const size_t pstride = (size_t)L.K * PANEL;
  for_tiles(pool, L, M, weights, pstride * sizeof(WT), false, [&](int mr, int m0, int p, int cnt, Ahead ahead) {
    tile_fn<WT>(mr, cnt, L.prefetch)(x + (size_t)m0 * ldx, ldx, L.K, weights + (size_t)p * pstride, pstride,
                         y + (size_t)m0 * ldy, ldy, p * PANEL, L.N, L.b.data(), L.has_bias, ahead);
  });
}

// ------------------------------------------------------------- int8 tiles
// Per input row: qx = round(x * (127 / amax)) (half to even), sx = amax / 127;
// acc = sum_k qx[k] * qw[n][k] in int32 (exact, so any order);
// y = float(acc) * (sx * sw[n]) + b[n].  The same definition as
// fairseq_aggressive/runtime/quantization.py, which the tests compare bit for bit.
// Activations are stored as Q8In: int16 qx, or uint8 qx + 128 for VNNI's
// unsigned x signed products (the outputs then subtract 128 * wsum[n]).
// The rows' quantization: quantize_rows (linear_int8.h).

template <int MR, int NR, bool H>
void tile_q8(const Q8In* xq, int ldq, int KG, const int8_t* panel, size_t pstride, const float* sx, float* y,
             int ldy, int n0, int N, const float* ws, const int32_t* wsum, const float* bias, bool has_bias,
             Ahead ahead) {
  typename Q8P::Acc acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = Q8P::zero();
  AheadCursor cursor(ahead);
  StreamHints streams;
  if (H && MR >= kStreamMinRows && !ahead.lines && ahead.end)
    streams = StreamHints((const char*)panel, pstride, NR, KG, Q8_GROUP * PANEL, ahead.end);
  for (int k = 0; k < KG; ++k) {
    typename Q8P::Weights w[NR];
    const int8_t* cur = panel + (size_t)k * Q8_GROUP * PANEL;
    if constexpr (H) {
      if (ahead.lines)
        cursor.step(KG);
      else if (MR >= kStreamMinRows)
        streams.ask<Q8_GROUP * PANEL>(cur, pstride, NR, k);
    }
    for (int j = 0; j < NR; ++j)
      w[j] = keeps_weights<MR, NR>() ? Q8P::load_kept(cur + j * pstride) : Q8P::load(cur + j * pstride);
    for (int i = 0; i < MR; ++i) {
      const typename Q8P::Group a = Q8P::group(xq + (size_t)i * ldq + Q8_GROUP * k);
      for (int j = 0; j < NR; ++j) acc[i][j] = Q8P::madd(a, w[j], acc[i][j]);
    }
  }
  // the sums leave the registers in one unrolled block (see tile)
  alignas(64) int32_t res[MR][NR][PANEL];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int j = 0; j < NR; ++j) Q8P::store(res[i][j], acc[i][j]);
  q8_outputs(&res[0][0][0], (size_t)NR * PANEL, PANEL, MR, NR, sx, y, ldy, n0, N, ws, wsum, bias, has_bias);
}

using TileQ8Fn = void (*)(const Q8In*, int, int, const int8_t*, size_t, const float*, float*, int, int, int,
                          const float*, const int32_t*, const float*, bool, Ahead);
template <int MR, int NR, bool H>
TileQ8Fn tile_q8_upto(int nr) {
  if constexpr (NR > 1)
    if (nr < NR) return tile_q8_upto<MR, NR - 1, H>(nr);
  return tile_q8<MR, NR, H>;
}
template <int MR, bool H>
TileQ8Fn tile_q8_for(int nr) {
  return tile_q8_upto<MR, panels_for(MR, true), H>(nr);
}
template <bool H>
TileQ8Fn tile_q8_fn_h(int mr, int nr) {
  switch (mr) {
    case 1: return tile_q8_for<1, H>(nr);
    case 2: return tile_q8_for<2, H>(nr);
    case 3: return tile_q8_for<3, H>(nr);
    case 4: return tile_q8_for<4, H>(nr);
    case 5: return tile_q8_for<5, H>(nr);
#if defined(FA_ISA_AVX512)
    case 6: return tile_q8_for<6, H>(nr);
    case 7: return tile_q8_for<7, H>(nr);
    case 8: return tile_q8_for<8, H>(nr);
    default: return tile_q8_for<9, H>(nr);
#else
    default: return tile_q8_for<6, H>(nr);
#endif
  }
}
TileQ8Fn tile_q8_fn(int mr, int nr, bool hints) {
  return hints ? tile_q8_fn_h<true>(mr, nr) : tile_q8_fn_h<false>(mr, nr);
}

void linear_q8(Pool& pool, const Linear& L, const float* x, int ldx, int M, float* y, int ldy) {
  if (M <= 0) return;
  thread_local LineVector<Q8In> xq;
  thread_local std::vector<float> sx;
  const int KG = L.KG(), ldq = Q8_GROUP * KG;
  if (xq.size() < (size_t)M * ldq) xq.resize((size_t)M * ldq);
  if (sx.size() < (size_t)M) sx.resize(M);
  quantize_rows(x, ldx, M, L.K, xq.data(), ldq, sx.data());
  const Q8In* q = xq.data();
  const float* s = sx.data();
#if defined(FA_AMX)
  if (M >= amx_min_rows() && amx::state() == 1) return linear_q8_amx(pool, L, q, ldq, s, M, y, ldy);
#endif
  const size_t pstride = (size_t)KG * Q8_GROUP * PANEL;
  for_tiles(pool, L, M, L.wq.data(), pstride, true, [&](int mr, int m0, int p, int cnt, Ahead ahead) {
    tile_q8_fn(mr, cnt, L.prefetch)(q + (size_t)m0 * ldq, ldq, KG, L.wq.data() + (size_t)p * pstride, pstride, s + m0,
                        y + (size_t)m0 * ldy, ldy, p * PANEL, L.N, L.ws.data(), L.wsum.data(), L.b.data(),
                        L.has_bias, ahead);
  });
}

}  // namespace

namespace {
thread_local bool t_panels_backward = false;
}
bool panels_backward() { return t_panels_backward; }
void set_panels_backward(bool backward) { t_panels_backward = backward; }

#if defined(FA_TEST_HOOKS)
namespace {
std::atomic<int> g_product_pieces{1};
}
int product_pieces() { return g_product_pieces.load(std::memory_order_relaxed); }
void set_product_pieces(int pieces) { g_product_pieces.store(std::max(pieces, 1), std::memory_order_relaxed); }
#endif

void linear_panels(const Linear& L, const float* x, const int32_t* panels, int np, float* y) {
  const size_t pstride = (size_t)L.K * PANEL;
  for (int i = 0; i < np; ++i) {  // (the tile of linear()'s one-row blocks, one panel at a time)
    const size_t at = (size_t)panels[i] * pstride;
    if (L.half)
      tile<1, 1, uint16_t, false>(x, L.K, L.K, L.wh.data() + at, pstride, y, 0, panels[i] * PANEL, L.N, L.b.data(),
                                  L.has_bias, Ahead());
    else
      tile<1, 1, float, false>(x, L.K, L.K, L.w.data() + at, pstride, y, 0, panels[i] * PANEL, L.N, L.b.data(),
                               L.has_bias, Ahead());
  }
}

void linear(Pool& pool, const Linear& L, const float* x, int ldx, int M, float* y, int ldy) {
  if (L.q8)
    linear_q8(pool, L, x, ldx, M, y, ldy);
  else if (L.half)
    linear_t(pool, L, L.wh.data(), x, ldx, M, y, ldy);
  else
    linear_t(pool, L, L.w.data(), x, ldx, M, y, ldy);
}

}  // namespace fa
