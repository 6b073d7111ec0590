// The verification pass (see pass.h), in steps: lay out the rows and their branches, run the
// decoder over them, then in rounds project the positions still on a matching path, choose
// greedy's token there and accept along each branch; finally per row keep the branch that
// accepted most, emit its tokens and scores, and commit its keys and values to the cache.
#include "model/pass.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "cpu/ops.h"
#include "model/score_rules.h"
#include "model/screen.h"
#include "model/stages.h"

namespace fa {

namespace {

constexpr int kMinGroupPositions = 16;  // the fewest a group of rows verifies together (group_positions)

// projection weight bytes beyond which a pass projects a path at once (eager_ below)
#if defined(FA_TEST_HOOKS)
size_t eager_projection_bytes(const Decoder& m) { return m.eager_projection_bytes; }
#else
constexpr size_t eager_projection_bytes(const Decoder&) { return kEagerProjectionBytes; }
#endif
#if defined(FA_TEST_HOOKS)
bool screen_on(const Decoder& m) { return m.screen_on; }
#else
constexpr bool screen_on(const Decoder&) { return true; }
#endif

// Whether a pass may project through the screen (screen.h): it keeps no score but
// the last token's confidence (whose log-normaliser then sums the screen's logits
// where the float ones were not computed), it chooses greedy's first maximum
// (GAD++'s top-beta rule reads every logit; a temperature's division could tie
// two logits), and it projects to the whole vocabulary
bool screens(const Decoder& m, const State& st, const PassArgs& a) {
  return m.w.screen.ready() && screen_on(m) && !st.shortlist && a.scores != kScoresAll && a.beta <= 1 &&
         a.temperature == 1.f;
}

class Pass {
 public:
  Pass(Decoder& m, State& st, const PassArgs& a)
      : m_(m),
        st_(st),
        a_(a),
        rules_{m.cfg.pad, m.cfg.unk, m.cfg.eos, a.max_len, a.min_len, a.unk_penalty, a.has_forced ? a.forced : -1},
        eager_((st.shortlist ? m.sl_common.bytes() : m.w.proj.bytes()) > eager_projection_bytes(m)),
        screen_(screens(m, st, a)) {}

  int run() {
    StageClock clock(Stage::kPass);
    if (!layout()) return -1;
    decoder_rows(m_, st_, a_.n, a_.sent, a_.row_len, a_.tokens, off_, max_keys_, nullptr,
                 tree_ ? bstart_.data() : nullptr);
    const int G = group_positions();
    for (int r0 = 0, r1; r0 < a_.n; r0 = r1) {
      for (r1 = r0 + 1; r1 < a_.n && off_[r1 + 1] - off_[r0] <= G;) ++r1;
      verify_rows(r0, r1);
    }
    return 0;
  }

 private:
  Decoder& m_;
  State& st_;
  const PassArgs& a_;
  const ScoreRules rules_;
  bool tree_ = false;
  const bool eager_;  // project every position of a path in its first round
  const bool screen_;  // project through the screen (screens)
  int max_keys_ = 0, arena_ = 0, r0_ = 0, r1_ = 0;  // [r0_, r1_): the rows verified now (verify_rows)
  // rows: flat positions off[r] .. off[r + 1]; branches first_branch[r] .. first_branch[r + 1]
  std::vector<int> off_, first_branch_;
  // branches: their row, first row position, length; per flat position of a
  // tree row, the row position its branch starts at
  std::vector<int> row_of_, b_start_, b_len_;
  std::vector<int32_t> bstart_;
  // per branch: path positions checked, drafted tokens accepted, still matching
  std::vector<int> checked_, matched_, open_;
  // per flat position: its logits row in m.logits (-1: not projected), queued,
  // greedy's column and token there
  std::vector<int> at_, queued_, column_;
  std::vector<int32_t> chosen_;
  // the positions rows emit from and their log-normalisers (normalizers)
  std::vector<int> emit_at_;
  std::vector<float> lse_;

  Sentence& sentence(int r) { return st_.sents[a_.sent[r]]; }
  // the score rules of row r (its own max_len where the pass gives one per row)
  ScoreRules rules(int r) const {
    ScoreRules rr = rules_;
    if (a_.row_max_len != nullptr) rr.max_len = a_.row_max_len[r];
    return rr;
  }
  int row_at(int p) const { return (int)(std::upper_bound(off_.begin(), off_.end(), p) - off_.begin()) - 1; }
  // flat position of path index j of branch i: the last token, then the branch
  int path(int i, int j) const { return off_[row_of_[i]] + (j == 0 ? 0 : b_start_[i] + j - 1); }
  // the output position (from the sentence's length) that flat position p of row r predicts
  int out_step(int r, int p) const {
    const int t = p - off_[r];
    return tree_ && t > 0 ? t - bstart_[p] + 1 : t;
  }
  float* logits_at(int p) { return m_.logits.data() + (size_t)at_[p] * m_.cfg.tgt_vocab; }

  // Offsets of rows and branches; false if a row does not fit its cache or its branches do not add up
  bool layout() {
    const int n = a_.n;
    // a forced token is a column: a vocabulary's, not a shortlist's
    if (a_.has_forced && (st_.shortlist || a_.forced < 0 || a_.forced >= m_.cfg.tgt_vocab)) return false;
    if (a_.scores < kScoresAll || a_.scores > kScoresNone) return false;
    off_.assign(n + 1, 0);
    first_branch_.assign(n + 1, 0);
    for (int r = 0, k = 0; r < n; ++r) {
      const Sentence& s = sentence(r);
      const int len = a_.row_len[r];
      if (len < 1 || s.len + len > s.cap) return false;
      const int nb = a_.n_branch ? a_.n_branch[r] : 1;
      if (nb < 1) return false;
      tree_ = tree_ || nb > 1;
      int used = 1;
      for (int i = 0; i < nb; ++i) {
        const int L = a_.n_branch ? a_.branch_len[k++] : len - 1;
        if (L < 0 || (nb > 1 && L < 1)) return false;
        b_start_.push_back(used);
        b_len_.push_back(L);
        row_of_.push_back(r);
        used += L;
      }
      if (used != len) return false;
      first_branch_[r + 1] = (int)b_start_.size();
      off_[r + 1] = off_[r] + len;
      max_keys_ = std::max(max_keys_, std::max(s.len + len, s.src_len));
    }
    const int M = off_[n], NB = (int)b_start_.size();
    if (tree_) {
      bstart_.assign(M, 0);
      for (int i = 0; i < NB; ++i)
        for (int t = 0; t < b_len_[i]; ++t) bstart_[off_[row_of_[i]] + b_start_[i] + t] = b_start_[i];
    }
    checked_.assign(NB, 0);
    matched_.assign(NB, 0);
    open_.assign(NB, 1);
    at_.assign(M, -1);
    queued_.assign(M, 0);
    column_.assign(M, 0);
    chosen_.assign(M, 0);
    return true;
  }

  // Rows [r0, r1) verified and emitted, their logits from the arena's start
  // (rows are independent: a group never changes a result)
  void verify_rows(int r0, int r1) {
    r0_ = r0;
    r1_ = r1;
    arena_ = 0;
    std::vector<int> todo;
    for (int round = 0;; ++round) {
      next_positions(round, todo);
      if (todo.empty()) break;
      {
        StageClock c(Stage::kProjection);
        project(todo);
      }
      {
        StageClock c(Stage::kChoose);
        choose(todo);
      }
      accept();
    }
    StageClock c(Stage::kEmit);
    const auto t0 = std::chrono::steady_clock::now();
    normalizers();
    if (a_.lse_ns != nullptr) *a_.lse_ns += std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count();
    for (int r = r0; r < r1; ++r) {
      const int w = winner(r);
      commit(r, w, emit(r, w));
    }
  }

  // The most positions a group of rows verifies together (a row is never split): those whose
  // logits take the projection's weight bytes, at least kMinGroupPositions.  Logits are written,
  // then read for the choice and the scores; beyond L2 (64 rows of the int8 9+3: 2.2 MB against
  // 1.1 MB of weights) they would go to L3 (1.01-1.02x at 128 rows with the attention's prefetch).
  int group_positions() const {
    const Linear& proj = st_.shortlist ? m_.sl_common : m_.w.proj;
    const size_t per_position = (size_t)std::max(1, proj.N) * sizeof(float);
    return std::max<int>(kMinGroupPositions, (int)((proj.bytes() + per_position - 1) / per_position));
  }

  // The next chunk of each open branch's path, sorted (grouped by row).  With
  // projection weights that stay in a core's L2 (small models: at d=128 up to
  // 8,192 words in int8, 2,048 in float32), its first position (the last token,
  // which a tree row's branches share), then 8, 16, 32, ... positions: a draft is often
  // rejected at its first token (after an edit, IAD's copy), a position past a
  // rejection needs no projection, and there the projection is bound by
  // arithmetic, so each position skipped is saved.  With larger projection
  // weights (eager_), the whole path in one round: the weights are read once
  // for every position, not again from L3 or memory (d=512 float32: a pass over
  // 5 positions from 1.40 to 1.16-1.20 steps).  The 9+3's 8,424 words at d=128
  // are just beyond in both precisions; there whole IAD decodes took the same
  // time either way (Zen 4, 1 thread, 300 sentences, alternating rounds), where
  // d=512 int8 in chunks was 1-10% slower.  Rows are independent in the
  // kernels, so the chunks never change a result.
  void next_positions(int round, std::vector<int>& todo) {
    todo.clear();
    for (int i = first_branch_[r0_]; i < first_branch_[r1_]; ++i) {
      if (!open_[i]) continue;
      const int sz = round == 0 ? (eager_ ? b_len_[i] + 1 : 1) : 8 << std::min(round - 1, 20);
      for (int j = checked_[i]; j < std::min(b_len_[i] + 1, checked_[i] + sz); ++j) {
        const int p = path(i, j);
        if (at_[p] < 0 && !queued_[p]) {
          queued_[p] = 1;
          todo.push_back(p);
        }
      }
    }
    std::sort(todo.begin(), todo.end());
  }

  // The logits of the positions todo (appended to m.logits)
  void project(const std::vector<int>& todo) {
    const int C = m_.cfg.C, cnt = (int)todo.size();
    const float* x = m_.x.data();
    ensure(m_.h, (size_t)cnt * C);
    std::vector<int32_t> sent_of(cnt);
    for (int k = 0; k < cnt; ++k) {
      std::copy(x + (size_t)todo[k] * C, x + (size_t)(todo[k] + 1) * C, m_.h.data() + (size_t)k * C);
      at_[todo[k]] = arena_ + k;
      sent_of[k] = a_.sent[row_at(todo[k])];
    }
    ensure(m_.logits, (size_t)(arena_ + cnt) * m_.cfg.tgt_vocab);
    float* out = m_.logits.data() + (size_t)arena_ * m_.cfg.tgt_vocab;
    if (screen_)
      project_screened(m_, m_.h.data(), cnt, out);
    else
      fa::project(m_, st_, m_.h.data(), cnt, sent_of.data(), out);
    arena_ += cnt;
  }

  // greedy's choice at each position of todo (after the temperature)
  void choose(const std::vector<int>& todo) {
    for (int p : todo) {
      const int r = row_at(p);
      const Sentence& s = sentence(r);
      const int W = columns(m_, st_, s);
      float* lg = logits_at(p);
      if (a_.temperature != 1.f)
        for (int v = 0; v < W; ++v) lg[v] = lg[v] / a_.temperature;
      const int u = rules(r).choose(lg, W, s.len + out_step(r, p));
      column_[p] = u;
      chosen_[p] = token_of_column(m_, st_, s, u);
    }
  }

  // GAD++: whether the drafted token tok passes at flat position p of row r (beta > 1)
  bool rank_pass(int r, int p, int tok) {
    const Sentence& s = sentence(r);
    const int col = column_of(m_, st_, s, tok);
    if (col < 0) return false;
    const int W = columns(m_, st_, s), out_pos = s.len + out_step(r, p);
    const float* lg = logits_at(p);
    const ScoreRules rr = rules(r);
    const float a = rr.adjusted(lg, col, out_pos);
    if (a == kNegInf || a < rr.adjusted(lg, column_[p], out_pos) - a_.tau) return false;
    int better = 0;
    for (int v = 0; v < W && better < a_.beta; ++v) better += rr.adjusted(lg, v, out_pos) > a;
    return better < a_.beta;
  }

  // walk each open branch as far as its projected positions go
  void accept() {
    for (int i = first_branch_[r0_]; i < first_branch_[r1_]; ++i) {
      while (open_[i] && checked_[i] <= b_len_[i] && at_[path(i, checked_[i])] >= 0) {
        const int j = checked_[i]++;
        const int p = path(i, j), r = row_of_[i];
        const int drafted = j < b_len_[i] ? a_.tokens[off_[r] + b_start_[i] + j] : -1;
        if (j < b_len_[i] && (a_.beta > 1 ? rank_pass(r, p, drafted) : chosen_[p] == drafted))
          matched_[i] = j + 1;
        else
          open_[i] = 0;
      }
      if (checked_[i] > b_len_[i]) open_[i] = 0;
    }
  }

  // the branch of row r that accepted most (the first of equals)
  int winner(int r) const {
    int w = first_branch_[r];
    for (int i = first_branch_[r] + 1; i < first_branch_[r + 1]; ++i)
      if (matched_[i] > matched_[w]) w = i;
    return w;
  }

  // the token branch w of row r emits at path index j: an accepted drafted one, then greedy's choice
  int emitted(int r, int w, int j) const {
    return j < matched_[w] ? a_.tokens[off_[r] + b_start_[w] + j] : chosen_[path(w, j)];
  }
  // how many branch w of row r emits: its accepted tokens and the one after, cut after EOS
  int n_emitted(int r, int w) const {
    for (int j = 0; j < matched_[w]; ++j)
      if (emitted(r, w, j) == m_.cfg.eos) return j + 1;
    return matched_[w] + 1;
  }
  // whether the j-th of ne emitted tokens gets its score (PassArgs::scores)
  bool scored(int j, int ne) const { return a_.scores == kScoresAll || (a_.scores == kScoresLast && j == ne - 1); }

  // The log-normaliser (logsumexp over the row's columns) of each position a row emits a scored token
  // from, into lse_[p], across the pool: each is one row's own sum in a fixed order, whichever thread sums it
  void normalizers() {
    std::vector<int>& todo = emit_at_;
    todo.clear();
    for (int r = r0_; r < r1_; ++r) {
      const int w = winner(r), ne = n_emitted(r, w);
      for (int j = 0; j < ne; ++j)
        if (scored(j, ne)) todo.push_back(path(w, j));
    }
    lse_.resize(off_[a_.n]);  // (only the positions in todo are read)
    const int n = (int)todo.size(), chunks = std::min(n, m_.pool.size() > 1 && n >= 8 ? m_.pool.size() : 1);
    m_.pool.run(
        [&](int c) {
          for (int k = (int)((int64_t)n * c / chunks); k < (int)((int64_t)n * (c + 1) / chunks); ++k) {
            const int p = todo[k], nc = columns(m_, st_, sentence(row_at(p)));
            lse_[p] = a_.scores == kScoresLast ? logsumexp_coarse(logits_at(p), nc) : logsumexp(logits_at(p), nc);
          }
        },
        chunks);
  }

  // Row r's outputs from branch w: its accepted tokens (the drafted ones,
  // greedy's choices unless beta > 1) and the choice at the first mismatch,
  // cut after EOS; their scores and features.  Returns the number emitted.
  int emit(int r, int w) {
    const Sentence& s = sentence(r);
    const int C = m_.cfg.C, o = off_[r], ne = n_emitted(r, w);
    const float* x = m_.x.data();
    const ScoreRules rr = rules(r);
    for (int j = 0; j < ne; ++j) {
      const int p = path(w, j), c = emitted(r, w, j);
      a_.choice[o + j] = c;
      a_.score[o + j] = std::numeric_limits<float>::quiet_NaN();
      if (scored(j, ne))  // (the log-normaliser: normalizers)
        a_.score[o + j] = rr.adjusted(logits_at(p), c == chosen_[p] ? column_[p] : column_of(m_, st_, s, c),
                                      s.len + j) - lse_[p];
      if (a_.feats != nullptr) std::copy(x + (size_t)p * C, x + (size_t)(p + 1) * C, a_.feats + (size_t)(o + j) * C);
    }
    a_.n_emit[r] = ne;
    a_.n_match[r] = matched_[w];
    a_.done[r] = emitted(r, w, ne - 1) == m_.cfg.eos;
    if (a_.winner != nullptr) a_.winner[r] = w - first_branch_[r];
    return ne;
  }

  // The sentence of row r grows by the ne emitted tokens; branch w's cache
  // entries move right after the last token (where a single branch already is)
  void commit(int r, int w, int ne) {
    Sentence& s = sentence(r);
    const int H = m_.cfg.H, D = m_.D;
    if (b_start_[w] != 1)
      for (int l = 0; l < (int)m_.w.dec.size(); ++l)
        for (int hh = 0; hh < H; ++hh) {
          float* ck = s.self_k.data() + kv_at(l, hh, 0, H, s.cap, D);
          float* cv = s.self_v.data() + kv_at(l, hh, 0, H, s.cap, D);
          for (int j = 0; j < ne - 1; ++j) {
            const size_t from = (size_t)(s.len + b_start_[w] + j) * D, to = (size_t)(s.len + 1 + j) * D;
            std::copy(ck + from, ck + from + D, ck + to);
            std::copy(cv + from, cv + from + D, cv + to);
          }
        }
    s.len += ne;
  }
};

}  // namespace

int verify_pass(Decoder& m, State& st, const PassArgs& a) { return Pass(m, st, a).run(); }

}  // namespace fa
