// What the engine's decoding loops share (copy_loop.h: source-copy drafts and
// greedy search; feature_loop.h: an autoregressive feature drafter): their
// counters, the settings of their passes and the sentences' outputs while
// they run.
#pragma once

#include <cstdint>
#include <vector>

#include "pass.h"

namespace fa {

// Counters of one loop, added to (mirrored by LoopStats in c_api.py).  Per
// draft position i < kLoopPositions (the last slot counts every later one):
// the passes whose draft had a position i and those whose drafted token i was
// accepted.
constexpr int kLoopPositions = 32;
struct LoopStats {
  int64_t passes;           // decoder invocations
  int64_t sentence_passes;  // sum over sentences of the passes they took part in
  int64_t drafted, accepted;
  int64_t draft_ns;         // time spent making drafts
  int64_t position_drafted[kLoopPositions], position_accepted[kLoopPositions];

  // one sentence's pass: `drafted` tokens verified, the first `accepted` of them accepted
  void count(int drafted, int accepted);
};

// The score rules and acceptance of a loop's passes, from its arguments
// (CopyLoopArgs, FeatureLoopArgs: max_len, min_len, unk_penalty, temperature,
// beta, tau)
template <class Args>
PassArgs pass_settings(const Args& a) {
  PassArgs p{};
  p.max_len = a.max_len;
  p.min_len = a.min_len;
  p.unk_penalty = a.unk_penalty;
  p.temperature = a.temperature;
  p.beta = a.beta;
  p.tau = a.tau;
  return p;
}

// The tokens and scores each sentence of a batch has emitted so far
class LoopOutputs {
 public:
  explicit LoopOutputs(int B) : tokens_(B), scores_(B) {}
  void emit(int b, const int32_t* choice, const float* score, int n) {
    tokens_[b].insert(tokens_[b].end(), choice, choice + n);
    scores_[b].insert(scores_[b].end(), score, score + n);
  }
  const std::vector<int32_t>& tokens(int b) const { return tokens_[b]; }
  int length(int b) const { return (int)tokens_[b].size(); }
  // sentence b's tokens and scores at b * out_cap, their number in out_len[b];
  // throws if one has more than out_cap
  void write(int out_cap, int32_t* out_tokens, float* out_scores, int32_t* out_len) const;

 private:
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<std::vector<float>> scores_;
};

}  // namespace fa
