// How many drafted positions each row of a pass verifies: the engine's
// draft-length policy (as vLLM's speculative decoding hands its loop a
// proposal-length policy), decided inside the engine's loops, per pass.
//
// A pass over M positions (every row's last token and its drafted tokens)
// costs ms(M) (PassCost: measured once per decoder over M = 1..128 positions,
// then learnt from the passes the loops time).  Each drafted token j of a row
// adds the probability that tokens 0..j are all accepted (Acceptance: the
// first token's rate by the kind of draft and the verifier's confidence in
// the row's last token, each later one's by its depth, learnt from the
// passes).  A pass keeps the positions of highest expected gain, as many as
// maximise its expected tokens per millisecond: with one row on a pass whose
// cost barely grows with M it drafts long; with a full batch, where every
// position costs its share of the arithmetic, drafts shrink toward greedy's
// single token.  Only lengths change: the verifier decides what is accepted,
// so the output stays greedy's.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace fa {

struct Decoder;

// the class of a pass's rows: floor(log2(rows)), at most classes - 1
inline int rows_class(int rows, int classes) {
  int c = 0;
  while ((1 << (c + 1)) <= rows && c < classes - 1) ++c;
  return c;
}

#if defined(FA_TEST_HOOKS)
extern bool realized_check;  // draft_check.cpp (fa_set_realized_check): the check on whole passes on or off
#endif

// The most tokens a row may draft: what is left before its length limit, at
// most max_draft (-1: no cap, the engine's one spelling of it)
inline int draft_room(int left, int max_draft) { return max_draft < 0 ? left : std::min(left, max_draft); }

// Milliseconds of a pass over M positions: piecewise linear through knots
class PassCost {
 public:
  static const std::vector<int>& knots();
  bool ready() const { return !ms_.empty(); }
  void set(std::vector<double> ms_at_knots);
  void clear() { ms_.clear(); }
  double ms(int M) const;
  // a pass over M positions took `ms`: the two knots around M move toward it
  void observe(int M, double ms);

 private:
  std::vector<double> ms_;
};

// Per-position acceptance estimates, with priors
class Acceptance {
 public:
  static constexpr int kConfidence = 5;  // confidence classes of the last token (0: none yet)
  static constexpr int kDepth = 16;      // later depths share the last class
  Acceptance();
  // the confidence class of a row whose last emitted token scored `score` (log-prob; NaN: none)
  static int confidence(float score);
  // g[j] for j < L: expected accepted tokens of drafted position j (all of 0..j accepted)
  void gains(bool resynced, int conf, int L, double* g) const;
  // a draft of L tokens (resynced, conf as for gains), its first k accepted
  void observe(bool resynced, int conf, int L, int k);

 private:
  double first_hits_[2][kConfidence], first_trials_[2][kConfidence];
  double cont_hits_[kDepth], cont_trials_[kDepth];
};

// One row's candidate draft for DraftPolicy::choose
struct DraftCandidate {
  int cap;  // the most tokens it may draft (0: none)
  bool resynced;
  int conf;
};

// Milliseconds of a drafter's pass over n rows drafting K tokens one after
// the other: per step, by the rows (in classes of powers of two), learnt from
// the passes timed; unknown classes cost nothing until their first pass
class DraftCost {
 public:
  static constexpr int kClasses = 8;
  double ms(int rows, int steps) const;
  void observe(int rows, int steps, double ms);

 private:
  double step_ms_[kClasses] = {0, 0, 0, 0, 0, 0, 0, 0};
  bool seen_[kClasses] = {false, false, false, false, false, false, false, false};
};

// The check on the model above: how much faster than greedy's pass over the
// same rows (the cost table's ms(rows)) passes that drafted went, in tokens
// per row over time, against the same for passes that did not draft (whose
// ratio says how far the table is off now: load from other processes, a
// longer cache), from the passes timed, by the rows (classes of powers of two),
// in sums that forget old passes (kKeep per pass).  A pass that did not draft
// counts as greedy search's would have run, without what it spent only because
// a drafter is on (its proposal, the rows' confidences); of that, what passes
// that may draft spend and those that may not save (the confidences) is
// drafting's, so the next drafted pass of its rows carries it: drafting pays
// for the passes where it was ready but the model drafted nothing.  Where
// drafted passes did not go faster by kMinGain, passes do not draft, except one
// in kExplore, which keeps measuring them; the same keeps the other side
// measured where drafting wins.  With every drafter's pass timed, drafting
// that loses to greedy on this machine now (a full batch, a loaded CPU), or
// wins too little to be told from it, is seen and stopped, whatever the model
// predicted: where in doubt, greedy's passes, which spend nothing on confidences.
class Realized {
 public:
  static constexpr int kClasses = 8, kExplore = 64, kMinPasses = 8;
  static constexpr double kKeep = 1.0 - 1.0 / 64;
  // drafted passes must go this much faster to draft on: the sums' noise on a
  // quiet machine is about this size
  static constexpr double kMinGain = 0.02;
  // whether passes of these rows should draft, given that the model says `model_drafts`
  bool drafts(int rows, bool model_drafts);
  // whether the next pass of these rows may draft (false: drafts would return
  // false whatever the model says), so that its rows' confidences are worth
  // their log-normalisers (RunningBatch without scores)
  bool may_draft(int rows) const;
  // a pass of `rows` rows, drafted or not, emitted `tokens` in `ms` (an undrafted pass's without what
  // a drafter costs), of which the next drafted pass carries `carried_ms`; the table's greedy pass over
  // them: `greedy_ms`
  void observe(int rows, bool drafted, int tokens, double ms, double greedy_ms, double carried_ms = 0.0);

 private:
  double tokens_[2][kClasses] = {}, time_[2][kClasses] = {};
  double carried_[kClasses] = {};  // undrafted passes' confidences since the last drafted pass
  int passes_[2][kClasses] = {};
  int turn_[kClasses] = {};
  // drafted passes of class c went faster by kMinGain
  bool drafted_better(int c) const {
    return tokens_[1][c] * time_[0][c] > (1 + kMinGain) * tokens_[0][c] * time_[1][c];
  }
};

class DraftPolicy {
 public:
  PassCost cost;
  Acceptance acceptance;
  DraftCost drafter;
  Realized realized;
  // the lengths (0..cap) to verify of each row's draft, for a pass of these rows
  void choose(const std::vector<DraftCandidate>& rows, std::vector<int>& lengths);
  // how many tokens a drafter that drafts for every row at once (K steps, each
  // row keeping up to its cap) should draft: the K of the highest expected
  // tokens per millisecond of the drafter's pass and the verification pass
  int steps(const std::vector<DraftCandidate>& rows);

 private:
  struct Cand {
    double gain;
    int depth, row;
  };
  std::vector<Cand> cands_;
  std::vector<double> g_;
};

// The lengths each row verifies: the policy's choice, or (no policy) every
// candidate's cap; with `checked`, none where drafted passes of these rows
// went slower than greedy's (Realized; a drafter that asked it already, as
// the feature drafter before its own pass, leaves it out)
void draft_lengths(DraftPolicy* policy, const std::vector<DraftCandidate>& rows, std::vector<int>& lengths,
                   bool checked = false);
// After a pass a policy chose the lengths of: what it tells the policy's
// check (rows, positions verified, whether any drafted, tokens emitted, when
// drafting began and when the pass began; `drafting_ms`: what the pass spent
// only because a drafter is on, which an undrafted pass counts without, as
// greedy search's pass: the drafter's proposal, and the log-normalisers of
// the rows' confidences where the batch keeps no scores; `confidences_ms`:
// of those, what the check's own verdict saves where it says not to draft,
// the confidences, which the next drafted pass carries where this one did not draft)
void realized_pass(DraftPolicy* policy, int rows, int positions, bool drafted, int tokens,
                   std::chrono::steady_clock::time_point began, std::chrono::steady_clock::time_point pass_began,
                   double drafting_ms = 0.0, double confidences_ms = 0.0);

// The policies of the decoders that read one copy of the weights, as each
// last left it, by thread count (Weights::policies): a decoder made later
// (a hub model's translate() makes one per call) starts from what they
// measured and learnt instead of measuring again.  Decoders on separate
// threads each use a copy of their own; the map is read and written under mu.
struct PolicyCache {
  std::mutex mu;
  std::map<int, DraftPolicy> by_threads;
};

// The decoder's policy: its own, or a copy of the last one kept for its
// weights and thread count, or (neither) one whose pass cost it measures
// now (a few dozen passes over a scratch state of synthetic sentences)
DraftPolicy& draft_policy(Decoder& m);
// Keeps a copy of the decoder's policy for the decoders made after it (when it has one)
void keep_policy(const Decoder& m);

}  // namespace fa
