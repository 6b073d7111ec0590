// The loop of an autoregressive feature drafter in the engine (see feature_loop.h).
#include "feature_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "block_drafter.h"
#include "pass.h"

namespace fa {

int decode_feature(Decoder& vm, State& vs, Decoder& dm, State& ds, const FeatureLoopArgs& a, LoopStats& stats) {
  const int B = a.n, FC = vm.cfg.C, max_len = a.rules.max_len;  // FC: the verifier's feature width
  if (B != (int)vs.sents.size() || B != (int)ds.sents.size() || a.k < 1 || a.output.out_cap < max_len + 1 ||
      dm.w.feat_proj.N == 0 || dm.w.feat_proj.K != FC || dm.cfg.tgt_vocab != vm.cfg.tgt_vocab)
    return -1;
  for (int b = 0; b < B; ++b)
    if (vs.sents[b].len != 0 || ds.sents[b].len != 0) return -1;
  LoopBatch batch(B, a.first, a.rules, a.output);
  // per sentence, the tokens the drafter has not read yet and the verifier's features that chose them
  std::vector<std::vector<int32_t>> fresh(B, std::vector<int32_t>{a.bos});
  std::vector<std::vector<float>> fresh_feats(B, std::vector<float>(FC, 0.f));
  std::vector<int32_t> cap, new_len, new_tokens, proposed, drafted;
  std::vector<float> new_feats;

  using Clock = std::chrono::steady_clock;
  while (!batch.active().empty()) {
    const std::vector<int32_t>& active = batch.active();
    const int n = (int)active.size();
    const auto t0 = Clock::now();
    // how many tokens each sentence may draft; the drafter drafts the most of them for every one
    cap.assign(n, 0);
    int K = 0;
    for (int i = 0; i < n; ++i) {
      const int have = batch.outputs().length(active[i]);
      int c = std::min({a.k, max_len - have, a.room - have});
      if (a.max_draft >= 0) c = std::min(c, a.max_draft);
      cap[i] = std::max(c, 0);
      K = std::max(K, c);
    }
    if (K > 0) {
      new_len.assign(n, 0);
      new_tokens.clear();
      new_feats.clear();
      for (int i = 0; i < n; ++i) {
        const int b = active[i];
        new_len[i] = (int)fresh[b].size();
        new_tokens.insert(new_tokens.end(), fresh[b].begin(), fresh[b].end());
        new_feats.insert(new_feats.end(), fresh_feats[b].begin(), fresh_feats[b].end());
        fresh[b].clear();
        fresh_feats[b].clear();
      }
      proposed.resize((size_t)n * K);
      drafted.assign(n, 0);
      const DraftArgs d = feature_draft_args(n, active.data(), new_len.data(), new_tokens.data(), new_feats.data(), K,
                                             a.min_prob, proposed.data(), drafted.data());
      // (rows fit: the drafter's caches hold max_len + k + 2 positions)
      if (draft_pass(dm, ds, d) != 0) throw std::logic_error("a draft does not fit the drafter's cache");
    }
    // the rows: the last token, then the draft up to its cap (it ends at an EOS or a token below
    // min_prob)
    for (int i = 0; i < n; ++i) {
      const int32_t* draft = proposed.data() + (size_t)i * K;
      batch.add_row(active[i], draft, K > 0 ? std::min(cap[i], (int)drafted[i]) : 0);
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    batch.verify(vm, vs, stats, true);
    const auto t1 = Clock::now();
    // the drafter reads the emitted tokens with the features that chose them next time
    batch.settle(stats, [&](int, int b, int o, int n_emit) {
      fresh[b].insert(fresh[b].end(), batch.choice(o), batch.choice(o) + n_emit);
      fresh_feats[b].insert(fresh_feats[b].end(), batch.feats(o), batch.feats(o + n_emit));
    });
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t1).count();
  }
  batch.finish();
  return 0;
}

}  // namespace fa
