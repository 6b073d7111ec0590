// The loop of source-copy drafting and greedy search in the engine (see copy_loop.h).
#include "copy_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "copy_source.h"
#include "draft_lengths.h"
#include "pass.h"

namespace fa {


int decode_copy(Decoder& m, State& st, const CopyLoopArgs& a, CopyLoopStats& stats) {
  const int B = a.n, max_len = a.rules.max_len;
  if (B != (int)st.sents.size() || a.output.out_cap < max_len + 1 || a.max_draft < -1 || a.ngram_min < 1 ||
      a.ngram_max < a.ngram_min)
    return -1;
  std::vector<CopySource> copy(B);
  for (int b = 0, o = 0; b < B; o += a.src_len[b++]) {
    if (a.src_len[b] < 0 || st.sents[b].len != 0) return -1;
    copy[b].start(a.src + o, a.src_len[b]);
  }
  LoopBatch batch(B, a.first, a.rules, a.output);
  DraftPolicy* policy = a.budget ? &draft_policy(m) : nullptr;
  // per row: the source position its draft copies from (kNoCopy: none), re-anchored,
  // the verifier's confidence in its last token, the longest draft it may verify
  std::vector<int32_t> start, kind;
  std::vector<DraftCandidate> cand;
  std::vector<int> lens;

  using Clock = std::chrono::steady_clock;
  while (!batch.active().empty()) {
    const int n = (int)batch.active().size();
    const auto t0 = Clock::now();
    start.assign(n, kNoCopy);
    kind.assign(n, 0);
    cand.resize(n);
    for (int i = 0; i < n; ++i) {
      const int b = batch.active()[i];
      const int room = draft_room(max_len - batch.outputs().length(b), a.max_draft);
      bool resynced;
      const int cap = copy[b].candidate(batch.outputs().tokens(b), room, a.ngram_min, a.ngram_max, &start[i], &resynced);
      kind[i] = resynced;
      cand[i] = {cap, resynced, Acceptance::confidence(batch.outputs().last_score(b))};
    }
    draft_lengths(policy, cand, lens, /*checked=*/true);
    int positions = 0;
    for (int i = 0; i < n; ++i) {
      const int b = batch.active()[i], L = lens[i];
      batch.add_row(b, L > 0 ? copy[b].src + start[i] : nullptr, L);
      // drafts as made: a copy goes on only from a verified draft; a policy that
      // shortened one to nothing keeps its place (the row's token is checked against it)
      if (policy == nullptr && L == 0) start[i] = kNoCopy;
      positions += 1 + L;
    }
    const auto t1 = Clock::now();
    stats.loop.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    batch.verify(m, st, stats.loop);
    if (policy != nullptr) {
      const auto t2 = Clock::now();
      policy->cost.observe(positions, std::chrono::duration<double, std::milli>(t2 - t1).count());
      int emitted = n;
      for (int i = 0; i < n; ++i) {
        policy->acceptance.observe(cand[i].resynced, cand[i].conf, batch.drafted(i), batch.accepted(i));
        emitted += batch.accepted(i);
      }
      realized_pass(policy, n, positions > n, emitted, t0);
    }
    // what the drafter learns (InputCopyDrafter.update with one branch)
    batch.settle(stats.loop, [&](int i, int b, int, int) {
      const int L = batch.drafted(i), k = batch.accepted(i);
      copy[b].update(start[i], L, k, batch.last(b));
      if (L == 0) return;
      (kind[i] ? stats.sync_trials : stats.copy_trials) += 1;
      (kind[i] ? stats.sync_hits : stats.copy_hits) += k >= 1;
      if (k >= 1) {
        stats.cont_hits += k - 1;
        stats.cont_trials += k - 1 + (k < L);
      }
    });
  }
  batch.finish();
  return 0;
}

}  // namespace fa
