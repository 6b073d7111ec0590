// An autoregressive feature drafter's drafts (--decoding feature-ar: a
// block_nat --feature-ar decoder that reads the verifier's features): a
// second decoder with its own cache slots of the same rows.  Each pass it
// reads the tokens emitted since its last pass with the verifier's features
// that chose them, then drafts K tokens for every row at once (block_drafter.h,
// autoregressive), each row keeping up to its cap; the drafts are
// drafters/feature_ar.py's on the native engine.  With a draft-length policy
// K is the policy's choice against the drafter's own measured cost.
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

class FeatureDrafter : public Drafter {
 public:
  FeatureDrafter(const DrafterSettings& s, Decoder* dm) : s_(s), dm_(dm) {
    if (dm == nullptr) throw std::invalid_argument("feature drafter: no drafter decoder");
    if (s.k < 1 || s.room < 1) throw std::invalid_argument("feature drafter: k and room must be positive");
  }

  bool reads_features() const override { return true; }

  int check(const Decoder& m) const override {
    const Decoder& d = *dm_;
    return d.w.feat_proj.N == 0 || d.w.feat_proj.K != m.cfg.C || d.cfg.tgt_vocab != m.cfg.tgt_vocab ? -1 : 0;
  }

  void join(Decoder& m, const Joining& j) override {
    join_own_decoder(*dm_, st_, j, s_.k, s_.shared_encoder);
    if (rows_.size() < st_.sents.size()) rows_.resize(st_.sents.size());
    for (int i = 0; i < j.n; ++i) {
      rows_[j.slot[i]].fresh.assign(1, s_.bos);
      rows_[j.slot[i]].fresh_feats.assign(m.cfg.C, 0.f);
    }
  }

  void leave(int slot) override {
    st_.sents[slot] = Sentence();  // its caches go
    rows_[slot].fresh.clear();
    rows_[slot].fresh_feats.clear();
  }

  void propose(Decoder&, const PassRows& rows, DraftPolicy* policy, Drafts& out) override {
    const int n = rows.n;
    out.cand.resize(n);
    for (int i = 0; i < n; ++i) {
      const int have = (int)rows.out[i]->size();
      const int c = std::min({rows.room[i], (int)s_.k, (int)s_.room - have});
      out.cand[i] = {std::max(c, 0), false, rows.conf[i]};
    }
    int K = 0;
    if (policy != nullptr) {
      K = policy->steps(out.cand);
      if (!policy->realized.drafts(n, K > 0)) K = 0;
    } else {
      for (const auto& c : out.cand) K = std::max(K, c.cap);
    }
    drafted_.assign(n, 0);
    if (K > 0) {
      new_len_.assign(n, 0);
      new_tokens_.clear();
      new_feats_.clear();
      for (int i = 0; i < n; ++i) {
        Row& r = rows_[rows.slot[i]];
        new_len_[i] = (int)r.fresh.size();
        new_tokens_.insert(new_tokens_.end(), r.fresh.begin(), r.fresh.end());
        new_feats_.insert(new_feats_.end(), r.fresh_feats.begin(), r.fresh_feats.end());
        r.fresh.clear();
        r.fresh_feats.clear();
      }
      proposed_.resize((size_t)n * K);
      const DraftArgs d = feature_draft_args(n, rows.slot, new_len_.data(), new_tokens_.data(), new_feats_.data(), K,
                                             s_.min_prob, proposed_.data(), drafted_.data());
      const auto t0 = Clock::now();
      // (rows fit: the drafter's caches hold max_len + k + 2 positions)
      if (draft_pass(*dm_, st_, d) != 0) throw std::logic_error("a draft does not fit the drafter's cache");
      if (policy != nullptr)
        policy->drafter.observe(n, K, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    for (int i = 0; i < n; ++i) out.cand[i].cap = K > 0 ? std::min({out.cand[i].cap, K, (int)drafted_[i]}) : 0;
    draft_lengths(policy, out.cand, out.len);  // the verification pass keeps the positions that pay
    out.tokens.resize(n);
    for (int i = 0; i < n; ++i) out.tokens[i] = out.len[i] > 0 ? proposed_.data() + (size_t)i * K : nullptr;
    out.drafted = K > 0;
  }

  // the drafter reads the emitted tokens with the features that chose them next time
  void learn(Decoder&, State&, const Verified& v, RunStats&) override {
    for (int i = 0; i < v.n; ++i) {
      if (v.done[i]) continue;
      Row& r = rows_[v.slot[i]];
      const int o = v.offset[i], e = v.n_emit[i];
      r.fresh.insert(r.fresh.end(), v.choice + o, v.choice + o + e);
      r.fresh_feats.insert(r.fresh_feats.end(), v.feats + (size_t)o * v.feat_width,
                           v.feats + (size_t)(o + e) * v.feat_width);
    }
  }

 private:
  struct Row {  // the tokens the drafter has not read yet and the verifier's features that chose them
    std::vector<int32_t> fresh;
    std::vector<float> fresh_feats;
  };
  DrafterSettings s_;
  Decoder* dm_;
  State st_;               // the drafter's slots, as the verifier's
  std::vector<Row> rows_;  // by slot
  std::vector<int32_t> proposed_, drafted_, new_len_, new_tokens_;
  std::vector<float> new_feats_;
};

}  // namespace

std::unique_ptr<Drafter> make_feature_drafter(const DrafterSettings& s, Decoder* own) {
  return std::make_unique<FeatureDrafter>(s, own);
}

}  // namespace fa
