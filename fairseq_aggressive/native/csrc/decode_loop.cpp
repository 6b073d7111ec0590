// What the engine's decoding loops share (see decode_loop.h).
#include "decode_loop.h"

#include <algorithm>
#include <stdexcept>

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

void LoopOutputs::write(const LoopOutput& o) const {
  for (size_t b = 0; b < tokens_.size(); ++b) {
    if ((int)tokens_[b].size() > o.out_cap) throw std::logic_error("more tokens than out_cap");  // at most max_len + 1
    o.out_len[b] = (int)tokens_[b].size();
    std::copy(tokens_[b].begin(), tokens_[b].end(), o.out_tokens + b * o.out_cap);
    std::copy(scores_[b].begin(), scores_[b].end(), o.out_scores + b * o.out_cap);
  }
}

LoopBatch::LoopBatch(int B, int32_t first, const LoopRules& rules, const LoopOutput& output)
    : out_(B), last_(B, first), active_(B), output_(output), p_{} {
  for (int b = 0; b < B; ++b) active_[b] = b, output_.passes[b] = 0;
  p_.max_len = rules.max_len;
  p_.min_len = rules.min_len;
  p_.unk_penalty = rules.unk_penalty;
  p_.temperature = rules.temperature;
  p_.beta = rules.beta;
  p_.tau = rules.tau;
}

void LoopBatch::add_row(int b, const int32_t* draft, int L) {
  tokens_.push_back(last_[b]);
  tokens_.insert(tokens_.end(), draft, draft + L);
  row_len_.push_back(1 + L);
}

void LoopBatch::verify(Decoder& m, State& st, LoopStats& stats, bool feats) {
  const int n = (int)active_.size();
  if ((int)row_len_.size() != n) throw std::logic_error("a loop's pass has a row per active sentence");
  const size_t total = tokens_.size();
  feat_width_ = feats ? m.cfg.C : 0;
  choice_.resize(total);
  score_.resize(total);
  feats_.resize(total * feat_width_);
  n_emit_.resize(n);
  n_match_.resize(n);
  done_.resize(n);
  p_.n = n;
  p_.sent = active_.data();
  p_.row_len = row_len_.data();
  p_.tokens = tokens_.data();
  p_.choice = choice_.data();
  p_.score = score_.data();
  p_.n_emit = n_emit_.data();
  p_.n_match = n_match_.data();
  p_.done = done_.data();
  p_.feats = feats ? feats_.data() : nullptr;
  // (rows fit: a draft never reaches beyond max_len, the caches hold max_len + 1 positions)
  if (verify_pass(m, st, p_) != 0) throw std::logic_error("a draft does not fit its sentence's cache");
  stats.passes += 1;
  stats.sentence_passes += n;
}

}  // namespace fa
