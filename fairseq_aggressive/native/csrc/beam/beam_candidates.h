// A beam hypothesis's candidates at one step (beam_search.h): its logits
// valued as fairseq's SequenceGenerator values them and the k best kept.
#pragma once

#include <cstdint>
#include <vector>

namespace fa {

struct BeamArgs;

struct Candidate {
  float val;
  int flat;  // hypothesis * V + token
};

// ranked best first: higher score, then the lower hypothesis and token
inline bool better(const Candidate& x, const Candidate& y) {
  return x.val > y.val || (x.val == y.val && x.flat < y.flat);
}

class CandidateScan {
 public:
  CandidateScan(const BeamArgs& a, int vocab, int pad, int unk, int eos);

  // Hypothesis i's (tokens toks: the first, then one per step) k best
  // candidates at `step`, best first, appended to out: value (lg[v] - lse)
  // (+ prev, its score, after step 0) as fairseq adjusts it (pad never, unk
  // pays unk_penalty, EOS not before min_len, only EOS from max_len on, no
  // repeated n-gram).  lg (V logits) is divided by the temperature in place.
  // The scan values 8 columns at a time and offers only those that reach the
  // k-th value so far; the few adjusted columns are valued apart.  Every value is at most prev (after step 0):
  // lse >= the largest logit, so lg[v] - lse <= 0, unless unk_penalty < 0.
  void row(float* lg, const std::vector<int32_t>& toks, int i, float prev, int step, int k, std::vector<Candidate>& out);

 private:
  const BeamArgs& a_;
  const int V_, pad_, unk_, eos_;
  std::vector<Candidate> top_;  // one row's best so far
  std::vector<int> special_;    // one row's adjusted columns
  std::vector<char> skip_;      // per column: adjusted (valued apart from the scan)

  void offer(const Candidate& c, int k);
};

}  // namespace fa
