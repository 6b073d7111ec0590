// Hints that ask for a linear layer's weights ahead of use (linear.cpp's
// tiles): where the next tile's or the next group's panels lie, and when to
// ask for each line.  Hints only: no result depends on them.
#pragma once

#include <algorithm>
#include <cstddef>

namespace fa {

// Rows in several blocks (an encoder's, a batch's) read a group of panels once
// per block, the first block from L3 or memory, the others from L2.  While a
// group's blocks run, its tiles ask for the next group's panels (of the same
// thread's share), each tile an even slice of them spread over its k steps, so
// the next group's first block finds them in L2 too; on its own, that block
// waits on its loads.  On a 2-core EPYC (Zen 4) guest, 1 thread, the encoder
// alone (compare_builds.py, against the build without hints): d=512 int8
// 1.12x as fast, d=1024 int8 1.13x, d=512 float32 1.00x (bound by its
// arithmetic).  A hint only: no result changes.
struct Ahead {
  const char* first = nullptr;  // the tile's slice: `lines` cache lines from first
  int lines = 0;
  const char* end = nullptr;  // one block: the end of the thread's share (stream hints)
};

// Rows in one block (a pass's positions): a tile of NR panels reads them as NR
// streams, and the tiles of a thread's share follow each other through
// consecutive panels.  At each cache line a tile of several rows asks, per
// panel, for the line kStreamAhead lines further on, which near a panel's end is
// the matching line of the next tile's panels: without that, every tile's
// streams start cold, and a tile whose many multiply-adds per weight keep few
// loads in flight waits at each start (hints that stopped at a panel's end,
// 16-256 k groups ahead, changed nothing measurable).  One-row tiles (greedy
// steps) ask too, from kStreamMinRows rows: on the Zen 4 guest, 1 thread,
// int8 greedy at d=512 1.04-1.13x and at d=1024 1.14-1.15x as fast with them
// (compare_builds.py, against one-row tiles without hints, both orders; IAD
// and the encoder within 1-4%; float32 d=512 greedy 0.98-1.08x, the host's
// spread); on the Xeon with AMX below they were no faster on one row
// (linear_rate.py: 584-590 against 575-592 us), so that target keeps them to
// tiles of several rows.  The hints go to the outer caches (prefetcht2;
// L1 on AMX CPUs, below) and never past the thread's share.  On a 2-core EPYC
// (Zen 4) guest, 1 thread, whole IAD decodes with both kinds of hints
// (compare_builds.py, against the build without hints): d=512 int8 1.21x,
// d=1024 int8 1.19x, d=512 float32 1.00x; the 9+3 at d=128 in float32, whose
// decoder stays in the caches, lost 6-7% with them, so each side asks only
// beyond kPrefetchModelBytes (linear.h).  A hint only: no result changes.
// On Intel's AMX CPUs (the avx512amx target) the hints go to L1 (prefetcht0),
// 32 lines ahead: on a 2-core Xeon guest with AMX, 1 thread, a d=512 int8
// decoder pass's products (linear_rate.py --decoder-layers 3) over 8 rows took
// 710-730 us against 754-800 with prefetcht2 at 16-256 lines (one row: 584),
// over 5 rows 655-667 against 664-708; float32 within 2%.
#if defined(FA_AMX) && !defined(FA_AMX_EMULATE)
constexpr int kStreamAhead = 32;
constexpr int kStreamLocality = 3;  // __builtin_prefetch's: 3 = prefetcht0
constexpr int kStreamMinRows = 2;  // the fewest rows of a tile that asks
#else
constexpr int kStreamAhead = 64;
constexpr int kStreamLocality = 1;  // prefetcht2
constexpr int kStreamMinRows = 1;
#endif
// Where a tile's line kStreamAhead lines on lies, from the line it reads: a
// constant distance while it stays in the tile's panels, another once it has
// run into the next tile's, so each hint is one prefetch per panel at a fixed
// distance from the weights just loaded (computing the line at each step cost
// the loop as many instructions again as its multiply-adds).
struct StreamHints {
  ptrdiff_t off[2] = {0, 0};  // bytes from the line read to the line asked for
  int switch_k = 0;           // the k step where off[1] takes over
  int limit[2] = {0, 0};      // k steps below which off[0] / off[1] stay before the share's end
  StreamHints() = default;
  // nr panels of panel_bytes from panel, `step` bytes per k step, the thread's share ending at end
  StreamHints(const char* panel, size_t panel_bytes, int nr, int steps, size_t step, const char* end) {
    const ptrdiff_t pb = (ptrdiff_t)panel_bytes, ahead = (ptrdiff_t)kStreamAhead * 64;
    const ptrdiff_t wraps = ahead / pb;  // whole panels the distance spans
    const ptrdiff_t to_switch = (wraps + 1) * pb - ahead;
    switch_k = (int)std::min<ptrdiff_t>(steps, (to_switch + (ptrdiff_t)step - 1) / (ptrdiff_t)step);
    for (int h = 0; h < 2; ++h) {
      off[h] = (wraps + h) * (nr - 1) * pb + ahead;
      const ptrdiff_t room = end - panel - (ptrdiff_t)(nr - 1) * pb - off[h];
      limit[h] = room <= 0 ? 0 : (int)std::min<ptrdiff_t>(steps, (room + (ptrdiff_t)step - 1) / (ptrdiff_t)step);
    }
  }
  // the first panel's line to ask for at k step k (cur: that panel's weights of
  // the step, STEP bytes per step), once per cache line; null: none at this step
  template <size_t STEP>
  __attribute__((always_inline)) const char* line(const void* cur, int k) const {
    constexpr int per_line = STEP >= 64 ? 1 : (int)(64 / STEP);
    if (k % per_line != 0) return nullptr;
    const int h = k >= switch_k;
    return k < limit[h] ? static_cast<const char*>(cur) + off[h] : nullptr;
  }
  // asks for that line in each of the NR panels, pstride bytes apart
  template <size_t STEP>
  __attribute__((always_inline)) void ask(const void* cur, size_t pstride, int NR, int k) const {
    if (const char* p = line<STEP>(cur, k))
      for (int j = 0; j < NR; ++j) __builtin_prefetch(p + (size_t)j * pstride, 0, kStreamLocality);
  }
};

// Spreads a tile's slice over its k steps: a line whenever the steps so far
// have earned one (lines / steps per step), without a division.  Inlined
// always: GCC counts a function of prefetches alone as free of effects and
// drops its calls.
struct AheadCursor {
  const char* next;
  int lines, debt = 0;
  explicit AheadCursor(const Ahead& a) : next(a.first), lines(a.lines) {}
  __attribute__((always_inline)) void step(int steps) {
    for (debt += lines; debt >= steps; debt -= steps, next += 64) __builtin_prefetch(next, 0, 2);
  }
};

}  // namespace fa
