// Blockwise parallel decoding (Stern et al. 2018): the proposal heads of a
// transformer_blockwise model read the verifier's features that chose a row's
// last emitted token and propose its next block, so predicting and verifying
// merge: each pass is one pass of the model plus the heads over the rows that
// go on.  The drafts are drafters/blockwise_heads.py's on the native verifier
// (whose heads are these).
#include <algorithm>
#include <vector>

#include "cpu/ops.h"
#include "loop/block_drafter.h"
#include "loop/drafter.h"

namespace fa {

int heads_pass(Decoder& m, State& st, int n, const int32_t* sent, const float* x, int32_t* out) {
  const Linear &fc1 = m.w.heads_fc1, &fc2 = m.w.heads_fc2;
  const int H = m.w.n_heads, C = m.cfg.C, hidden = fc1.N;
  if (H == 0) return -1;
  std::vector<float> inner((size_t)n * hidden), heads((size_t)n * H * C);
  linear(m.pool, fc1, x, C, n, inner.data(), hidden);
  relu_rows(inner.data(), inner.size());
  linear(m.pool, fc2, inner.data(), hidden, n, heads.data(), H * C);
  std::vector<int32_t> sent_of((size_t)n * H);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < H; ++j) {
      add_rows(heads.data() + ((size_t)r * H + j) * C, x + (size_t)r * C, C);  // each head's residual
      sent_of[(size_t)r * H + j] = sent[r];
    }
  choose_rows(m, st, heads.data(), n * H, sent_of.data(), out, 1);
  return 0;
}

namespace {

class BlockwiseDrafter : public Drafter {
 public:
  bool reads_features() const override { return true; }
  int check(const Decoder& m) const override { return m.w.n_heads > 0 ? 0 : -1; }

  void join(Decoder&, const Joining& j) override {
    for (int i = 0; i < j.n; ++i) {
      if (j.slot[i] >= (int)block_.size()) block_.resize(j.slot[i] + 1);
      block_[j.slot[i]].clear();  // the first pass drafts nothing
    }
  }

  void leave(int slot) override { block_[slot].clear(); }

  void propose(Decoder&, const PassRows& rows, DraftPolicy* policy, Drafts& out) override {
    const int n = rows.n;
    out.cand.resize(n);
    for (int i = 0; i < n; ++i)
      out.cand[i] = {std::max(0, std::min(rows.room[i], (int)block_[rows.slot[i]].size())), false, rows.conf[i]};
    draft_lengths(policy, out.cand, out.len, /*checked=*/true);
    out.tokens.resize(n);
    out.drafted = false;
    for (int i = 0; i < n; ++i) {
      out.tokens[i] = out.len[i] > 0 ? block_[rows.slot[i]].data() : nullptr;
      out.drafted |= out.len[i] > 0;
    }
  }

  // the heads read the features that chose each going row's last emitted token
  void learn(Decoder& m, State& st, const Verified& v, RunStats&) override {
    const int H = m.w.n_heads, C = v.feat_width;
    at_last_.clear();
    going_.clear();
    for (int i = 0; i < v.n; ++i) {
      if (v.done[i]) continue;
      const float* f = v.feats + (size_t)(v.offset[i] + v.n_emit[i] - 1) * C;
      at_last_.insert(at_last_.end(), f, f + C);
      going_.push_back(v.slot[i]);
    }
    const int kept = (int)going_.size();
    if (kept == 0) return;
    proposed_.resize((size_t)kept * H);
    heads_pass(m, st, kept, going_.data(), at_last_.data(), proposed_.data());
    for (int i = 0; i < kept; ++i)
      block_[going_[i]].assign(proposed_.begin() + (size_t)i * H, proposed_.begin() + (size_t)(i + 1) * H);
  }

 private:
  std::vector<std::vector<int32_t>> block_;  // by slot: the heads' proposal for the next pass
  std::vector<int32_t> going_, proposed_;
  std::vector<float> at_last_;
};

}  // namespace

std::unique_ptr<Drafter> make_blockwise_drafter(const DrafterSettings&, Decoder*) {
  return std::make_unique<BlockwiseDrafter>();
}

}  // namespace fa
