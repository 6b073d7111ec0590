// The engine's draft-length policy (see draft_lengths.h).
#include "loop/draft_lengths.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "model/decoder.h"
#include "model/pass.h"

namespace fa {

namespace {

// learning rate of a timed pass against the cost table, and the most one pass moves it
constexpr double kCostRate = 0.1, kCostClamp = 0.05;
// priors (and their weight in observations) of the acceptance rates: a first
// token continuing a copy, one after re-anchoring, a token after an accepted one
constexpr double kPriorCopy = 0.8, kPriorSync = 0.5, kPriorCont = 0.85, kPriorWeight = 4.0;
// counts are halved beyond this many trials, so the rates follow the text decoded now
constexpr double kRecent = 2000.0;
// drafts are verified only where they promise this much more than greedy's pass (a
// pass's cost and its acceptance are estimates: a promise smaller than their error
// is as likely a loss)
constexpr double kMargin = 0.03;
void halve_if_old(double& hits, double& trials) {
  if (trials > kRecent) {
    hits *= 0.5;
    trials *= 0.5;
  }
}

}  // namespace


const std::vector<int>& PassCost::knots() {
  static const std::vector<int> k = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128};
  return k;
}

void PassCost::set(std::vector<double> ms_at_knots) {
  ms_ = std::move(ms_at_knots);
  for (size_t i = 1; i < ms_.size(); ++i) ms_[i] = std::max(ms_[i], ms_[i - 1]);
}

double PassCost::ms(int M) const {
  const auto& k = knots();
  const int n = (int)k.size();
  if (M <= k[0]) return ms_[0];
  int i = (int)(std::upper_bound(k.begin(), k.end(), M) - k.begin()) - 1;
  if (i >= n - 1) i = n - 2;  // beyond the last knot: the last segment's slope
  const double t = double(M - k[i]) / (k[i + 1] - k[i]);
  return ms_[i] + t * (ms_[i + 1] - ms_[i]);
}

void PassCost::observe(int M, double ms) {
  if (!ready() || !(ms > 0)) return;
  const auto& k = knots();
  const int n = (int)k.size();
  // a pass far off the line moves it no more than kCostClamp of its value: a pass the OS interrupted
  // (the errors' long tail is all upward) would drag the knots it visits above the typical pass,
  // which makes the M a policy visits look dear against those it does not
  const double pred = this->ms(M);
  const double err = std::max(-kCostClamp * pred, std::min(kCostClamp * pred, ms - pred));
  if (M <= k[0]) {
    ms_[0] += kCostRate * err;
  } else {
    int i = (int)(std::upper_bound(k.begin(), k.end(), M) - k.begin()) - 1;
    if (i >= n - 1) i = n - 2;
    const double t = std::min(1.0, double(M - k[i]) / (k[i + 1] - k[i]));
    ms_[i] += kCostRate * (1 - t) * err;
    ms_[i + 1] += kCostRate * t * err;
  }
  ms_[0] = std::max(ms_[0], 1e-4);
  for (int i = 1; i < n; ++i) ms_[i] = std::max(ms_[i], ms_[i - 1]);
}

Acceptance::Acceptance() {
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < kConfidence; ++c) first_hits_[s][c] = first_trials_[s][c] = 0;
  for (int d = 0; d < kDepth; ++d) cont_hits_[d] = cont_trials_[d] = 0;
}

int Acceptance::confidence(float score) {
  if (std::isnan(score)) return 0;
  if (score > -0.1f) return 1;
  if (score > -0.5f) return 2;
  if (score > -1.5f) return 3;
  return 4;
}

void Acceptance::gains(bool resynced, int conf, int L, double* g) const {
  const int s = resynced ? 1 : 0;
  const double prior = resynced ? kPriorSync : kPriorCopy;
  double p = (first_hits_[s][conf] + prior * kPriorWeight) / (first_trials_[s][conf] + kPriorWeight);
  for (int j = 0; j < L; ++j) {
    if (j > 0) {
      const int d = std::min(j, kDepth - 1);
      p *= (cont_hits_[d] + kPriorCont * kPriorWeight) / (cont_trials_[d] + kPriorWeight);
    }
    g[j] = p;
  }
}

void Acceptance::observe(bool resynced, int conf, int L, int k) {
  if (L <= 0) return;
  const int s = resynced ? 1 : 0;
  first_trials_[s][conf] += 1;
  first_hits_[s][conf] += k >= 1;
  halve_if_old(first_hits_[s][conf], first_trials_[s][conf]);
  // depth j was tried where 0..j-1 were accepted
  for (int j = 1; j < L && j <= k; ++j) {
    const int d = std::min(j, kDepth - 1);
    cont_trials_[d] += 1;
    cont_hits_[d] += j < k;
    halve_if_old(cont_hits_[d], cont_trials_[d]);
  }
}

double DraftCost::ms(int rows, int steps) const {
  const int c = rows_class(rows, kClasses);
  return seen_[c] ? step_ms_[c] * (steps + 1) : 0.0;  // + 1: the tokens read before the first step
}

void DraftCost::observe(int rows, int steps, double ms) {
  if (steps < 1 || !(ms > 0)) return;
  const int c = rows_class(rows, kClasses);
  const double per = ms / (steps + 1);
  step_ms_[c] = seen_[c] ? step_ms_[c] + kCostRate * (per - step_ms_[c]) : per;
  seen_[c] = true;
}

int DraftPolicy::steps(const std::vector<DraftCandidate>& rows) {
  const int R = (int)rows.size();
  int kmax = 0;
  for (const auto& r : rows) kmax = std::max(kmax, r.cap);
  if (R == 0 || kmax == 0) return 0;
  // per K: every row's positions up to min(K, cap), their expected tokens
  std::vector<double> gain(kmax + 1, 0.0);
  std::vector<int> positions(kmax + 1, 0);
  for (const auto& r : rows) {
    if (r.cap <= 0) continue;
    g_.resize(r.cap);
    acceptance.gains(r.resynced, r.conf, r.cap, g_.data());
    for (int j = 0; j < r.cap; ++j) {
      gain[j + 1] += g_[j];
      positions[j + 1] += 1;
    }
  }
  int best = 0;
  double tokens = R, best_rate = R / cost.ms(R);
  int M = R;
  for (int K = 1; K <= kmax; ++K) {
    tokens += gain[K];
    M += positions[K];
    const double rate = tokens / (drafter.ms(R, K) + cost.ms(M));
    if (rate > best_rate * (1 + 1e-9)) {
      best_rate = rate;
      best = K;
    }
  }
  return best;
}

void DraftPolicy::choose(const std::vector<DraftCandidate>& rows, std::vector<int>& lengths) {
  const int R = (int)rows.size();
  lengths.assign(R, 0);
  cands_.clear();
  for (int r = 0; r < R; ++r) {
    const int L = rows[r].cap;
    if (L <= 0) continue;
    g_.resize(L);
    acceptance.gains(rows[r].resynced, rows[r].conf, L, g_.data());
    for (int j = 0; j < L; ++j) cands_.push_back({g_[j], j, r});
  }
  if (cands_.empty() || R == 0) return;
  const double base = R / cost.ms(R);
  // every candidate's gain at the cost of a single position is the most any choice can
  // promise (the cost grows with the positions): where even that falls short, greedy's
  // pass without sorting (a full batch, where drafts rarely pay)
  double all = R;
  for (const Cand& c : cands_) all += c.gain;
  if (all / cost.ms(R + 1) < base * (1 + kMargin)) return;
  // highest gain first; along a row gains fall with depth, so every prefix of
  // this order is a prefix of each row's draft
  std::sort(cands_.begin(), cands_.end(), [](const Cand& a, const Cand& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.row < b.row;
  });
  double tokens = R, best_rate = base;
  int best = 0;
  for (int k = 1; k <= (int)cands_.size(); ++k) {
    tokens += cands_[k - 1].gain;
    const double rate = tokens / cost.ms(R + k);
    if (rate > best_rate * (1 + 1e-9)) {
      best_rate = rate;
      best = k;
    }
  }
  if (best_rate < base * (1 + kMargin)) best = 0;  // a gain within the estimates' error: greedy's pass
  for (int k = 0; k < best; ++k) lengths[cands_[k].row] = std::max(lengths[cands_[k].row], cands_[k].depth + 1);
}

namespace {

// The pass cost of m over the knots' positions: passes over rows of 16
// synthetic sentences (tokens of the source vocabulary, each row its last
// token then padding, which greedy never chooses: every position is computed
// and projected, as a rejected draft's are), the median of 3 each
std::vector<double> measure_pass_cost(Decoder& m) {
  using Clock = std::chrono::steady_clock;
  constexpr int kSents = 16, kWarm = 8;
  const auto& knots = PassCost::knots();
  // within the position tables (a learned table covers its rows; sinusoidal ones any position)
  const int C = m.cfg.C;
  const int src_rows = m.w.src_pos.empty() ? 1 << 20 : (int)(m.w.src_pos.size() / C);
  const int tgt_rows = m.w.tgt_pos.empty() ? 1 << 20 : (int)(m.w.tgt_pos.size() / C);
  const int kSrc = std::max(1, std::min(20, src_rows));
  const int span = std::max(1, m.cfg.src_vocab - 4);
  std::vector<int32_t> toks(kSents * kSrc), src_len(kSents, kSrc);
  for (int i = 0; i < kSents * kSrc; ++i) toks[i] = 4 + (i * 7919) % span;
  const int longest = (knots.back() + kSents - 1) / kSents;
  const int cap = std::min(kWarm + 4 * (int)knots.size() + longest + 4, tgt_rows);
  std::unique_ptr<State> st;
  auto fresh_state = [&] { st.reset(encode(m, kSents, toks.data(), src_len.data(), cap)); };
  fresh_state();
  std::vector<int32_t> sent, row_len, tokens, out_i(knots.back() + kSents);
  std::vector<float> out_f(knots.back() + kSents);
  std::vector<int32_t> n_emit(kSents), n_match(kSents), done(kSents);
  auto pass = [&](int M) {
    const int R = std::min(M, kSents);
    sent.clear();
    row_len.clear();
    tokens.clear();
    for (int r = 0; r < R; ++r) {
      const int len = M / R + (r < M % R);
      sent.push_back(r);
      row_len.push_back(len);
      tokens.push_back(m.cfg.eos);
      for (int j = 1; j < len; ++j) tokens.push_back(m.cfg.pad);
    }
    PassArgs a{};
    a.n = R;
    a.sent = sent.data();
    a.row_len = row_len.data();
    a.tokens = tokens.data();
    a.max_len = 1 << 20;
    a.min_len = 1 << 20;  // no EOS: every sentence goes on
    a.temperature = 1.f;
    a.beta = 1;
    a.choice = out_i.data();
    a.score = out_f.data();
    a.n_emit = n_emit.data();
    a.n_match = n_match.data();
    a.done = done.data();
    const auto t0 = Clock::now();
    if (verify_pass(m, *st, a) != 0) throw std::logic_error("measuring the pass cost: a row does not fit");
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (int w = 0; w < kWarm && kSents + 1 < cap; ++w) pass(kSents);
  std::vector<double> ms;
  for (int M : knots) {
    const int row = (M + kSents - 1) / kSents;
    if (row + 4 > cap) {  // (tiny position tables) the last segment's slope from here on
      const size_t n = ms.size();
      const double slope = n >= 2 ? (ms[n - 1] - ms[n - 2]) / (knots[n - 1] - knots[n - 2]) : 0.0;
      ms.push_back(n ? ms[n - 1] + slope * (M - knots[n - 1]) : 1.0);
      continue;
    }
    if (st->sents[0].len + row + 4 > cap) fresh_state();
    pass(M);  // its buffers grown
    double t[3] = {pass(M), pass(M), pass(M)};
    std::sort(t, t + 3);
    ms.push_back(t[1]);
  }
  return ms;
}

}  // namespace

void draft_lengths(DraftPolicy* policy, const std::vector<DraftCandidate>& rows, std::vector<int>& lengths,
                   bool checked) {
  if (policy != nullptr) {
#if defined(FA_TEST_HOOKS)
    checked = checked && realized_check;
#endif
    if (checked && !policy->realized.may_draft((int)rows.size())) {  // the model's choice would be overruled:
      policy->realized.drafts((int)rows.size(), true);  // its turn counted, as where the model drafts
      lengths.assign(rows.size(), 0);
      return;
    }
    policy->choose(rows, lengths);
    if (checked) {
      const bool any = std::any_of(lengths.begin(), lengths.end(), [](int L) { return L > 0; });
      if (!policy->realized.drafts((int)rows.size(), any)) std::fill(lengths.begin(), lengths.end(), 0);
    }
    return;
  }
  lengths.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) lengths[i] = rows[i].cap;
}

DraftPolicy& draft_policy(Decoder& m) {
  if (m.policy && m.policy->cost.ready()) return *m.policy;
  PolicyCache& cache = *m.shared->policies;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.by_threads.find(m.pool.size());
    if (it != cache.by_threads.end()) {
      if (m.policy)
        m.policy->cost = it->second.cost;  // (threads changed: that count's cost, this decoder's rates)
      else
        m.policy = std::make_shared<DraftPolicy>(it->second);
      return *m.policy;
    }
  }
  if (!m.policy) m.policy = std::make_shared<DraftPolicy>();
  m.policy->cost.set(measure_pass_cost(m));
  keep_policy(m);
  return *m.policy;
}

void keep_policy(const Decoder& m) {
  if (!m.policy || !m.policy->cost.ready()) return;
  PolicyCache& cache = *m.shared->policies;
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.by_threads.find(m.pool.size());
  if (it == cache.by_threads.end())
    cache.by_threads.emplace(m.pool.size(), *m.policy);
  else
    it->second = *m.policy;
}

}  // namespace fa
