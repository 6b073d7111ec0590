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

#include <cstdint>
#include <vector>

namespace fa {

struct Model;

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

class DraftPolicy {
 public:
  PassCost cost;
  Acceptance acceptance;
  // the lengths (0..cap) to verify of each row's draft, for a pass of these rows
  void choose(const std::vector<DraftCandidate>& rows, std::vector<int>& lengths);

 private:
  struct Cand {
    double gain;
    int depth, row;
  };
  std::vector<Cand> cands_;
  std::vector<double> g_;
};

// The decoder's policy, its pass cost measured first where it is not yet
// (a few dozen passes over a scratch state of synthetic sentences)
DraftPolicy& draft_policy(Model& m);

}  // namespace fa
