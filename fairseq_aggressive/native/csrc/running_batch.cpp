// Continuous batching in the engine (see running_batch.h).
#include "running_batch.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <stdexcept>

#include "block_drafter.h"
#include "pass.h"

namespace fa {

// fa_set_run_fault_token (testing/test_api.cpp): a pass with a row whose copy
// source holds this token fails as an engine error does (-1: never), so that
// tests can pin a fault on a sentence
int run_fault_token = -1;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

int RunningBatch::join(Decoder& m, Decoder* dm, int n, const int32_t* tokens, const int32_t* src_len,
                       const int32_t* copy, const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out) {
  if (n < 1 || (feature() && dm == nullptr)) return -1;
  int cap = 0;
  for (int i = 0; i < n; ++i) {
    if (src_len[i] < 1 || copy_len[i] < 0 || max_len[i] < 1 || max_len[i] < s_.min_len) return -1;
    cap = std::max(cap, max_len[i] + 2);
  }
  std::unique_ptr<State> enc(encode(m, n, tokens, src_len, cap));
  std::unique_ptr<State> denc;
  if (feature()) {  // the drafter's caches hold max_len + k + 2 positions
    const int dcap = cap + s_.k;
    denc.reset(s_.shared_encoder ? state_from_encoder_out(*dm, n, enc->enc_out.data(), src_len, dcap)
                                 : encode(*dm, n, tokens, src_len, dcap));
  }
  for (int i = 0, o = 0; i < n; o += copy_len[i++]) {
    int slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = (int)rows_.size();
      rows_.emplace_back();
      st_.sents.emplace_back();
      if (feature()) dst_.sents.emplace_back();
    }
    st_.sents[slot] = std::move(enc->sents[i]);
    Row& r = rows_[slot];
    r.state = kActive;
    r.max_len = max_len[i];
    r.passes = 0;
    r.src.assign(copy + o, copy + o + copy_len[i]);
    r.copy.start(r.src.data(), (int)r.src.size());
    r.last = s_.first;
    r.out.clear();
    r.scores.clear();
    if (feature()) {
      dst_.sents[slot] = std::move(denc->sents[i]);
      r.fresh.assign(1, s_.bos);
      r.fresh_feats.assign(m.cfg.C, 0.f);
    }
    active_.push_back(slot);
    slot_out[i] = slot;
  }
  stats_.joined += n;
  return 0;
}

void RunningBatch::copy_drafts(DraftPolicy* policy) {
  const int n = (int)active_.size();
  start_.assign(n, kNoCopy);
  cand_.resize(n);
  for (int i = 0; i < n; ++i) {
    Row& r = rows_[active_[i]];
    const int room = draft_room(r.max_len - (int)r.out.size(), s_.max_draft);
    bool resynced;
    const int cap = r.copy.candidate(r.out, room, s_.ngram_min, s_.ngram_max, &start_[i], &resynced);
    cand_[i] = {cap, resynced, Acceptance::confidence(last_score(r))};
  }
  draft_lengths(policy, cand_, lens_, /*checked=*/true);
}

void RunningBatch::feature_drafts(Decoder& dm, DraftPolicy* policy) {
  const int n = (int)active_.size();
  cand_.resize(n);
  for (int i = 0; i < n; ++i) {
    Row& r = rows_[active_[i]];
    const int have = (int)r.out.size();
    int c = std::min({(int)s_.k, r.max_len - have, (int)s_.room - have});
    if (s_.max_draft >= 0) c = std::min(c, (int)s_.max_draft);
    cand_[i] = {std::max(c, 0), false, Acceptance::confidence(last_score(r))};
  }
  int K = 0;
  if (policy != nullptr) {
    K = policy->steps(cand_);
    if (!policy->realized.drafts(n, K > 0)) K = 0;
  } else {
    for (const auto& c : cand_) K = std::max(K, c.cap);
  }
  steps_ = K;
  drafted_.assign(n, 0);
  if (K > 0) {
    new_len_.assign(n, 0);
    new_tokens_.clear();
    new_feats_.clear();
    for (int i = 0; i < n; ++i) {
      Row& r = rows_[active_[i]];
      new_len_[i] = (int)r.fresh.size();
      new_tokens_.insert(new_tokens_.end(), r.fresh.begin(), r.fresh.end());
      new_feats_.insert(new_feats_.end(), r.fresh_feats.begin(), r.fresh_feats.end());
      r.fresh.clear();
      r.fresh_feats.clear();
    }
    proposed_.resize((size_t)n * K);
    const DraftArgs d = feature_draft_args(n, active_.data(), new_len_.data(), new_tokens_.data(), new_feats_.data(), K,
                                           s_.min_prob, proposed_.data(), drafted_.data());
    const auto t0 = Clock::now();
    if (draft_pass(dm, dst_, d) != 0) throw std::logic_error("a draft does not fit the drafter's cache");
    if (policy != nullptr) policy->drafter.observe(n, K, ms_since(t0));
  }
  for (int i = 0; i < n; ++i) cand_[i].cap = K > 0 ? std::min({cand_[i].cap, K, (int)drafted_[i]}) : 0;
  draft_lengths(policy, cand_, lens_);  // the verification pass keeps the positions that pay
}

int RunningBatch::run(Decoder& m, Decoder* dm, int max_passes, double min_ms, int32_t* finished, int cap) {
  if (feature() && dm == nullptr) throw std::invalid_argument("a running batch of a feature drafter needs its decoder");
  const bool drafts = s_.max_draft != 0;
  DraftPolicy* policy = s_.budget && drafts ? &draft_policy(m) : nullptr;
  const int FC = m.cfg.C;
  int n_finished = 0;
  const auto started = Clock::now();
  for (int pass = 0; pass < max_passes && !active_.empty(); ++pass) {
    const int n = (int)active_.size();
    const auto t0 = Clock::now();
    if (feature())
      feature_drafts(*dm, policy);
    else
      copy_drafts(policy);
    row_len_.resize(n);
    row_max_.resize(n);
    tokens_.clear();
    for (int i = 0; i < n; ++i) {
      Row& r = rows_[active_[i]];
      const int L = lens_[i];
      tokens_.push_back(r.last);
      if (L > 0) {
        const int32_t* d = feature() ? proposed_.data() + (size_t)i * steps_ : r.copy.src + start_[i];
        tokens_.insert(tokens_.end(), d, d + L);
      }
      if (!feature() && policy == nullptr && L == 0) start_[i] = kNoCopy;
      row_len_[i] = 1 + L;
      row_max_[i] = r.max_len;
    }
    const size_t total = tokens_.size();
    choice_.resize(total);
    score_.resize(total);
    if (feature()) feats_.resize(total * FC);
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
    a.choice = choice_.data();
    a.score = score_.data();
    a.n_emit = n_emit_.data();
    a.n_match = n_match_.data();
    a.done = done_.data();
    a.feats = feature() ? feats_.data() : nullptr;
    const auto t1 = Clock::now();
    stats_.loop.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    if (run_fault_token >= 0)
      for (int i = 0; i < n; ++i) {
        const auto& src = rows_[active_[i]].src;
        if (std::find(src.begin(), src.end(), run_fault_token) != src.end())
          throw std::runtime_error("injected fault: a row's source holds the fault token");
      }
    // (rows fit: a draft never reaches beyond the row's max_len, its cache holds max_len + 2 positions)
    if (verify_pass(m, st_, a) != 0) throw std::logic_error("a running batch's row does not fit its cache");
    if (policy != nullptr) {
      policy->cost.observe((int)total, ms_since(t1));
      for (int i = 0; i < n; ++i) policy->acceptance.observe(cand_[i].resynced, cand_[i].conf, lens_[i], n_match_[i]);
    }
    if (policy != nullptr) {
      int emitted = 0;
      bool drafted = false;
      for (int i = 0; i < n; ++i) emitted += n_emit_[i], drafted |= lens_[i] > 0;
      realized_pass(policy, n, feature() ? steps_ > 0 : drafted, emitted, t0);
    }
    stats_.loop.passes += 1;
    stats_.loop.sentence_passes += n;
    stats_.pass_rows[std::min(n, kRunRowsHist - 1)] += 1;
    int kept = 0;
    for (int i = 0, o = 0; i < n; o += row_len_[i++]) {
      const int slot = active_[i];
      Row& r = rows_[slot];
      r.passes += 1;
      stats_.loop.count(lens_[i], n_match_[i]);
      stats_.emitted += n_emit_[i];
      r.out.insert(r.out.end(), choice_.begin() + o, choice_.begin() + o + n_emit_[i]);
      r.scores.insert(r.scores.end(), score_.begin() + o, score_.begin() + o + n_emit_[i]);
      if (done_[i]) {
        r.state = kFinished;
        if (n_finished < cap) finished[n_finished] = slot;
        ++n_finished;
        continue;
      }
      r.last = r.out.back();
      if (feature()) {  // the drafter reads the emitted tokens with the features that chose them next time
        r.fresh.insert(r.fresh.end(), choice_.begin() + o, choice_.begin() + o + n_emit_[i]);
        r.fresh_feats.insert(r.fresh_feats.end(), feats_.begin() + (size_t)o * FC,
                             feats_.begin() + (size_t)(o + n_emit_[i]) * FC);
      } else {
        r.copy.update(start_[i], lens_[i], n_match_[i], r.last);
      }
      active_[kept++] = slot;
    }
    active_.resize(kept);
    if (min_ms > 0 && ms_since(started) < min_ms) continue;  // (a wake stays set for the next pass)
    if (n_finished > 0 || wake_.exchange(false, std::memory_order_acq_rel)) break;
  }
  return std::min(n_finished, cap);
}

int RunningBatch::take(int slot, int32_t* tokens, float* scores, int cap, int32_t* passes) {
  if (slot < 0 || slot >= (int)rows_.size() || rows_[slot].state != kFinished) return -1;
  Row& r = rows_[slot];
  const int k = std::min((int)r.out.size(), cap);
  std::copy(r.out.begin(), r.out.begin() + k, tokens);
  std::copy(r.scores.begin(), r.scores.begin() + k, scores);
  *passes = r.passes;
  r.state = kFree;
  st_.sents[slot] = Sentence();  // its caches go
  if (feature()) dst_.sents[slot] = Sentence();
  r.fresh.clear();
  r.fresh_feats.clear();
  free_.push_back(slot);
  stats_.left += 1;
  return k;
}

int RunningBatch::drop(int slot) {
  if (slot < 0 || slot >= (int)rows_.size() || rows_[slot].state != kActive) return -1;
  active_.erase(std::find(active_.begin(), active_.end(), slot));
  Row& r = rows_[slot];
  r.state = kFree;
  r.out.clear();
  r.scores.clear();
  r.fresh.clear();
  r.fresh_feats.clear();
  st_.sents[slot] = Sentence();
  if (feature()) dst_.sents[slot] = Sentence();
  free_.push_back(slot);
  stats_.dropped += 1;
  return 0;
}

}  // namespace fa
