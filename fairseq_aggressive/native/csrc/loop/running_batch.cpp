// The engine's one decoding loop (see running_batch.h).
#include "loop/running_batch.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

#include "model/pass.h"

namespace fa {

// fa_set_run_fault_token (testing/test_api.cpp): a pass with a row whose copy
// source holds this token fails as an engine error does (-1: never), so that
// tests can pin a fault on a sentence
int run_fault_token = -1;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

}  // namespace

RunningBatch::RunningBatch(const RunSettings& s, Decoder* dm)
    : s_(s), drafter_name_(s.drafter ? s.drafter : "") {
  s_.drafter = nullptr;  // (the caller's string is not kept)
  if (s.min_len < 0) throw std::invalid_argument("running batch: min_len below 0");
  drafter_ = make_drafter(drafter_name_, s.draft, dm);
  if (!drafter_) throw std::invalid_argument("running batch: no drafter named '" + drafter_name_ + "'");
}

bool RunningBatch::forced_fits(const Decoder& m) const {
  return !s_.has_forced || (s_.forced >= 0 && s_.forced < m.cfg.tgt_vocab);
}

void RunningBatch::take_slots(int n, int32_t* slots) {
  for (int i = 0; i < n; ++i) {
    if (!free_.empty()) {
      slots[i] = free_.back();
      free_.pop_back();
    } else {
      slots[i] = (int)rows_.size();
      rows_.emplace_back();
      st_.sents.emplace_back();
    }
  }
}

void RunningBatch::start_row(int slot, int max_len, const int32_t* copy, int copy_len) {
  Row& r = rows_[slot];
  r.state = kActive;
  r.max_len = max_len;
  r.passes = 0;
  r.copy.assign(copy, copy + copy_len);
  r.last = s_.first;
  r.out.clear();
  r.scores.clear();
  active_.push_back(slot);
}

int RunningBatch::join(Decoder& m, int n, const int32_t* tokens, const int32_t* src_len, const int32_t* copy,
                       const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out) {
  if (n < 1 || drafter_->check(m) != 0 || !forced_fits(m)) return -1;
  int cap = 0;
  for (int i = 0; i < n; ++i) {
    if (src_len[i] < 1 || copy_len[i] < 0 || max_len[i] < 1 || max_len[i] < s_.min_len) return -1;
    cap = std::max(cap, max_len[i] + 2);
  }
  std::unique_ptr<State> enc(encode(m, n, tokens, src_len, cap));
  std::vector<int32_t> slots(n);
  take_slots(n, slots.data());
  drafter_->join(m, Joining{n, slots.data(), *enc, tokens, src_len, copy, copy_len, cap, nullptr});
  for (int i = 0, o = 0; i < n; o += copy_len[i++]) {
    st_.sents[slots[i]] = std::move(enc->sents[i]);
    start_row(slots[i], max_len[i], copy + o, copy_len[i]);
    slot_out[i] = slots[i];
  }
  stats_.joined += n;
  return 0;
}

int RunningBatch::adopt(Decoder& m, State& st, State* given, const int32_t* copy, const int32_t* copy_len,
                        int max_len) {
  const int n = (int)st.sents.size();
  if (!rows_.empty() || n < 1 || max_len < 1 || max_len < s_.min_len || drafter_->check(m) != 0 ||
      !forced_fits(m) || (s_.has_forced && st.shortlist) || (given != nullptr && (int)given->sents.size() != n))
    return -1;
  std::vector<int32_t> src_len(n), slots(n);
  for (int i = 0; i < n; ++i) {
    const Sentence& s = st.sents[i];
    if (s.len != 0 || s.cap == 0 || copy_len[i] < 0) return -1;  // decoded or used up
    if (given != nullptr && (given->sents[i].len != 0 || given->sents[i].cap == 0)) return -1;
    src_len[i] = s.src_len;
  }
  take_slots(n, slots.data());  // 0..n-1
  st_.shortlist = st.shortlist;
  drafter_->join(m, Joining{n, slots.data(), st, nullptr, src_len.data(), copy, copy_len, st.sents[0].cap, given});
  for (int i = 0, o = 0; i < n; o += copy_len[i++]) {
    st_.sents[i] = std::move(st.sents[i]);
    st.sents[i] = Sentence();  // (cap 0: used up)
    start_row(i, max_len, copy + o, copy_len[i]);
  }
  stats_.joined += n;
  return 0;
}

int RunningBatch::run(Decoder& m, int max_passes, double min_ms, int32_t* finished, int cap) {
  DraftPolicy* policy = s_.budget && s_.draft.max_draft != 0 && drafter_->drafts() ? &draft_policy(m) : nullptr;
  const bool feats = drafter_->reads_features();
  const int FC = m.cfg.C;
  int n_finished = 0;
  const auto started = Clock::now();
  for (int pass = 0; pass < max_passes && !active_.empty(); ++pass) {
    const int n = (int)active_.size();
    const auto t0 = Clock::now();
    PassRows& pr = pass_rows_;
    pr.n = n;
    pr.slot = active_.data();
    pr.out.resize(n);
    pr.room.resize(n);
    pr.conf.resize(n);
    for (int i = 0; i < n; ++i) {
      const Row& r = rows_[active_[i]];
      pr.out[i] = &r.out;
      pr.room[i] = draft_room(r.max_len - (int)r.out.size(), s_.draft.max_draft);
      pr.conf[i] = Acceptance::confidence(r.scores.empty() ? std::numeric_limits<float>::quiet_NaN() : r.scores.back());
    }
    if (run_fault_token >= 0)
      for (int i = 0; i < n; ++i) {
        const auto& c = rows_[active_[i]].copy;
        if (std::find(c.begin(), c.end(), run_fault_token) != c.end())
          throw std::runtime_error("injected fault: a row's source holds the fault token");
      }
    drafter_->propose(m, pr, policy, drafts_);
    const auto proposed = Clock::now();
    row_len_.resize(n);
    offset_.resize(n);
    row_max_.resize(n);
    tokens_.clear();
    for (int i = 0; i < n; ++i) {
      const Row& r = rows_[active_[i]];
      const int L = drafts_.len[i];
      offset_[i] = (int)tokens_.size();
      tokens_.push_back(r.last);
      if (L > 0) tokens_.insert(tokens_.end(), drafts_.tokens[i], drafts_.tokens[i] + L);
      row_len_[i] = 1 + L;
      row_max_[i] = r.max_len;
    }
    const size_t total = tokens_.size();
    choice_.resize(total);
    score_.resize(total);
    if (feats) feats_.resize(total * FC);
    n_emit_.resize(n);
    n_match_.resize(n);
    done_.resize(n);
    PassArgs a{};
    a.n = n;
    a.sent = active_.data();
    a.row_len = row_len_.data();
    a.tokens = tokens_.data();
    a.max_len = 0;
    a.row_max_len = row_max_.data();
    a.min_len = s_.min_len;
    a.unk_penalty = s_.unk_penalty;
    a.temperature = s_.temperature;
    a.beta = s_.beta;
    a.tau = s_.tau;
    a.has_forced = s_.has_forced;
    a.forced = s_.forced;
    a.choice = choice_.data();
    a.score = score_.data();
    a.n_emit = n_emit_.data();
    a.n_match = n_match_.data();
    a.done = done_.data();
    a.feats = feats ? feats_.data() : nullptr;
    // without scores, only the last token's, for the rows' confidences, where the next pass may draft
    // (the rows' class seldom changes between passes; where it does, a pass's rows draft as new rows)
    a.scores = !s_.no_scores ? kScoresAll : policy != nullptr && policy->realized.may_draft(n) ? kScoresLast
                                                                                               : kScoresNone;
    int64_t lse_ns = 0;
    a.lse_ns = a.scores == kScoresLast ? &lse_ns : nullptr;
    const auto t1 = Clock::now();
    stats_.loop.draft_ns += ns_between(t0, t1);
    // (rows fit: a draft never reaches beyond the row's max_len, its cache holds max_len + 2 positions)
    if (verify_pass(m, st_, a) != 0) throw std::logic_error("a running batch's row does not fit its cache");
    const auto t2 = Clock::now();
    if (policy != nullptr) {
      policy->cost.observe((int)total, std::chrono::duration<double, std::milli>(t2 - t1).count());
      int emitted = 0;
      for (int i = 0; i < n; ++i) {
        policy->acceptance.observe(drafts_.cand[i].resynced, drafts_.cand[i].conf, drafts_.len[i], n_match_[i]);
        emitted += n_emit_[i];
      }
      // a pass that did not draft counts as greedy search's would have run: without the proposal and the
      // log-normalisers, which only drafting asks for (so drafting has to beat greedy itself, not its
      // own undrafted passes); the log-normalisers, which passes that may not draft save, are drafting's
      realized_pass(policy, n, (int)total, drafts_.drafted, emitted, t0, t1,
                    lse_ns * 1e-6 + std::chrono::duration<double, std::milli>(proposed - t0).count(), lse_ns * 1e-6);
    }
    drafter_->learn(m, st_, Verified{n, active_.data(), offset_.data(), drafts_.len.data(), n_match_.data(),
                                      n_emit_.data(), done_.data(), choice_.data(), feats ? feats_.data() : nullptr,
                                      feats ? FC : 0},
                    stats_);
    stats_.loop.draft_ns += ns_between(t2, Clock::now());
    stats_.loop.passes += 1;
    stats_.loop.sentence_passes += n;
    stats_.pass_rows[std::min(n, kRunRowsHist - 1)] += 1;
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      const int slot = active_[i], o = offset_[i];
      Row& r = rows_[slot];
      r.passes += 1;
      stats_.loop.count(drafts_.len[i], n_match_[i]);
      stats_.emitted += n_emit_[i];
      r.out.insert(r.out.end(), choice_.begin() + o, choice_.begin() + o + n_emit_[i]);
      r.scores.insert(r.scores.end(), score_.begin() + o, score_.begin() + o + n_emit_[i]);
      if (done_[i]) {
        r.state = kFinished;
        drafter_->leave(slot);
        if (n_finished < cap) finished[n_finished] = slot;
        ++n_finished;
        continue;
      }
      r.last = r.out.back();
      active_[kept++] = slot;
    }
    active_.resize(kept);
    if (min_ms > 0 && ms_since(started) < min_ms) continue;  // (a wake stays set for the next pass)
    if (n_finished > 0 || wake_.exchange(false, std::memory_order_acq_rel)) break;
  }
  return std::min(n_finished, cap);
}

void RunningBatch::free_slot(int slot) {
  Row& r = rows_[slot];
  r.state = kFree;
  r.out.clear();
  r.scores.clear();
  r.copy.clear();
  st_.sents[slot] = Sentence();  // its caches go
  free_.push_back(slot);
}

int RunningBatch::take(int slot, int32_t* tokens, float* scores, int cap, int32_t* passes) {
  if (slot < 0 || slot >= (int)rows_.size() || rows_[slot].state != kFinished) return -1;
  const Row& r = rows_[slot];
  const int k = std::min((int)r.out.size(), cap);
  std::copy(r.out.begin(), r.out.begin() + k, tokens);
  if (s_.no_scores)  // (the last token's of a pass may have one, for the policy: Acceptance::confidence)
    std::fill(scores, scores + k, std::numeric_limits<float>::quiet_NaN());
  else
    std::copy(r.scores.begin(), r.scores.begin() + k, scores);
  *passes = r.passes;
  free_slot(slot);
  stats_.left += 1;
  return k;
}

int RunningBatch::drop(int slot) {
  if (slot < 0 || slot >= (int)rows_.size() || rows_[slot].state != kActive) return -1;
  active_.erase(std::find(active_.begin(), active_.end(), slot));
  drafter_->leave(slot);
  free_slot(slot);
  stats_.dropped += 1;
  return 0;
}

int decode_static(Decoder& m, State& st, Decoder* dm, State* given, const RunSettings& s, const int32_t* copy,
                  const int32_t* copy_len, int max_len, const StaticOutput& out, RunStats& stats) {
  const int n = (int)st.sents.size();
  if (out.out_cap < max_len + 1) return -1;
  RunningBatch batch(s, dm);
  if (batch.adopt(m, st, given, copy, copy_len, max_len) != 0) return -1;
  std::vector<int32_t> finished(n);
  while (batch.active() > 0) batch.run(m, std::numeric_limits<int>::max(), 0.0, finished.data(), n);
  for (int b = 0; b < n; ++b)
    out.out_len[b] = batch.take(b, out.out_tokens + (size_t)b * out.out_cap, out.out_scores + (size_t)b * out.out_cap,
                                out.out_cap, out.passes + b);
  stats = batch.stats();
  return 0;
}

}  // namespace fa
