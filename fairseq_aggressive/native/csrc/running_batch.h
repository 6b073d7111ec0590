// Continuous batching: a running batch whose rows join (after their encoder
// pass) and leave (at EOS or their length limit) at pass boundaries, each in
// its own cache slot, with its own draft and its own acceptance; no row is
// padded to another's length.  A row's tokens and scores are exactly those it
// gets decoded alone: each sentence has its own caches and length limit, the
// linear kernels give a row the same bits in any block of rows (linear.h), and
// drafts only decide what a pass verifies, never what it emits.
//
// Drafts: greedy search (max_draft 0), source-copy drafting (copy_source.h)
// or a --feature-ar drafter's (a second decoder with its own slots of the same
// sentences, as feature_loop.h drafts), each pass's lengths chosen by the
// verifier's draft-length policy (draft_lengths.h; for the feature drafter
// also how many tokens it drafts, against its own measured cost) or verified
// as made.
//
// One thread drives a running batch (join, run, take); wake() may come from
// any thread: it makes a run() under way return at its next pass boundary, so
// that the driver can let new rows join.  The driver checks its queue after
// every run() and waits on the queue itself when no row is active, so a wake
// that finds no run() under way (or one that returns for another reason) is
// never needed for progress: it only shortens the wait of a request that
// arrives while rows decode to at most one pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "copy_source.h"
#include "decode_loop.h"
#include "draft_lengths.h"
#include "decoder.h"

namespace fa {

// What every row of a running batch shares (mirrored by RunSettings in c_api.py)
struct RunSettings {
  int32_t first;  // the token each row starts from (EOS, or a BOS)
  int32_t max_draft, ngram_min, ngram_max;  // drafts' cap (0: greedy search, -1: none); re-anchoring
  int32_t budget;                            // 1: lengths by the draft-length policy
  int32_t min_len;
  float unk_penalty, temperature;
  int32_t beta;
  float tau;
  // the drafter: 0 source copies; 1 a --feature-ar drafter (a second decoder)
  // drafting up to k tokens per pass while bos, the output and the draft fit
  // its room positions, each draft ending after its first token below
  // min_prob (0: off); shared_encoder: its sentences start from the
  // verifier's encoder output (else its own encoder's)
  int32_t drafter, bos, k, room;
  float min_prob;
  int32_t shared_encoder;
};

// Counters of a running batch since it was made (mirrored by RunStats in c_api.py)
constexpr int kRunRowsHist = 65;  // passes by their rows; the last slot counts 64 rows or more
struct RunStats {
  LoopStats loop;
  int64_t emitted;      // tokens emitted
  int64_t joined, left;  // rows
  int64_t dropped;       // rows that left before they finished (drop)
  int64_t pass_rows[kRunRowsHist];
};

class RunningBatch {
 public:
  explicit RunningBatch(const RunSettings& s) : s_(s) {}

  // n sentences join, encoded together: their tokens (source ids, src_len[i]
  // each, concatenated), their copy sources (target ids, copy_len[i] each,
  // concatenated), their length limits; each one's slot into slot_out.
  // -1 (nothing joined) if an argument is out of range.
  // dm: the feature drafter's decoder (null for source copies).
  int join(Decoder& m, Decoder* dm, int n, const int32_t* tokens, const int32_t* src_len, const int32_t* copy,
           const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out);
  // Passes over the active rows until one finishes, max_passes passes or a
  // wake(), but (while rows remain) not before min_ms milliseconds: each
  // return costs the driver a trip through Python; the slots that finished
  // into finished (their number returned; at most cap, the rows active at the call)
  int run(Decoder& m, Decoder* dm, int max_passes, double min_ms, int32_t* finished, int cap);
  // A finished slot's tokens and scores (at most cap) and its passes; the slot
  // is free again.  Its length, or -1 if the slot has not finished.
  int take(int slot, int32_t* tokens, float* scores, int cap, int32_t* passes);
  // An active row leaves before it finishes (its client went away): its slot
  // is free again at once.  0, or -1 if the slot is not active.  The driver
  // calls it between run()s, so a row is never dropped inside a pass.
  int drop(int slot);
  void wake() { wake_.store(true, std::memory_order_release); }
  int active() const { return (int)active_.size(); }
  const RunStats& stats() const { return stats_; }

 private:
  enum SlotState { kFree, kActive, kFinished };
  struct Row {
    SlotState state = kFree;
    int max_len = 0, passes = 0;
    std::vector<int32_t> src;  // the copy source (CopySource points into it)
    CopySource copy;
    int32_t last = 0;
    std::vector<int32_t> out;
    std::vector<float> scores;
    // (feature drafter) the tokens it has not read yet and the verifier's features that chose them
    std::vector<int32_t> fresh;
    std::vector<float> fresh_feats;
  };
  bool feature() const { return s_.drafter == 1; }
  // the score of a row's last token (NaN before its first)
  static float last_score(const Row& r) {
    return r.scores.empty() ? std::numeric_limits<float>::quiet_NaN() : r.scores.back();
  }
  // this pass's drafts: cand_ (caps), then lens_ and the drafted tokens' start in draft_
  void copy_drafts(DraftPolicy* policy);
  void feature_drafts(Decoder& dm, DraftPolicy* policy);
  RunSettings s_;
  State st_, dst_;  // the verifier's slots and (feature drafter) the drafter's
  std::vector<Row> rows_;  // by slot, as st_.sents
  std::vector<int32_t> active_, free_;
  std::atomic<bool> wake_{false};
  RunStats stats_{};
  // one pass's arrays
  std::vector<int32_t> start_, row_len_, tokens_, row_max_, choice_, n_emit_, n_match_, done_;
  std::vector<int32_t> proposed_, drafted_, new_len_, new_tokens_;
  std::vector<float> score_, feats_, new_feats_;
  int steps_ = 0;  // (feature drafter) tokens drafted per row this pass
  std::vector<DraftCandidate> cand_;
  std::vector<int> lens_;
};

}  // namespace fa
