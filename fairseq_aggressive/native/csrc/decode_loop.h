// What the engine's decoding loops share (copy_loop.h: source-copy drafts and
// greedy search; feature_loop.h: an autoregressive feature drafter): their
// counters, the settings of their passes and the sentences' outputs while
// they run.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "decoder.h"
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

// The score rules and acceptance of a loop's passes (PassArgs'), and where a
// loop writes: sentence b's out_len[b] tokens and scores at b * out_cap
// (out_cap >= max_len + 1, the most any sentence emits) and the passes it took
// part in (mirrored by LoopRules and LoopOutput in c_api.py).
struct LoopRules {
  int32_t max_len, min_len;
  float unk_penalty, temperature;
  int32_t beta;
  float tau;
};
struct LoopOutput {
  int32_t out_cap;
  int32_t* out_tokens;
  float* out_scores;
  int32_t* out_len;
  int32_t* passes;
};

// The tokens and scores each sentence of a batch has emitted so far
class LoopOutputs {
 public:
  explicit LoopOutputs(int B) : tokens_(B), scores_(B) {}
  void emit(int b, const int32_t* choice, const float* score, int n) {
    tokens_[b].insert(tokens_[b].end(), choice, choice + n);
    scores_[b].insert(scores_[b].end(), score, score + n);
  }
  const std::vector<int32_t>& tokens(int b) const { return tokens_[b]; }
  // the score of sentence b's last token (NaN before its first)
  float last_score(int b) const { return scores_[b].empty() ? std::numeric_limits<float>::quiet_NaN() : scores_[b].back(); }
  int length(int b) const { return (int)tokens_[b].size(); }
  // into o's arrays; throws if a sentence has more than o.out_cap tokens
  void write(const LoopOutput& o) const;

 private:
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<std::vector<float>> scores_;
};

// A batch while a loop decodes it: the sentences still decoding (in batch
// order), each one's last token and output, and one pass at a time: rows
// added (add_row: the last token, then a draft), verified (verify), then
// settled (settle: counted, emitted, finished sentences dropped).
class LoopBatch {
 public:
  LoopBatch(int B, int32_t first, const LoopRules& rules, const LoopOutput& output);
  const std::vector<int32_t>& active() const { return active_; }
  int32_t last(int b) const { return last_[b]; }
  const LoopOutputs& outputs() const { return out_; }

  // row i (the i-th added since the last pass) of sentence active()[i]: its last token, then draft[0..L)
  void add_row(int b, const int32_t* draft, int L);
  // verify_pass over the rows added (with feats: also the features, m.cfg.C
  // floats, that chose each emitted token); throws if a row does not fit
  void verify(Decoder& m, State& st, LoopStats& stats, bool feats = false);
  // After verify: per row, the pass counted and its tokens emitted; the
  // sentences that go on stay active, and kept(i, b, o, n_emit) is called
  // for each (i: its row, b: the sentence, o: the row's offset among the
  // pass's positions, n_emit: the tokens it emitted)
  template <class F>
  void settle(LoopStats& stats, F&& kept);
  // (in settle's callback) row i's drafted tokens and those accepted
  int drafted(int i) const { return row_len_[i] - 1; }
  int accepted(int i) const { return n_match_[i]; }
  // the pass's choices and features (C floats each) from position o on
  const int32_t* choice(int o) const { return choice_.data() + o; }
  const float* feats(int o) const { return feats_.data() + (size_t)o * feat_width_; }
  // writes the outputs (after the last pass)
  void finish() const { out_.write(output_); }

 private:
  LoopOutputs out_;
  std::vector<int32_t> last_, active_;
  const LoopOutput output_;
  PassArgs p_;
  int feat_width_ = 0;
  std::vector<int32_t> row_len_, tokens_, choice_, n_emit_, n_match_, done_;
  std::vector<float> score_, feats_;
};

template <class F>
void LoopBatch::settle(LoopStats& stats, F&& kept) {
  int n_kept = 0, o = 0;
  const int n = (int)active_.size();
  for (int i = 0; i < n; o += row_len_[i++]) {
    const int b = active_[i];
    output_.passes[b] += 1;
    stats.count(row_len_[i] - 1, n_match_[i]);
    out_.emit(b, choice_.data() + o, score_.data() + o, n_emit_[i]);
    if (done_[i]) continue;
    active_[n_kept++] = b;
    last_[b] = out_.tokens(b).back();
    kept(i, b, o, n_emit_[i]);
  }
  active_.resize(n_kept);
  row_len_.clear();
  tokens_.clear();
}

}  // namespace fa
