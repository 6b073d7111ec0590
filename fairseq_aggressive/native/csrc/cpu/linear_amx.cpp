// int8 products on AMX tiles (FA_AMX builds; the emulated ones too).
//
// The VNNI weight layout is already AMX's: a panel's k group j holds its 16
// outputs' 4 weights each in 64 bytes, so 16 consecutive groups are one B tile
// (16 rows x 64 bytes, stride 64).  The rows of a product (up to 16 at a time)
// are an A tile (their quantized inputs, 64 k per tile) and four C tiles hold
// int32 sums: of one block of rows and 4 panels (64 outputs), or of two blocks
// and 2 panels, so that each B tile loaded serves 32 rows:
//   tiles 0-3  C: rows x 16 int32   tiles 4-5  A: rows x 64 uint8
//   tiles 6-7  B: 16 k groups x 16 outputs x 4 int8 (a panel's, in turn)
// Every k group of a row runs through TDPBUSD once, in exact int32 sums, so
// the outputs are the vector tiles' bits (linear_int8.h's q8_outputs turns
// both into floats).  Rows are padded to whole tiles of k: on FA_AMX builds a
// layer's k groups are a multiple of 16 (Linear::KG), with zero weights and
// zero-valued activations (the offset) beyond K.
#if defined(FA_AMX)

#include <atomic>

#include "cpu/amx.h"
#include "cpu/linear_int8.h"

#if !defined(FA_AMX_EMULATE)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace fa {

namespace amx {

#if defined(FA_AMX_EMULATE)
int state() { return 1; }
#else
namespace {
int detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  // CPUID.(7,0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return -1;
  // the OS saves tile state: OSXSAVE, then XCR0 bits 17 (TILECFG) and 18 (TILEDATA)
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return -1;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return -1;
#if defined(__linux__)
  // Linux (5.16+) hands tile data to a process that asks: ARCH_REQ_XCOMP_PERM
  // (0x1023) for XFEATURE_XTILEDATA (18).  Refused (an older kernel, or a
  // signal stack too small for the larger frames): the vector tiles run.
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return -2;
#endif
  return 1;
}
}  // namespace
int state() {
  static const int s = detect();  // once per process (thread-safe initialization)
  return s;
}
#endif

}  // namespace amx

namespace {

// The fewest rows a product runs on the tiles.  One block of B tiles serves up
// to 16 rows at one cost, but it streams the weights more slowly than the
// vector tiles, which read them once for up to 9 rows (linear.cpp) and twice
// from 10.  On a 2-core Intel Xeon KVM guest with AMX (linear_rate.py
// --decoder-layers 3, d=512 and d=1024, 1 and 2 threads; two runs) the tiles
// were up to 17% slower than the vector tiles at 1-6 rows, within 5% either
// way at 8-9, 0-14% faster at 10 rows and 25-31% at 16 (an encoder's
// sentences, batches, long drafts).
#if defined(FA_TEST_HOOKS)
std::atomic<int> g_amx_min_rows{kAmxMinRows};
std::atomic<int64_t> g_amx_products{0};
#endif

constexpr int kGroupsPerTile = amx::kRowBytes / Q8_GROUP;  // k groups in an A or B tile: 16
constexpr int kPanelsPerTile = 4;                          // C tiles

// The shapes of a block of `rows` rows.  A thread loads them before its first
// tile of a block of another size and at the start of each product
// (`call`): between products the calling thread may run other code that
// configures tiles (torch's own AMX kernels).
void configure(int rows, uint64_t call) {
  struct Loaded {
    uint64_t call = 0;
    int rows = 0;
  };
  thread_local Loaded loaded;
  if (loaded.call == call && loaded.rows == rows) return;
  amx::Config c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = (uint8_t)(t < 6 ? rows : kGroupsPerTile);
    c.colsb[t] = amx::kRowBytes;
  }
  amx::configure(c);
  loaded.call = call;
  loaded.rows = rows;
}

// The calling thread's tile shapes, put back when a product ends (as the
// product found them, or none): the caller's thread is the application's, and
// other code on it may hold shapes of its own between its calls
class CallerShapes {
 public:
  CallerShapes() { amx::save(saved_); }
  ~CallerShapes() {
    if (saved_.palette != 0)
      amx::configure(saved_);
    else
      amx::release();
  }
  CallerShapes(const CallerShapes&) = delete;
  CallerShapes& operator=(const CallerShapes&) = delete;

 private:
  amx::Config saved_;
};

// rows x NR panels (NR <= 4) of outputs from n0
template <int NR>
void amx_tile(const Q8In* xq, int ldq, int KG, const int8_t* panel, size_t pstride, int rows, const float* sx,
              float* y, int ldy, int n0, const Linear& L) {
  amx::zero<0>();
  if constexpr (NR > 1) amx::zero<1>();
  if constexpr (NR > 2) amx::zero<2>();
  if constexpr (NR > 3) amx::zero<3>();
  constexpr size_t kB = (size_t)Q8_GROUP * PANEL;  // bytes of one k group of a panel: a B tile's row
  for (int g = 0; g < KG; g += kGroupsPerTile) {
    const int8_t* b = panel + (size_t)g * kB;
    amx::load<4>(xq + (size_t)g * Q8_GROUP, ldq);
    amx::load<6>(b, kB);
    amx::dpbusd<0, 4, 6>();
    if constexpr (NR > 1) {
      amx::load<7>(b + pstride, kB);
      amx::dpbusd<1, 4, 7>();
    }
    if constexpr (NR > 2) {
      amx::load<6>(b + 2 * pstride, kB);
      amx::dpbusd<2, 4, 6>();
    }
    if constexpr (NR > 3) {
      amx::load<7>(b + 3 * pstride, kB);
      amx::dpbusd<3, 4, 7>();
    }
  }
  alignas(64) int32_t sums[kPanelsPerTile][amx::kMaxRows][PANEL];
  amx::store<0>(sums[0], sizeof(sums[0][0]));
  if constexpr (NR > 1) amx::store<1>(sums[1], sizeof(sums[0][0]));
  if constexpr (NR > 2) amx::store<2>(sums[2], sizeof(sums[0][0]));
  if constexpr (NR > 3) amx::store<3>(sums[3], sizeof(sums[0][0]));
  q8_outputs(&sums[0][0][0], PANEL, (size_t)amx::kMaxRows * PANEL, rows, NR, sx, y, ldy, n0, L.N, L.ws.data(),
             L.wsum.data(), L.b.data(), L.has_bias);
}

// Two blocks of `rows` rows (from xa and xb) x NR <= 2 panels: each B tile
// loaded feeds both blocks (C tiles 0-1: block a, 2-3: block b)
template <int NR>
void amx_tile_pair(const Q8In* xa, const Q8In* xb, int ldq, int KG, const int8_t* panel, size_t pstride, int rows,
                   const float* sxa, const float* sxb, float* ya, float* yb, int ldy, int n0, const Linear& L) {
  amx::zero<0>();
  amx::zero<2>();
  if constexpr (NR > 1) {
    amx::zero<1>();
    amx::zero<3>();
  }
  constexpr size_t kB = (size_t)Q8_GROUP * PANEL;
  for (int g = 0; g < KG; g += kGroupsPerTile) {
    const int8_t* b = panel + (size_t)g * kB;
    amx::load<4>(xa + (size_t)g * Q8_GROUP, ldq);
    amx::load<5>(xb + (size_t)g * Q8_GROUP, ldq);
    amx::load<6>(b, kB);
    amx::dpbusd<0, 4, 6>();
    amx::dpbusd<2, 5, 6>();
    if constexpr (NR > 1) {
      amx::load<7>(b + pstride, kB);
      amx::dpbusd<1, 4, 7>();
      amx::dpbusd<3, 5, 7>();
    }
  }
  alignas(64) int32_t sums[kPanelsPerTile][amx::kMaxRows][PANEL];
  amx::store<0>(sums[0], sizeof(sums[0][0]));
  amx::store<2>(sums[2], sizeof(sums[0][0]));
  if constexpr (NR > 1) {
    amx::store<1>(sums[1], sizeof(sums[0][0]));
    amx::store<3>(sums[3], sizeof(sums[0][0]));
  }
  const size_t pstride_sums = (size_t)amx::kMaxRows * PANEL;
  q8_outputs(&sums[0][0][0], PANEL, pstride_sums, rows, NR, sxa, ya, ldy, n0, L.N, L.ws.data(), L.wsum.data(),
             L.b.data(), L.has_bias);
  q8_outputs(&sums[2][0][0], PANEL, pstride_sums, rows, NR, sxb, yb, ldy, n0, L.N, L.ws.data(), L.wsum.data(),
             L.b.data(), L.has_bias);
}

using AmxTileFn = void (*)(const Q8In*, int, int, const int8_t*, size_t, int, const float*, float*, int, int,
                           const Linear&);
AmxTileFn amx_tile_fn(int nr) {
  switch (nr) {
    case 1: return amx_tile<1>;
    case 2: return amx_tile<2>;
    case 3: return amx_tile<3>;
    default: return amx_tile<4>;
  }
}

}  // namespace

#if defined(FA_TEST_HOOKS)
int amx_min_rows() { return g_amx_min_rows.load(std::memory_order_relaxed); }
void set_amx_min_rows(int rows) { g_amx_min_rows.store(std::max(rows, 1), std::memory_order_relaxed); }
int64_t amx_products() { return g_amx_products.load(std::memory_order_relaxed); }
#endif

void linear_q8_amx(Pool& pool, const Linear& L, const Q8In* q, int ldq, const float* sx, int M, float* y, int ldy) {
  if (M <= 0) return;
#if defined(FA_TEST_HOOKS)
  g_amx_products.fetch_add(1, std::memory_order_relaxed);
#endif
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const int KG = L.KG();
  const size_t pstride = (size_t)KG * Q8_GROUP * PANEL;
  // row blocks of one size, at most 16 rows, the last one ending at row M (it
  // may overlap the one before: those rows are computed twice, the same bits)
  const int nb = (M + amx::kMaxRows - 1) / amx::kMaxRows, rows = (M + nb - 1) / nb;
  const int n_groups = (L.P + kPanelsPerTile - 1) / kPanelsPerTile;
  const int chunks = product_chunks(pool, L, M, n_groups);
  auto body = [&](int c) {
    const int g0 = (int)((int64_t)n_groups * c / chunks), g1 = (int)((int64_t)n_groups * (c + 1) / chunks);
    configure(rows, call);
    for (int g = g0; g < g1; ++g) {  // a group's weights read from memory once, for every block
      const int p0 = g * kPanelsPerTile, np = std::min(kPanelsPerTile, L.P - p0);
      const int8_t* w = L.wq.data() + (size_t)p0 * pstride;
      int bi = 0;
      for (; bi + 1 < nb; bi += 2) {  // blocks in pairs, 2 panels at a time
        const int ma = bi * rows, mb = std::min((bi + 1) * rows, M - rows);
        for (int pp = 0; pp < np; pp += 2)
          (np - pp >= 2 ? amx_tile_pair<2> : amx_tile_pair<1>)(
              q + (size_t)ma * ldq, q + (size_t)mb * ldq, ldq, KG, w + (size_t)pp * pstride, pstride, rows, sx + ma,
              sx + mb, y + (size_t)ma * ldy, y + (size_t)mb * ldy, ldy, (p0 + pp) * PANEL, L);
      }
      if (bi < nb) {  // the last block alone, 4 panels at a time
        const int m0 = M - rows;
        amx_tile_fn(np)(q + (size_t)m0 * ldq, ldq, KG, w, pstride, rows, sx + m0, y + (size_t)m0 * ldy, ldy,
                        p0 * PANEL, L);
      }
    }
  };
  CallerShapes keep;  // (the pool's own threads keep the last shapes they loaded)
  pool.run(body, chunks);
}

}  // namespace fa

#endif  // FA_AMX
