// The engine's counters of decoding (see counters.h).
#include "loop/counters.h"

#include <algorithm>

namespace fa {

void LoopStats::count(int n_drafted, int n_accepted) {
  drafted += n_drafted;
  accepted += n_accepted;
  for (int j = 0; j < n_drafted; ++j) {
    const int slot = std::min(j, kLoopPositions - 1);
    position_drafted[slot] += 1;
    position_accepted[slot] += j < n_accepted;
  }
}

}  // namespace fa
