// AMX tiles for the int8 products (FA_AMX builds): eight tile registers of up
// to 16 rows x 64 bytes, a configuration that gives each its shape, and
// TDPBUSD, which adds to each int32 of a C tile the dot product of a row of A
// (uint8) with a column of B (int8, stored as k groups of 4 bytes per column):
//   C[m][n] += sum_{g < colsb(A) / 4} sum_{h < 4} A[m][4g + h] * B[g][4n + h]
// in exact int32 arithmetic: the sums vpdpbusd (VNNI) forms, so an AMX target
// computes the same bits as the avx512vnni one.
//
// FA_AMX_EMULATE replaces the instructions by this definition in portable code
// (the test-only generic-amx target), shape checks included: the tile code's
// layout, padding and blocking are then tested on any CPU, and a shape the
// hardware would fault on throws.
#pragma once

#if defined(FA_AMX)

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if !defined(FA_AMX_EMULATE)
#if !(defined(__AMX_TILE__) && defined(__AMX_INT8__))
#error "FA_AMX needs -mamx-tile -mamx-int8 (or FA_AMX_EMULATE)"
#endif
#include "cpu/intrinsics.h"
#endif

namespace fa {
namespace amx {

constexpr int kMaxRows = 16;   // rows of a tile
constexpr int kRowBytes = 64;  // bytes of a tile row: 16 k groups of 4 (A), 16 int32 columns (B, C)

// The 64-byte operand of LDTILECFG (palette 1)
struct alignas(64) Config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(Config) == 64, "LDTILECFG reads 64 bytes");

// Whether this process may run tiles: the CPU has AMX-TILE and AMX-INT8, the
// OS saves their state, and Linux granted the process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here).  1: yes; -1: the CPU or
// OS lacks them; -2: the permission was refused.  Always 1 when emulated.
int state();

#if defined(FA_AMX_EMULATE)
// ------------------------------------------------- the definition, in software
struct Tiles {
  Config cfg;
  bool configured = false;
  uint8_t t[8][kMaxRows][kRowBytes];
};
inline Tiles& tiles() {
  thread_local Tiles s;
  return s;
}
[[noreturn]] inline void fault(const char* what) { throw std::logic_error(std::string("AMX tile fault: ") + what); }
inline void configure(const Config& c) {
  Tiles& s = tiles();
  for (int i = 0; i < 8; ++i)
    if (c.rows[i] > kMaxRows || c.colsb[i] > kRowBytes || (c.rows[i] == 0) != (c.colsb[i] == 0))
      fault("a tile shape out of range");
  s.cfg = c;
  s.configured = true;
  std::memset(s.t, 0, sizeof(s.t));  // LDTILECFG zeroes every tile
}
// STTILECFG: the loaded shapes (palette 0 where none are)
inline void save(Config& c) {
  const Tiles& s = tiles();
  c = s.configured ? s.cfg : Config{};
  if (!s.configured) c.palette = 0;
}
// TILERELEASE: back to no shapes
inline void release() { tiles().configured = false; }
inline void check(int i) {
  const Tiles& s = tiles();
  if (!s.configured || s.cfg.rows[i] == 0) fault("a tile used without a shape");
}
template <int T>
void load(const void* p, size_t stride) {
  check(T);
  Tiles& s = tiles();
  std::memset(s.t[T], 0, sizeof(s.t[T]));
  for (int r = 0; r < s.cfg.rows[T]; ++r)
    std::memcpy(s.t[T][r], static_cast<const uint8_t*>(p) + r * stride, s.cfg.colsb[T]);
}
template <int T>
void zero() {
  check(T);
  std::memset(tiles().t[T], 0, sizeof(tiles().t[T]));
}
template <int T>
void store(void* p, size_t stride) {
  check(T);
  const Tiles& s = tiles();
  for (int r = 0; r < s.cfg.rows[T]; ++r)
    std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.t[T][r], s.cfg.colsb[T]);
}
// TDPBUSD C, A, B (faults where the instruction raises #UD)
template <int C, int A, int B>
void dpbusd() {
  check(C);
  check(A);
  check(B);
  Tiles& s = tiles();
  const Config& c = s.cfg;
  if (c.rows[C] != c.rows[A] || c.colsb[C] != c.colsb[B] || c.colsb[A] != 4 * c.rows[B] || c.colsb[C] % 4 ||
      c.colsb[A] % 4)
    fault("TDPBUSD operands of mismatched shapes");
  for (int m = 0; m < c.rows[C]; ++m)
    for (int n = 0; n < c.colsb[C] / 4; ++n) {
      uint32_t acc;
      std::memcpy(&acc, &s.t[C][m][4 * n], 4);
      for (int g = 0; g < c.colsb[A] / 4; ++g)
        for (int h = 0; h < 4; ++h)
          acc += (uint32_t)((int32_t)s.t[A][m][4 * g + h] * (int32_t)(int8_t)s.t[B][g][4 * n + h]);
      std::memcpy(&s.t[C][m][4 * n], &acc, 4);
    }
}
#else
// ------------------------------------------------- the instructions
// (GCC's _tile_* name their tile in the assembly text: a literal number, so
// one specialization per tile, and per product the kernels use)
inline void configure(const Config& c) { _tile_loadconfig(&c); }
inline void save(Config& c) { _tile_storeconfig(&c); }
inline void release() { _tile_release(); }
template <int T>
void load(const void* p, size_t stride);
template <int T>
void zero();
template <int T>
void store(void* p, size_t stride);
template <int C, int A, int B>
void dpbusd();
#define FA_AMX_TILE(T)                                                            \
  template <>                                                                     \
  inline void load<T>(const void* p, size_t stride) { _tile_loadd(T, p, stride); } \
  template <>                                                                     \
  inline void zero<T>() { _tile_zero(T); }                                        \
  template <>                                                                     \
  inline void store<T>(void* p, size_t stride) { _tile_stored(T, p, stride); }
FA_AMX_TILE(0)
FA_AMX_TILE(1)
FA_AMX_TILE(2)
FA_AMX_TILE(3)
FA_AMX_TILE(4)
FA_AMX_TILE(5)
FA_AMX_TILE(6)
FA_AMX_TILE(7)
#undef FA_AMX_TILE
#define FA_AMX_DPBUSD(C, A, B) \
  template <>                  \
  inline void dpbusd<C, A, B>() { _tile_dpbusd(C, A, B); }
FA_AMX_DPBUSD(0, 4, 6)
FA_AMX_DPBUSD(1, 4, 7)
FA_AMX_DPBUSD(2, 4, 6)
FA_AMX_DPBUSD(3, 4, 7)
FA_AMX_DPBUSD(2, 5, 6)
FA_AMX_DPBUSD(3, 5, 7)
#undef FA_AMX_DPBUSD
#endif

}  // namespace amx
}  // namespace fa

#endif  // FA_AMX
