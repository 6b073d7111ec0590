// A hypothesis's candidates (see beam_candidates.h).
#include "beam/beam_candidates.h"

#include <algorithm>
#include <limits>

#include "beam/beam_search.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

namespace fa {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

CandidateScan::CandidateScan(const BeamArgs& a, int vocab, int pad, int unk, int eos)
    : a_(a), V_(vocab), pad_(pad), unk_(unk), eos_(eos), skip_(vocab, 0) {}

void CandidateScan::offer(const Candidate& c, int k) {
  if ((int)top_.size() == k && !better(c, top_.back())) return;
  top_.insert(std::upper_bound(top_.begin(), top_.end(), c, better), c);
  if ((int)top_.size() > k) top_.pop_back();
}

void CandidateScan::row(float* lg, const std::vector<int32_t>& toks, int i, float prev, int step, int k,
                        std::vector<Candidate>& out) {
  if (a_.temperature != 1.f)
    for (int v = 0; v < V_; ++v) lg[v] = lg[v] / a_.temperature;
  const float lse = logsumexp(lg, V_);
  auto value = [&](float x) {
    x = x - lse;
    if (x != x) x = kNegInf;
    return step == 0 ? x : x + prev;
  };
  const int base = i * V_;
  top_.clear();
  if (step >= a_.max_len) {  // only EOS; the other places go to the lowest ids at -inf
    offer({value(lg[eos_]), base + eos_}, k);
    for (int v = 0; v < V_ && (int)top_.size() < k; ++v)
      if (v != eos_) offer({kNegInf, base + v}, k);
    out.insert(out.end(), top_.begin(), top_.end());
    return;
  }
  special_.clear();
  special_.push_back(pad_);
  special_.push_back(unk_);
  special_.push_back(eos_);
  const int N = a_.no_repeat_ngram;
  if (N > 0 && step + 2 - N >= 0) {  // tokens that would repeat an n-gram of this hypothesis (toks[0 .. step])
    for (int s = 0; s < step + 2 - N; ++s)
      if (std::equal(toks.begin() + s, toks.begin() + s + N - 1, toks.begin() + (step + 2 - N)))
        special_.push_back(toks[s + N - 1]);
  }
  for (int v : special_) skip_[v] = 1;
  // 8 columns at a time: their values as value() computes them (the same two
  // roundings, so the same bits), and only the columns whose value reaches the
  // k-th so far are offered (a NaN's -inf never enters a full top: the
  // columns before it rank first)
  const V8 lse8 = V8::bcast(lse), prev8 = V8::bcast(step == 0 ? 0.f : prev);
  int v = 0;
  for (; v + LANES <= V_; v += LANES) {
    if ((int)top_.size() < k) {
      for (int c = v; c < v + LANES; ++c)
        if (!skip_[c]) offer({value(lg[c]), base + c}, k);
      continue;
    }
    V8 x = V8::sub(V8::load(lg + v), lse8);
    if (step != 0) x = V8::add(x, prev8);
    for (unsigned m = V8::at_least_lanes(x, V8::bcast(top_.back().val)); m != 0; m &= m - 1) {
      const int c = v + __builtin_ctz(m);
      if (!skip_[c]) offer({value(lg[c]), base + c}, k);
    }
  }
  for (; v < V_; ++v)
    if (!skip_[v]) offer({value(lg[v]), base + v}, k);
  for (int v : special_) skip_[v] = 0;
  for (size_t j = 0; j < special_.size(); ++j) {
    const int v = special_[j];
    if (std::find(special_.begin(), special_.begin() + j, v) != special_.begin() + j) continue;  // once each
    const bool banned = std::find(special_.begin() + 3, special_.end(), v) != special_.end();
    float val;
    if (v == pad_ || banned || (v == eos_ && step < a_.min_len)) {
      val = kNegInf;
    } else if (v == unk_) {  // fairseq: lprobs[unk] -= unk_penalty, then the hypothesis' score is added
      float x = lg[v] - lse;
      if (x != x) x = kNegInf;
      x = x - a_.unk_penalty;
      val = step == 0 ? x : x + prev;
    } else {
      val = value(lg[v]);
    }
    offer({val, base + v}, k);
  }
  out.insert(out.end(), top_.begin(), top_.end());
}

}  // namespace fa
