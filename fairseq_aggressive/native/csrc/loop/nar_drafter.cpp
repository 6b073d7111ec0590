// GAD's block drafter (--decoding gad: a block_nat decoder): each pass drafts
// the next K tokens of every row at once from K slots after the row's
// [bos, output] (block_drafter.h, not autoregressive).  A causal-prefix
// drafter (settings.causal) keeps its prefix keys and values cached and reads
// only the tokens emitted since its last pass; a bidirectional one reads the
// whole row each pass.  A --verifier-features drafter reads, at each prefix
// position, the verifier's features that chose the token there (zeros for
// bos).  K is the longest draft a row may take this pass (its cap, the
// drafter's k, its positions), so the slots and the drafts are
// drafters/nar_block.py's on the native engine; a draft ends at its first EOS.
// With a draft-length policy the policy's check may skip the drafter's pass,
// and the policy chooses how much of each draft the pass verifies.
#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

#include "loop/block_drafter.h"
#include "loop/drafter.h"

namespace fa {

namespace {

using Clock = std::chrono::steady_clock;

class NarDrafter : public Drafter {
 public:
  NarDrafter(const DrafterSettings& s, Decoder* dm) : s_(s), dm_(dm) {
    if (dm == nullptr) throw std::invalid_argument("block drafter: no drafter decoder");
    if (s.k < 1 || s.room < 1) throw std::invalid_argument("block drafter: k and room must be positive");
  }

  bool reads_features() const override { return dm_->w.feat_proj.N != 0; }

  int check(const Decoder& m) const override {
    const Decoder& d = *dm_;
    if (d.w.mask_embed.empty() || d.cfg.tgt_vocab != m.cfg.tgt_vocab) return -1;
    return reads_features() && d.w.feat_proj.K != m.cfg.C ? -1 : 0;
  }

  void join(Decoder& m, const Joining& j) override {
    join_own_decoder(*dm_, st_, j, s_.k, s_.shared_encoder);
    if (rows_.size() < st_.sents.size()) rows_.resize(st_.sents.size());
    feat_width_ = reads_features() ? m.cfg.C : 0;
    for (int i = 0; i < j.n; ++i) {
      Row& r = rows_[j.slot[i]];
      r.tokens.assign(1, s_.bos);
      r.feats.assign(feat_width_, 0.f);
      r.cached = 0;
    }
  }

  void leave(int slot) override {
    st_.sents[slot] = Sentence();  // its caches go
    rows_[slot] = Row();
  }

  void propose(Decoder&, const PassRows& rows, DraftPolicy* policy, Drafts& out) override {
    const int n = rows.n;
    out.cand.resize(n);
    int K = 0;
    for (int i = 0; i < n; ++i) {
      const int have = (int)rows.out[i]->size();
      const int c = std::max(std::min({rows.room[i], (int)s_.k, (int)s_.room - have}), 0);
      out.cand[i] = {c, false, rows.conf[i]};
      K = std::max(K, c);
    }
    if (policy != nullptr && !policy->realized.drafts(n, K > 0)) K = 0;
    if (K > 0) draft(rows, out.cand, K, policy);
    out.tokens.resize(n);
    for (int i = 0; i < n; ++i) {
      DraftCandidate& c = out.cand[i];
      if (K == 0 || c.cap == 0) {
        c.cap = 0;
        out.tokens[i] = nullptr;
        continue;
      }
      const int32_t* p = proposed_.data() + (size_t)at_[i] * K;
      const int ends = (int)(std::find(p, p + c.cap, dm_->cfg.eos) - p);  // nothing follows an EOS
      c.cap = std::min(c.cap, ends + 1);
      out.tokens[i] = p;
    }
    draft_lengths(policy, out.cand, out.len);  // the verification pass keeps the positions that pay
    for (int i = 0; i < n; ++i)
      if (out.len[i] == 0) out.tokens[i] = nullptr;
    out.drafted = K > 0;
  }

  // the drafter reads the emitted tokens (with the features that chose them) next time
  void learn(Decoder&, State&, const Verified& v, RunStats&) override {
    for (int i = 0; i < v.n; ++i) {
      if (v.done[i]) continue;
      Row& r = rows_[v.slot[i]];
      const int o = v.offset[i], e = v.n_emit[i];
      r.tokens.insert(r.tokens.end(), v.choice + o, v.choice + o + e);
      if (feat_width_ > 0)
        r.feats.insert(r.feats.end(), v.feats + (size_t)o * v.feat_width, v.feats + (size_t)(o + e) * v.feat_width);
    }
  }

 private:
  struct Row {
    std::vector<int32_t> tokens;  // bos and the output so far
    std::vector<float> feats;     // (verifier features) what chose each of them
    int cached = 0;               // (causal) the tokens in the drafter's cache
  };

  // One drafter pass of K slots over the rows that may draft (a row with no
  // room takes no slots: it would pass the drafter's positions); at_[i]: row
  // i's place among the rows drafted
  void draft(const PassRows& rows, const std::vector<DraftCandidate>& cand, int K, DraftPolicy* policy) {
    const int n = rows.n;
    at_.assign(n, 0);
    sent_.clear();
    len_.clear();
    tokens_.clear();
    feats_.clear();
    const bool causal = s_.causal != 0;
    for (int i = 0; i < n; ++i) {
      if (cand[i].cap == 0) continue;
      Row& r = rows_[rows.slot[i]];
      const int from = causal ? r.cached : 0;
      at_[i] = (int)sent_.size();
      sent_.push_back(rows.slot[i]);
      len_.push_back((int)r.tokens.size() - from);
      tokens_.insert(tokens_.end(), r.tokens.begin() + from, r.tokens.end());
      if (feat_width_ > 0) feats_.insert(feats_.end(), r.feats.begin() + (size_t)from * feat_width_, r.feats.end());
      if (causal) r.cached = (int)r.tokens.size();
    }
    const int m = (int)sent_.size();
    proposed_.resize((size_t)m * K);
    DraftArgs d{};
    d.n = m;
    d.sent = sent_.data();
    d.row_len = len_.data();
    d.tokens = tokens_.data();
    d.k = K;
    d.causal = causal;
    d.out = proposed_.data();
    d.feats = feat_width_ > 0 ? feats_.data() : nullptr;
    const auto t0 = Clock::now();
    // (rows fit: the drafter's caches hold max_len + k + 2 positions)
    if (draft_pass(*dm_, st_, d) != 0) throw std::logic_error("a draft does not fit the drafter's cache");
    if (policy != nullptr)
      policy->drafter.observe(m, 1, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }

  DrafterSettings s_;
  Decoder* dm_;
  State st_;               // the drafter's slots, as the verifier's
  std::vector<Row> rows_;  // by slot
  int feat_width_ = 0;
  std::vector<int32_t> proposed_, sent_, len_, tokens_;
  std::vector<int> at_;
  std::vector<float> feats_;
};

}  // namespace

std::unique_ptr<Drafter> make_nar_drafter(const DrafterSettings& s, Decoder* own) {
  return std::make_unique<NarDrafter>(s, own);
}

}  // namespace fa
