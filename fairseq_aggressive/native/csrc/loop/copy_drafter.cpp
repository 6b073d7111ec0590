// Source-copy drafts (IAD with one draft per pass, Sun et al. 2021): each
// row's copy source (copy_source.h) drafts from where its copy stands, and
// after a rejection from where the output's shortest unique suffix occurs;
// the drafts, and the rates counted, are drafters/input_copy.py's with one
// branch.
#include <stdexcept>
#include <vector>

#include "loop/copy_source.h"
#include "loop/drafter.h"

namespace fa {

namespace {

class CopyDrafter : public Drafter {
 public:
  explicit CopyDrafter(const DrafterSettings& s) : s_(s) {
    if (s.ngram_min < 1 || s.ngram_max < s.ngram_min) throw std::invalid_argument("copy drafter: bad suffix lengths");
  }

  void join(Decoder&, const Joining& j) override {
    for (int i = 0, o = 0; i < j.n; o += j.copy_len[i++]) {
      const int slot = j.slot[i];
      if (slot >= (int)rows_.size()) rows_.resize(slot + 1);
      Row& r = rows_[slot];
      r.src.assign(j.copy + o, j.copy + o + j.copy_len[i]);
      r.copy.start(r.src.data(), (int)r.src.size());
    }
  }

  void leave(int slot) override {
    rows_[slot].src.clear();
    rows_[slot].copy.start(nullptr, 0);
  }

  void propose(Decoder&, const PassRows& rows, DraftPolicy* policy, Drafts& out) override {
    const int n = rows.n;
    start_.assign(n, kNoCopy);
    out.cand.resize(n);
    for (int i = 0; i < n; ++i) {
      const Row& r = rows_[rows.slot[i]];
      bool resynced;
      const int cap = r.copy.candidate(*rows.out[i], rows.room[i], s_.ngram_min, s_.ngram_max, &start_[i], &resynced);
      out.cand[i] = {cap, resynced, rows.conf[i]};
    }
    draft_lengths(policy, out.cand, out.len, /*checked=*/true);
    out.tokens.resize(n);
    out.drafted = false;
    for (int i = 0; i < n; ++i) {
      const int L = out.len[i];
      out.tokens[i] = L > 0 ? rows_[rows.slot[i]].copy.src + start_[i] : nullptr;
      out.drafted |= L > 0;
      // drafts as made: a copy goes on only from a verified draft; a policy that
      // shortened one to nothing keeps its place (the row's token is checked against it)
      if (policy == nullptr && L == 0) start_[i] = kNoCopy;
    }
    kind_.resize(n);
    for (int i = 0; i < n; ++i) kind_[i] = out.cand[i].resynced;
  }

  // what the drafter learns (InputCopyDrafter.update with one branch), for the rows that go on
  void learn(Decoder&, State&, const Verified& v, RunStats& stats) override {
    CopyRates& c = stats.copy;
    for (int i = 0; i < v.n; ++i) {
      if (v.done[i]) continue;
      const int L = v.drafted[i], k = v.accepted[i];
      const int32_t last = v.choice[v.offset[i] + v.n_emit[i] - 1];
      rows_[v.slot[i]].copy.update(start_[i], L, k, last);
      if (L == 0) continue;
      (kind_[i] ? c.sync_trials : c.copy_trials) += 1;
      (kind_[i] ? c.sync_hits : c.copy_hits) += k >= 1;
      if (k >= 1) {
        c.cont_hits += k - 1;
        c.cont_trials += k - 1 + (k < L);
      }
    }
  }

 private:
  struct Row {
    std::vector<int32_t> src;  // the copy source (copy points into it)
    CopySource copy;
  };
  DrafterSettings s_;
  std::vector<Row> rows_;  // by slot
  // this pass's rows: where each draft copies from (kNoCopy: none), whether it re-anchored
  std::vector<int32_t> start_, kind_;
};

}  // namespace

std::unique_ptr<Drafter> make_copy_drafter(const DrafterSettings& s, Decoder*) {
  return std::make_unique<CopyDrafter>(s);
}

}  // namespace fa
