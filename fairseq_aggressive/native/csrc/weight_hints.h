// Hints that ask for a linear layer's weights ahead of use (linear.cpp's
// tiles): where the next tile's or the next group's panels lie, and when to
// ask for each line.  Hints only: no result depends on them.
#pragma once

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
// steps) keep enough loads in flight of their own.  The hints go to the outer
// caches (prefetcht2) and never past the thread's share.  On a 2-core EPYC
// (Zen 4) guest, 1 thread, whole IAD decodes with both kinds of hints
// (compare_builds.py, against the build without hints): d=512 int8 1.21x,
// d=1024 int8 1.19x, d=512 float32 1.00x; the 9+3 at d=128 in float32, whose
// decoder stays in the caches, lost 6-7% with them, so each side asks only
// beyond kPrefetchModelBytes (linear.h).  A hint only: no result changes.
constexpr int kStreamAhead = 64;
__attribute__((always_inline)) inline void ask_streams(const char* panel, size_t pstride, int NR, int line, int lines,
                                                       const char* end) {
  int ahead = line + kStreamAhead;
  const char* base = panel;
  while (ahead >= lines) {
    ahead -= lines;
    base += NR * pstride;
  }
  for (int j = 0; j < NR; ++j) {
    const char* p = base + j * pstride + (size_t)ahead * 64;
    if (p < end) __builtin_prefetch(p, 0, 1);
  }
}
// the same at k step k of `steps`, the panels holding `step` bytes per k step (16-64)
__attribute__((always_inline)) inline void ask_streams_at(const void* panel, size_t pstride, int NR, int k, int steps,
                                                          size_t step, const char* end) {
  const int per_line = (int)(64 / step);
  if (k % per_line == 0)
    ask_streams(static_cast<const char*>(panel), pstride, NR, k / per_line, (steps + per_line - 1) / per_line, end);
}

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
