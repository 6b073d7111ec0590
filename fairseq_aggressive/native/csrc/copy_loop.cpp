// The loop of source-copy drafting and greedy search in the engine (see copy_loop.h).
#include "copy_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "pass.h"

namespace fa {

namespace {

constexpr int kNone = -1;

// One sentence's copy source and where its copy stands (input_copy.py's
// src, ptr; anchor and since only serve several branches, absent here).
struct Copy {
  const int32_t* src = nullptr;
  int len = 0;
  int ptr = 0;  // the next source position to draft, or kNone
};

// The source position right after the unique occurrence of out's suffix of n
// tokens, for the shortest n in [nmin, nmax] (n <= out's length) whose suffix
// occurs once; kNone where the shortest that occurs at all occurs more than
// once up to nmax, where one does not occur (no longer one can), or where the
// unique occurrence ends the source (input_copy.py's _resync).
int resync(const Copy& c, const std::vector<int32_t>& out, int nmin, int nmax) {
  const int have = (int)out.size();
  for (int n = nmin; n <= std::min(nmax, have); ++n) {
    const int32_t* suffix = out.data() + have - n;
    int found = 0, end = kNone;
    for (int e = n; e <= c.len && found < 2; ++e)
      if (std::equal(suffix, suffix + n, c.src + e - n)) {
        ++found;
        end = e;
      }
    if (found == 0) return kNone;
    if (found == 1) return end < c.len ? end : kNone;
  }
  return kNone;
}

}  // namespace

int decode_copy(Model& m, State& st, const CopyLoopArgs& a, CopyLoopStats& stats) {
  const int B = a.n, max_len = a.rules.max_len;
  if (B != (int)st.sents.size() || a.output.out_cap < max_len + 1 || a.max_draft < 0 || a.ngram_min < 1 ||
      a.ngram_max < a.ngram_min)
    return -1;
  std::vector<Copy> copy(B);
  for (int b = 0, o = 0; b < B; o += a.src_len[b++]) {
    if (a.src_len[b] < 0 || st.sents[b].len != 0) return -1;
    copy[b].src = a.src + o;
    copy[b].len = a.src_len[b];
    copy[b].ptr = copy[b].len > 0 ? 0 : kNone;
  }
  LoopBatch batch(B, a.first, a.rules, a.output);
  std::vector<int32_t> start, kind;  // per row: the source position its draft copies from (kNone: no draft), re-anchored

  using Clock = std::chrono::steady_clock;
  while (!batch.active().empty()) {
    const int n = (int)batch.active().size();
    const auto t0 = Clock::now();
    start.assign(n, kNone);
    kind.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      const int b = batch.active()[i];
      const int cap = std::min(max_len - batch.outputs().length(b), a.max_draft);
      int r = kNone;
      if (cap > 0) {
        r = copy[b].ptr;
        kind[i] = r == kNone;
        if (r == kNone) r = resync(copy[b], batch.outputs().tokens(b), a.ngram_min, a.ngram_max);
      }
      const int L = r != kNone ? std::min(cap, copy[b].len - r) : 0;
      batch.add_row(b, L > 0 ? copy[b].src + r : nullptr, L);
      start[i] = L > 0 ? r : kNone;
    }
    stats.loop.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    batch.verify(m, st, stats.loop);
    // what the drafter learns (InputCopyDrafter.update with one branch)
    batch.settle(stats.loop, [&](int i, int b, int, int) {
      Copy& c = copy[b];
      c.ptr = kNone;
      if (start[i] == kNone) return;
      const int L = batch.drafted(i), k = batch.accepted(i);
      (kind[i] ? stats.sync_trials : stats.copy_trials) += 1;
      (kind[i] ? stats.sync_hits : stats.copy_hits) += k >= 1;
      if (k >= 1) {
        stats.cont_hits += k - 1;
        stats.cont_trials += k - 1 + (k < L);
      }
      const int nxt = start[i] + k;
      if (k == L && nxt < c.len && batch.last(b) == c.src[nxt] && nxt + 1 < c.len) c.ptr = nxt + 1;
    });
  }
  batch.finish();
  return 0;
}

}  // namespace fa
