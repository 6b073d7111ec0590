// A sentence's copy source for source-copy drafting (IAD, Sun et al. 2021:
// drafters/input_copy.py with one branch): the source in target ids, where
// the copy stands, how it re-anchors after a rejection and what it learns
// from a pass.  The engine's copy drafter (copy_drafter.cpp) drafts with it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fa {

constexpr int kNoCopy = -1;

struct CopySource {
  const int32_t* src = nullptr;
  int len = 0;
  int ptr = kNoCopy;  // the next source position to draft, or kNoCopy

  void start(const int32_t* s, int n) {
    src = s;
    len = n;
    ptr = n > 0 ? 0 : kNoCopy;
  }

  // The source position right after the unique occurrence of out's suffix of
  // n tokens, for the shortest n in [nmin, nmax] (n <= out's length) whose
  // suffix occurs once; kNoCopy where the shortest that occurs at all occurs
  // more than once up to nmax, where one does not occur (no longer one can),
  // or where the unique occurrence ends the source (input_copy.py's _resync).
  int resync(const std::vector<int32_t>& out, int nmin, int nmax) const {
    const int have = (int)out.size();
    for (int n = nmin; n <= std::min(nmax, have); ++n) {
      const int32_t* suffix = out.data() + have - n;
      int found = 0, end = kNoCopy;
      for (int e = n; e <= len && found < 2; ++e)
        if (std::equal(suffix, suffix + n, src + e - n)) {
          ++found;
          end = e;
        }
      if (found == 0) return kNoCopy;
      if (found == 1) return end < len ? end : kNoCopy;
    }
    return kNoCopy;
  }

  // Where this pass's draft copies from (kNoCopy: none); *resynced says
  // whether it re-anchored (no copy was under way)
  int draft_start(const std::vector<int32_t>& out, int nmin, int nmax, bool* resynced) const {
    *resynced = ptr == kNoCopy;
    return ptr != kNoCopy ? ptr : resync(out, nmin, nmax);
  }

  // This pass's draft: where it copies from (*start; kNoCopy: none) and the
  // most tokens it may verify (at most room, 0 where room <= 0: no draft asked)
  int candidate(const std::vector<int32_t>& out, int room, int nmin, int nmax, int* start, bool* resynced) const {
    *start = kNoCopy;
    *resynced = false;
    if (room <= 0) return 0;
    *start = draft_start(out, nmin, nmax, resynced);
    return *start != kNoCopy ? std::min(room, len - *start) : 0;
  }

  // After a pass that verified L tokens copied from `start` (kNoCopy: none)
  // and accepted k of them, emitting `last` after them: the copy goes on
  // where every drafted token was accepted and the token after them is the
  // source's next one (InputCopyDrafter.update with one branch)
  void update(int start, int L, int k, int32_t last) {
    ptr = kNoCopy;
    if (start == kNoCopy) return;
    const int nxt = start + k;
    if (k == L && nxt < len && last == src[nxt] && nxt + 1 < len) ptr = nxt + 1;
  }
};

}  // namespace fa
