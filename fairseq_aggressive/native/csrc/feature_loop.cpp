// The loop of an autoregressive feature drafter in the engine (see feature_loop.h).
#include "feature_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "block_drafter.h"
#include "pass.h"

namespace fa {

int decode_feature(Model& vm, State& vs, Model& dm, State& ds, const FeatureLoopArgs& a, LoopStats& stats) {
  const int B = a.n, FC = vm.cfg.C;  // FC: the verifier's feature width
  if (B != (int)vs.sents.size() || B != (int)ds.sents.size() || a.k < 1 || a.out_cap < a.max_len + 1 ||
      dm.w.feat_proj.N == 0 || dm.w.feat_proj.K != FC || dm.cfg.tgt_vocab != vm.cfg.tgt_vocab)
    return -1;
  for (int b = 0; b < B; ++b)
    if (vs.sents[b].len != 0 || ds.sents[b].len != 0) return -1;
  LoopOutputs out(B);
  std::vector<int32_t> last(B, a.first);
  std::vector<int32_t> active(B);
  for (int b = 0; b < B; ++b) active[b] = b, a.passes[b] = 0;
  // per sentence, the tokens the drafter has not read yet and the verifier's features that chose them
  std::vector<std::vector<int32_t>> fresh(B, std::vector<int32_t>{a.bos});
  std::vector<std::vector<float>> fresh_feats(B, std::vector<float>(FC, 0.f));

  // one pass's drafting and verification
  std::vector<int32_t> cap, row_len, new_len, new_tokens, proposed, tokens, n_emit, n_match, done, choice;
  std::vector<float> new_feats, score, feats;
  PassArgs p = pass_settings(a);

  using Clock = std::chrono::steady_clock;
  while (!active.empty()) {
    const int n = (int)active.size();
    const auto t0 = Clock::now();
    // how many tokens each sentence may draft; the drafter drafts the most of them for every one
    cap.assign(n, 0);
    int K = 0;
    for (int i = 0; i < n; ++i) {
      const int have = out.length(active[i]);
      int c = std::min({a.k, a.max_len - have, a.room - have});
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
      DraftArgs d{};
      d.n = n;
      d.sent = active.data();
      d.row_len = new_len.data();
      d.tokens = new_tokens.data();
      d.k = K;
      d.causal = 1;
      d.autoregressive = 1;
      d.out = proposed.data();
      d.feats = new_feats.data();
      // (rows fit: the drafter's caches hold max_len + k + 2 positions)
      if (draft_pass(dm, ds, d) != 0) throw std::logic_error("a draft does not fit the drafter's cache");
    }
    // the rows: the last token, then the draft up to its cap and an EOS
    row_len.assign(n, 1);
    tokens.clear();
    for (int i = 0; i < n; ++i) {
      tokens.push_back(last[active[i]]);
      for (int j = 0; j < cap[i]; ++j) {
        const int32_t t = proposed[(size_t)i * K + j];
        tokens.push_back(t);
        row_len[i] += 1;
        if (t == vm.cfg.eos) break;  // nothing follows the end of the sentence
      }
    }
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();

    const size_t total = tokens.size();
    choice.resize(total);
    score.resize(total);
    feats.resize(total * FC);
    n_emit.resize(n);
    n_match.resize(n);
    done.resize(n);
    p.n = n;
    p.sent = active.data();
    p.row_len = row_len.data();
    p.tokens = tokens.data();
    p.choice = choice.data();
    p.score = score.data();
    p.n_emit = n_emit.data();
    p.n_match = n_match.data();
    p.done = done.data();
    p.feats = feats.data();
    if (verify_pass(vm, vs, p) != 0) throw std::logic_error("a draft does not fit its sentence's cache");
    stats.passes += 1;
    stats.sentence_passes += n;

    const auto t1 = Clock::now();
    int kept = 0, o = 0;
    for (int i = 0; i < n; o += row_len[i++]) {
      const int b = active[i];
      a.passes[b] += 1;
      stats.count(row_len[i] - 1, n_match[i]);
      out.emit(b, choice.data() + o, score.data() + o, n_emit[i]);
      if (done[i]) continue;
      active[kept++] = b;
      last[b] = out.tokens(b).back();
      // the drafter reads the emitted tokens with the features that chose them next time
      fresh[b].insert(fresh[b].end(), choice.begin() + o, choice.begin() + o + n_emit[i]);
      fresh_feats[b].insert(fresh_feats[b].end(), feats.begin() + (size_t)o * FC,
                            feats.begin() + (size_t)(o + n_emit[i]) * FC);
    }
    active.resize(kept);
    stats.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t1).count();
  }
  out.write(a.out_cap, a.out_tokens, a.out_scores, a.out_len);
  return 0;
}

}  // namespace fa
