// Beam search (see beam_search.h).  Each hypothesis has a cache slot of its
// own and reads its sentence's encoder keys and values (Sentence::enc).  A
// step reads the hypotheses that have features for it (a draft's later
// positions), then the others' candidates could still reach the beam get one
// decoder pass together, over their last token and their draft.  After the
// choice a child that extends its parent by the drafted token keeps the
// parent's slot (the draft's positions are in it); otherwise a parent's first
// child keeps it, and its other children copy its positions so far into a
// slot a childless parent left.
#include "beam/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "beam/beam_candidates.h"
#include "beam/beam_slots.h"
#include "loop/copy_source.h"
#include "model/stages.h"

namespace fa {

#if defined(FA_TEST_HOOKS)
int beam_mutant = 0;  // fa_set_beam_mutant (testing/test_api.cpp): a broken rule, for the tests to catch
#endif

namespace {

// whether the test library runs broken rule n (never in the engine decoding loads)
inline bool mutant(int n) {
#if defined(FA_TEST_HOOKS)
  return beam_mutant == n;
#else
  (void)n;
  return false;
#endif
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Ended {
  std::vector<int32_t> tokens;
  std::vector<float> positional;
  float score;
};

// The features a hypothesis's logits come from, while a pass computed them:
// this step's at row `at` of the pass's final features; the drafted tokens
// still ahead continue it, next[ahead] with its features at row at + 1.
struct Chain {
  std::shared_ptr<const std::vector<float>> feats;  // null: none (a pass is needed)
  int at = 0;
  std::vector<int32_t> next;
  int ahead = 0;

  bool extends(int32_t t) const {
    return feats && ahead < (int)next.size() && (next[ahead] == t || mutant(1));  // 1: any token
  }
};

// one sentence's beam
struct Beam {
  int b = 0;                              // the sentence in the encoded state
  std::vector<int> slot;                  // hypothesis i's cache slot
  std::vector<std::vector<int32_t>> toks; // hypothesis i's tokens: first, then one per step
  std::vector<std::vector<float>> cum;    // its cumulative scores, one per step
  std::vector<char> ignore;               // fairseq's cands_to_ignore (by candidate position)
  std::vector<Chain> chain;               // its features for this step, if a pass has them
  std::vector<int> copy;                  // the source position its next token would copy, or kNoCopy
  CopySource source;
  std::vector<Candidate> cands;           // this step's candidates so far
  std::vector<Ended> ended;
  bool done = false;
};

// a hypothesis to read: features (C floats) of hypothesis i of beams_[beam]
struct Read {
  int beam, i;
  const float* feats;
};

class BeamSearch {
 public:
  BeamSearch(Decoder& m, State& st, const BeamArgs& a, BeamCounts& n)
      : m_(m), st_(st), a_(a), n_(n), V_(m.cfg.tgt_vocab) {
    for (int t = 0; t < m.pool.size(); ++t) scans_.emplace_back(a, m.cfg.tgt_vocab, m.cfg.pad, m.cfg.unk, m.cfg.eos);
  }

  int run() {
    const int B = (int)st_.sents.size(), K = a_.beam;
    if (K < 1 || a_.nbest < 1 || a_.nbest > K || a_.max_len < 1 || a_.min_len < 0 || a_.min_len > a_.max_len ||
        a_.no_repeat_ngram < 0 || !(a_.temperature > 0.f) || st_.shortlist || 2 * K > V_ || a_.first < 0 ||
        a_.first >= V_)
      return -1;
    if (a_.src && (a_.max_draft < 0 || a_.ngram_min < 1 || a_.ngram_max < a_.ngram_min || a_.draft_hyps < 0)) return -1;
    // every step's position within the target position table (a sinusoidal one is a table too)
    if (!m_.w.tgt_pos.empty() && a_.max_len + 1 > (int)(m_.w.tgt_pos.size() / m_.cfg.C)) return -1;
    for (const Sentence& s : st_.sents)
      if (s.len != 0) return -1;
    if (a_.src)
      for (int b = 0; b < B; ++b)
        if (a_.src_len[b] < 0) return -1;
    hs_.sents.resize((size_t)B * K);
    beams_.resize(B);
    const int32_t* src = a_.src;
    for (int b = 0; b < B; ++b) {
      Beam& bm = beams_[b];
      bm.b = b;
      bm.slot.resize(K);
      bm.toks.assign(K, std::vector<int32_t>{a_.first});
      bm.cum.assign(K, {});
      bm.ignore.assign(K, 0);
      bm.chain.assign(K, {});
      if (src) {
        bm.source.start(src, a_.src_len[b]);
        src += a_.src_len[b];
      }
      bm.copy.assign(K, bm.source.ptr);
      for (int i = 0; i < K; ++i) {
        bm.slot[i] = b * K + i;
        Sentence& h = hs_.sents[(size_t)b * K + i];
        h.src_len = st_.sents[b].src_len;
        h.enc = &st_.sents[b];
      }
    }
    for (int step = 0; step <= a_.max_len; ++step) {
      if (!decode_step(step)) break;
    }
    write_out();
    return 0;
  }

 private:
  Decoder& m_;
  State& st_;
  const BeamArgs& a_;
  BeamCounts& n_;
  const int V_;
  std::vector<CandidateScan> scans_;          // one per pool thread (each holds one row's scratch)
  std::vector<std::vector<Candidate>> found_;  // per read row: its candidates
  State hs_;  // the hypotheses' slots
  std::vector<Beam> beams_;

  // One step: the hypotheses with features read, then one pass for those
  // that need one, then each sentence's candidates, ended hypotheses and next
  // beam.  False once every sentence is done.
  bool decode_step(int step) {
    std::vector<Read> reads;
    for (Beam& bm : beams_) {
      if (bm.done) continue;
      ++n_.steps;
      bm.cands.clear();
      for (int i = 0; i < rows(step); ++i) {
        const Chain& c = bm.chain[i];
        if (c.feats) reads.push_back({bm.b, i, c.feats->data() + (size_t)c.at * m_.cfg.C});
      }
    }
    n_.drafted += (int64_t)reads.size();
    // the others: one pass, then every hypothesis' logits in one projection
    std::vector<Read> need;
    for (const Beam& bm : beams_) {
      if (bm.done) continue;
      const size_t before = need.size();
      for (int i = 0; i < rows(step); ++i)
        if (!bm.chain[i].feats) need.push_back({bm.b, i, nullptr});
      n_.replayed += need.size() == before;
    }
    if (!need.empty()) pass(need, step);
    reads.insert(reads.end(), need.begin(), need.end());
    read(reads, step);
    bool live = false;
    for (Beam& bm : beams_) {
      if (bm.done) continue;
      choose(bm, step);
      live = live || !bm.done;
    }
    return live;
  }

  // fairseq's first step reads the first hypothesis only
  int rows(int step) const { return step == 0 ? 1 : a_.beam; }
  int cand_count(int step) const { return std::min(2 * a_.beam, rows(step) * V_ - 1); }

  // The hypotheses' logits from their features, and their candidates into their beams
  void read(const std::vector<Read>& reads, int step) {
    const int n = (int)reads.size(), C = m_.cfg.C;
    if (n == 0) return;
    n_.reads += n;
    std::vector<int32_t> sent(n);
    {
      StageClock c(Stage::kProjection);
      ensure(m_.h, (size_t)n * C);
      for (int r = 0; r < n; ++r) {
        std::copy(reads[r].feats, reads[r].feats + C, m_.h.data() + (size_t)r * C);
        sent[r] = beams_[reads[r].beam].slot[reads[r].i];
      }
      ensure(m_.logits, (size_t)n * V_);
      project(m_, hs_, m_.h.data(), n, sent.data(), m_.logits.data());
    }
    StageClock c(Stage::kChoose);
    // rows in contiguous shares, one per thread when there is enough work;
    // each row's candidates depend on that row alone and join their beam in
    // row order, so the split changes no value and no order
    if ((int)found_.size() < n) found_.resize(n);
    const int shares = (m_.pool.size() > 1 && (int64_t)n * V_ >= 16384) ? std::min(n, m_.pool.size()) : 1;
    m_.pool.run(
        [&](int t) {
          for (int r = (int)((int64_t)n * t / shares); r < (int)((int64_t)n * (t + 1) / shares); ++r) {
            const Beam& bm = beams_[reads[r].beam];
            const int i = reads[r].i;
            found_[r].clear();
            scans_[t].row(m_.logits.data() + (size_t)r * V_, bm.toks[i], i, step == 0 ? 0.f : bm.cum[i][step - 1],
                          step, cand_count(step), found_[r]);
          }
        },
        shares);
    for (int r = 0; r < n; ++r) {
      std::vector<Candidate>& to = beams_[reads[r].beam].cands;
      to.insert(to.end(), found_[r].begin(), found_[r].end());
    }
  }

  // hypothesis i's draft at `step`: the copy source from its copy position on
  void draft(const Beam& bm, int i, int step, std::vector<int32_t>& out) const {
    out.clear();
    if (!a_.src || a_.max_draft == 0) return;
    if (i >= a_.draft_hyps) return;
    int start = bm.copy[i];
    if (start == kNoCopy) {
      const std::vector<int32_t> emitted(bm.toks[i].begin() + 1, bm.toks[i].end());
      start = bm.source.resync(emitted, a_.ngram_min, a_.ngram_max);
    }
    if (start == kNoCopy) return;
    const int n = std::min({a_.max_draft, bm.source.len - start, a_.max_len - step});
    for (int j = 0; j < n && bm.source.src[start + j] != m_.cfg.eos; ++j) out.push_back(bm.source.src[start + j]);
  }

  // One decoder pass over the hypotheses `need` (each: its last token, then
  // its draft); each gets a chain of the pass's features, its reads' feats set
  void pass(std::vector<Read>& need, int step) {
    const int n = (int)need.size(), C = m_.cfg.C;
    std::vector<int32_t> sent(n), row_len(n), tokens;
    std::vector<std::vector<int32_t>> drafts(n);
    std::vector<int> off(n + 1, 0);
    int max_keys = 0;
    for (int r = 0; r < n; ++r) {
      const Beam& bm = beams_[need[r].beam];
      const int i = need[r].i, s = bm.slot[i];
      if (hs_.sents[s].len != step && !mutant(3) && !mutant(4))
        throw std::logic_error("beam search: a hypothesis' cache is not at its step");
      draft(bm, i, step, drafts[r]);
      sent[r] = s;
      row_len[r] = 1 + (int)drafts[r].size();
      tokens.push_back(bm.toks[i][step]);
      tokens.insert(tokens.end(), drafts[r].begin(), drafts[r].end());
      off[r + 1] = off[r] + row_len[r];
      if (hs_.sents[s].len + row_len[r] > a_.max_len + 1)
        throw std::logic_error("beam search: a pass beyond the hypotheses' length limit");
      fit_slot(m_, hs_.sents[s], hs_.sents[s].len + row_len[r], a_.max_len + 1);
      max_keys = std::max(max_keys, std::max(hs_.sents[s].len + row_len[r], hs_.sents[s].src_len));
    }
    decoder_rows(m_, hs_, n, sent.data(), row_len.data(), tokens.data(), off, max_keys, nullptr);
    ++n_.passes;
    n_.positions += off[n];
    auto feats = std::make_shared<std::vector<float>>(m_.x.data(), m_.x.data() + (size_t)off[n] * C);
    for (int r = 0; r < n; ++r) {
      Beam& bm = beams_[need[r].beam];
      const int i = need[r].i;
      hs_.sents[sent[r]].len += row_len[r];
      bm.chain[i] = Chain{feats, off[r], std::move(drafts[r]), 0};
      need[r].feats = feats->data() + (size_t)off[r] * C;
    }
  }

  void choose(Beam& bm, int step) {
    const int K = a_.beam, cand_size = 2 * K, k = cand_count(step);
    std::vector<Candidate>& cands = bm.cands;
    std::sort(cands.begin(), cands.end(), better);
    cands.resize(std::min<size_t>(cands.size(), k));
    const int nc = (int)cands.size(), eos = m_.cfg.eos;
    std::vector<char> is_eos(nc);
    for (int j = 0; j < nc; ++j) is_eos[j] = cands[j].flat % V_ == eos && cands[j].val != kNegInf;
    // EOS among the first beam candidates (not at an ignored position) ends a hypothesis
    for (int j = 0; j < std::min(K, nc); ++j) {
      if (!is_eos[j] || bm.ignore[j]) continue;
      if ((int)bm.ended.size() >= K) continue;
      const int h = cands[j].flat / V_;
      Ended e;
      e.tokens.assign(bm.toks[h].begin() + 1, bm.toks[h].end());
      e.tokens.push_back(eos);
      std::vector<float> c(bm.cum[h].begin(), bm.cum[h].begin() + step);
      c.push_back(cands[j].val);
      e.positional.resize(c.size());
      e.positional[0] = c[0];
      for (size_t t = 1; t < c.size(); ++t) e.positional[t] = c[t] - c[t - 1];
      e.score = a_.normalize ? cands[j].val / (float)std::pow((double)(step + 1), (double)a_.len_penalty)
                             : cands[j].val;
      bm.ended.push_back(std::move(e));
    }
    if ((int)bm.ended.size() >= K || step >= a_.max_len) {
      bm.done = true;
      bm.chain.clear();
      return;
    }
    // the next beam: the first K candidates not ending (fairseq's active_mask)
    std::vector<int> key(nc);
    for (int j = 0; j < nc; ++j) {
      const bool excluded = is_eos[j] || (j < K && bm.ignore[j]);
      key[j] = (excluded ? cand_size : 0) + j;
    }
    std::vector<int> order(nc);
    for (int j = 0; j < nc; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return key[x] < key[y]; });
    std::vector<int> parent(K), token(K);
    std::vector<char> extends(K);
    for (int i = 0; i < K; ++i) {
      parent[i] = cands[order[i]].flat / V_;
      token[i] = cands[order[i]].flat % V_;
      extends[i] = bm.chain[parent[i]].extends(token[i]);
      bm.ignore[i] = key[order[i]] >= cand_size;
    }
    // slots: the child on its parent's draft keeps the parent's slot, else its
    // first child does; the others copy the positions so far into a childless parent's
    std::vector<int> new_slot(K, -1), free_slots;
    std::vector<char> kept(K, 0);
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < K; ++i)
        if ((pass == 1 || (extends[i] && !mutant(4))) && new_slot[i] < 0 && !kept[parent[i]]) {  // 4: first child
          kept[parent[i]] = 1;
          new_slot[i] = bm.slot[parent[i]];
        }
    for (int h = 0; h < K; ++h)
      if (!kept[h]) free_slots.push_back(bm.slot[h]);
    for (int i = 0, f = 0; i < K; ++i)
      if (new_slot[i] < 0) {
        new_slot[i] = free_slots[f++];
        copy_slot(m_, hs_.sents[bm.slot[parent[i]]], hs_.sents[new_slot[i]], step + 1, a_.max_len + 1);
      }
    for (int i = 0; i < K; ++i)
      if (!extends[i] && !mutant(3)) hs_.sents[new_slot[i]].len = step + 1;  // a draft's positions beyond: not its
    std::vector<std::vector<int32_t>> toks(K);
    std::vector<std::vector<float>> cum(K);
    std::vector<Chain> chain(K);
    std::vector<int> copy(K, kNoCopy);
    for (int i = 0; i < K; ++i) {
      const int p = parent[i];
      toks[i] = bm.toks[p];
      toks[i].push_back(token[i]);
      cum[i].assign(bm.cum[p].begin(), bm.cum[p].begin() + step);
      cum[i].push_back(cands[order[i]].val);
      if (extends[i]) {
        const Chain& c = bm.chain[p];
        chain[i] = Chain{c.feats, mutant(2) ? c.at : c.at + 1, c.next, c.ahead + 1};  // 2: the parent's row again
      }
      const int at = bm.copy[p];  // the copy goes on where the token is the source's next one
      if (at != kNoCopy && bm.source.src[at] == token[i] && at + 1 < bm.source.len) copy[i] = at + 1;
    }
    bm.toks.swap(toks);
    bm.cum.swap(cum);
    bm.slot.swap(new_slot);
    bm.chain.swap(chain);
    bm.copy.swap(copy);
  }

  void write_out() {
    const int W = a_.max_len + 1;
    for (const Beam& bm : beams_) {
      std::vector<int> order(bm.ended.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = (int)i;
      std::stable_sort(order.begin(), order.end(),
                       [&](int x, int y) { return bm.ended[x].score > bm.ended[y].score; });
      for (int i = 0; i < a_.nbest; ++i) {
        const size_t row = (size_t)bm.b * a_.nbest + i;
        if (i >= (int)order.size()) {
          a_.n_out[row] = -1;
          continue;
        }
        const Ended& e = bm.ended[order[i]];
        a_.n_out[row] = (int)e.tokens.size();
        a_.score[row] = e.score;
        std::copy(e.tokens.begin(), e.tokens.end(), a_.tokens + row * W);
        std::copy(e.positional.begin(), e.positional.end(), a_.positional + row * W);
      }
    }
  }
};

}  // namespace

int decode_beam(Decoder& m, State& st, const BeamArgs& a, BeamCounts* counts) {
  BeamCounts n{};
  const int rc = BeamSearch(m, st, a, n).run();
  if (counts) *counts = n;
  return rc;
}

}  // namespace fa
