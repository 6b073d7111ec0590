// The engine's one decoding loop: a running batch whose rows join (after
// their encoder pass) and leave (at EOS or their length limit) at pass
// boundaries, each in its own cache slot, with its own draft and its own
// acceptance; no row is padded to another's length.  A row's tokens and
// scores are exactly those it gets decoded alone: each sentence has its own
// caches and length limit, the linear kernels give a row the same bits in any
// block of rows (linear.h), and drafts only decide what a pass verifies, never
// what it emits.
//
// Each pass: the drafter proposes every active row's draft (drafter.h: greedy
// search drafts nothing; source copies, a feature drafter, blockwise heads),
// the verification pass (pass.h) checks them all at once, and the drafter
// learns what was accepted.  With `budget` the verifier's draft-length policy
// (draft_lengths.h) chooses each pass's lengths; else every draft is verified
// as made.
//
// A static batch (fairseq-generate's, the Translator's batches) is a running
// batch whose rows all join at once, each with the batch's length limit
// (decode_static).
//
// One thread drives a running batch (join, run, take, drop); wake() may come
// from any thread: it makes a run() under way return at its next pass
// boundary, so that the driver can let new rows join.  The driver checks its
// queue after every run() and waits on the queue itself when no row is
// active, so a wake that finds no run() under way (or one that returns for
// another reason) is never needed for progress: it only shortens the wait of
// a request that arrives while rows decode to at most one pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loop/counters.h"
#include "loop/drafter.h"
#include "model/decoder.h"

namespace fa {

// What every row of a running batch shares (mirrored by RunSettings in c_api.py)
struct RunSettings {
  const char* drafter;  // its name in drafter.cpp's table
  int32_t first;        // the token each row starts from (EOS, or a BOS)
  int32_t budget;       // 1: lengths by the draft-length policy
  int32_t min_len;
  float unk_penalty, temperature;
  int32_t beta;
  float tau;
  int32_t has_forced, forced;  // 1, token: each row's first output is that token (PassArgs)
  DrafterSettings draft;
  // 1: no output token's score is kept (take gives NaN; a pass then sums no
  // log-normaliser beyond each row's last token's, where the policy reads it)
  int32_t no_scores;
};

class RunningBatch {
 public:
  // dm: the drafter's own decoder (a feature drafter's), or null; throws
  // std::invalid_argument for an unknown drafter or settings it cannot use
  RunningBatch(const RunSettings& s, Decoder* dm);

  // -1 if the drafter cannot draft for verifier m, else 0
  int check(const Decoder& m) const { return drafter_->check(m); }
  // n sentences join, encoded together: their tokens (source ids, src_len[i]
  // each, concatenated), their copy sources (target ids, copy_len[i] each,
  // concatenated), their length limits; each one's slot into slot_out.
  // -1 (nothing joined) if an argument is out of range.
  int join(Decoder& m, int n, const int32_t* tokens, const int32_t* src_len, const int32_t* copy,
           const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out);
  // Every sentence of st (encoded by the caller, none decoded yet) joins, in
  // slots 0..n-1 of an empty batch, with its copy source and the length limit
  // max_len; the drafter's own state of them from `given` (or null: made
  // here).  Their caches move here: st is used up.  -1 (nothing joined) if an
  // argument does not fit.
  int adopt(Decoder& m, State& st, State* given, const int32_t* copy, const int32_t* copy_len, int max_len);
  // Passes over the active rows until one finishes, max_passes passes or a
  // wake(), but (while rows remain) not before min_ms milliseconds: each
  // return costs the driver a trip through Python; the slots that finished
  // into finished (their number returned; at most cap, the rows active at the call)
  int run(Decoder& m, int max_passes, double min_ms, int32_t* finished, int cap);
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
    std::vector<int32_t> copy;  // its copy source (the fault hook reads it)
    int32_t last = 0;
    std::vector<int32_t> out;
    std::vector<float> scores;
  };
  // whether the forced first token (if any) is one of m's vocabulary
  bool forced_fits(const Decoder& m) const;
  // slots for n new rows (free ones first)
  void take_slots(int n, int32_t* slots);
  // row slot starts: its limit and copy source
  void start_row(int slot, int max_len, const int32_t* copy, int copy_len);
  void free_slot(int slot);
  RunSettings s_;
  std::string drafter_name_;
  std::unique_ptr<Drafter> drafter_;
  State st_;               // the verifier's slots
  std::vector<Row> rows_;  // by slot, as st_.sents
  std::vector<int32_t> active_, free_;
  std::atomic<bool> wake_{false};
  RunStats stats_{};
  // one pass's arrays
  PassRows pass_rows_;
  Drafts drafts_;
  std::vector<int32_t> row_len_, offset_, tokens_, row_max_, choice_, n_emit_, n_match_, done_, lens_;
  std::vector<float> score_, feats_;
};

// A static batch's output: sentence b's out_len[b] tokens and scores at b *
// out_cap (out_cap >= max_len + 1, the most any sentence emits) and the
// passes it took part in (mirrored by StaticOutput in c_api.py)
struct StaticOutput {
  int32_t out_cap;
  int32_t* out_tokens;
  float* out_scores;
  int32_t* out_len;
  int32_t* passes;
};

// A batch encoded by the caller (st; given: the drafter's own state of it, or
// null) decoded whole as a running batch whose rows all join at once, each
// with the length limit max_len (the batch's: fairseq's rule); the counters
// into stats.  0, or -1 (nothing decoded) if an argument does not fit (a
// sentence already decoded, out_cap, a drafter that cannot draft for m); a
// failed pass throws.
int decode_static(Decoder& m, State& st, Decoder* dm, State* given, const RunSettings& s, const int32_t* copy,
                  const int32_t* copy_len, int max_len, const StaticOutput& out, RunStats& stats);

}  // namespace fa
