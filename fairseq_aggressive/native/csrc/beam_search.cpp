// Beam search (see beam_search.h).  Each hypothesis has a cache slot of its
// own and reads its sentence's encoder keys and values (Sentence::enc); one
// decoder pass per step over every live hypothesis of the batch; after the
// choice a hypothesis whose parent has no other child keeps the parent's slot,
// and only a parent's second and later children copy its cache into a slot a
// childless parent left.
#include "beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops.h"
#include "stages.h"

namespace fa {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Ended {
  std::vector<int32_t> tokens;
  std::vector<float> positional;
  float score;
};

// one sentence's beam
struct Beam {
  int b = 0;                              // the sentence in the encoded state
  std::vector<int> slot;                  // hypothesis i's cache slot
  std::vector<std::vector<int32_t>> toks; // hypothesis i's tokens: first, then one per step
  std::vector<std::vector<float>> cum;    // its cumulative scores, one per step
  std::vector<char> ignore;               // fairseq's cands_to_ignore (by candidate position)
  std::vector<Ended> ended;
  bool done = false;
};

struct Candidate {
  float val;
  int flat;  // hypothesis * V + token
};

// ranked best first: higher score, then the lower hypothesis and token
bool better(const Candidate& x, const Candidate& y) { return x.val > y.val || (x.val == y.val && x.flat < y.flat); }

class BeamSearch {
 public:
  BeamSearch(Model& m, State& st, const BeamArgs& a) : m_(m), st_(st), a_(a), V_(m.cfg.tgt_vocab) {}

  int run() {
    const int B = (int)st_.sents.size(), K = a_.beam;
    if (K < 1 || a_.nbest < 1 || a_.nbest > K || a_.max_len < 1 || a_.min_len < 0 || a_.min_len > a_.max_len ||
        a_.no_repeat_ngram < 0 || !(a_.temperature > 0.f) || st_.shortlist || 2 * K > V_ || a_.first < 0 ||
        a_.first >= V_)
      return -1;
    // every step's position within the target position table (a sinusoidal one is a table too)
    if (!m_.w.tgt_pos.empty() && a_.max_len + 1 > (int)(m_.w.tgt_pos.size() / m_.cfg.C)) return -1;
    for (const Sentence& s : st_.sents)
      if (s.len != 0) return -1;
    hs_.sents.resize((size_t)B * K);
    beams_.resize(B);
    for (int b = 0; b < B; ++b) {
      Beam& bm = beams_[b];
      bm.b = b;
      bm.slot.resize(K);
      bm.toks.assign(K, std::vector<int32_t>{a_.first});
      bm.cum.assign(K, {});
      bm.ignore.assign(K, 0);
      for (int i = 0; i < K; ++i) {
        bm.slot[i] = b * K + i;
        Sentence& h = hs_.sents[(size_t)b * K + i];
        h.src_len = st_.sents[b].src_len;
        h.enc = &st_.sents[b];
      }
    }
    skip_.assign(V_, 0);
    for (int step = 0; step <= a_.max_len; ++step) {
      if (!decode_step(step)) break;
    }
    write_out();
    return 0;
  }

 private:
  Model& m_;
  State& st_;
  const BeamArgs& a_;
  const int V_;
  State hs_;  // the hypotheses' slots
  std::vector<Beam> beams_;
  std::vector<Candidate> top_;  // one row's best so far
  std::vector<int> special_;    // one row's adjusted columns
  std::vector<char> skip_;      // per column: adjusted (valued apart from the scan)

  // room for `need` positions in slot s (the positions written kept)
  void fit(int s, int need) {
    Sentence& h = hs_.sents[s];
    if (need <= h.cap) return;
    const int nl = (int)m_.w.dec.size(), H = m_.cfg.H, D = m_.D;
    const int cap = std::min(std::max(need, std::max(16, 2 * h.cap)), a_.max_len + 1);
    LineVector<float> k((size_t)nl * H * cap * D), v((size_t)nl * H * cap * D);
    for (int l = 0; l < nl; ++l)
      for (int hh = 0; hh < H; ++hh) {
        const size_t from = kv_at(l, hh, 0, H, h.cap, D), to = kv_at(l, hh, 0, H, cap, D);
        std::copy(h.self_k.begin() + from, h.self_k.begin() + from + (size_t)h.len * D, k.begin() + to);
        std::copy(h.self_v.begin() + from, h.self_v.begin() + from + (size_t)h.len * D, v.begin() + to);
      }
    h.self_k.swap(k);
    h.self_v.swap(v);
    h.cap = cap;
  }

  // slot `to` becomes a copy of slot `from` (its positions so far)
  void copy_slot(int from, int to) {
    const Sentence& f = hs_.sents[from];
    fit(to, f.len);
    Sentence& t = hs_.sents[to];
    const int nl = (int)m_.w.dec.size(), H = m_.cfg.H, D = m_.D;
    for (int l = 0; l < nl; ++l)
      for (int hh = 0; hh < H; ++hh) {
        const size_t a = kv_at(l, hh, 0, H, f.cap, D), z = kv_at(l, hh, 0, H, t.cap, D);
        std::copy(f.self_k.begin() + a, f.self_k.begin() + a + (size_t)f.len * D, t.self_k.begin() + z);
        std::copy(f.self_v.begin() + a, f.self_v.begin() + a + (size_t)f.len * D, t.self_v.begin() + z);
      }
    t.len = f.len;
  }

  // One step: the decoder over every live hypothesis, then each sentence's
  // candidates, ended hypotheses and next beam.  False once every sentence is done.
  bool decode_step(int step) {
    std::vector<int32_t> sent, tokens, row_len;
    std::vector<int> row_beam;  // each row's sentence
    for (Beam& bm : beams_) {
      if (bm.done) continue;
      const int R = step == 0 ? 1 : a_.beam;  // fairseq's first step reads the first hypothesis only
      for (int i = 0; i < R; ++i) {
        sent.push_back(bm.slot[i]);
        tokens.push_back(bm.toks[i][step]);
        row_len.push_back(1);
        row_beam.push_back(bm.b);
      }
    }
    const int n = (int)sent.size();
    if (n == 0) return false;
    std::vector<int> off(n + 1);
    int max_keys = 0;
    for (int r = 0; r < n; ++r) {
      off[r + 1] = r + 1;
      fit(sent[r], hs_.sents[sent[r]].len + 1);
      max_keys = std::max(max_keys, std::max(hs_.sents[sent[r]].len + 1, hs_.sents[sent[r]].src_len));
    }
    decoder_rows(m_, hs_, n, sent.data(), row_len.data(), tokens.data(), off, max_keys, nullptr);
    for (int r = 0; r < n; ++r) hs_.sents[sent[r]].len += 1;
    const int C = m_.cfg.C;
    {
      StageClock c(Stage::kProjection);
      ensure(m_.h, (size_t)n * C);
      std::copy(m_.x.data(), m_.x.data() + (size_t)n * C, m_.h.data());
      ensure(m_.logits, (size_t)n * V_);
      project(m_, hs_, m_.h.data(), n, sent.data(), m_.logits.data());
    }
    StageClock c(Stage::kChoose);
    // per beam, its rows' log-probabilities, then its choice
    for (int r = 0; r < n;) {
      Beam& bm = beams_[row_beam[r]];
      int R = 0;
      while (r + R < n && row_beam[r + R] == bm.b) ++R;
      choose(bm, step, r, R);
      r += R;
    }
    for (const Beam& bm : beams_)
      if (!bm.done) return true;
    return false;
  }

  // Row `row`'s (hypothesis i of bm) k best candidates, best first, appended to
  // out: value (lg[v] - lse) (+ the hypothesis' score after step 0) as fairseq
  // adjusts it (pad never, unk pays unk_penalty, EOS not before min_len, only
  // EOS from max_len on, no repeated n-gram).  The scan skips a block of 16
  // columns whose largest logit cannot reach the k-th value so far (the value
  // rises with the logit); the few adjusted columns are valued apart.
  void row_candidates(const Beam& bm, int i, int row, int step, int k, std::vector<Candidate>& out) {
    float* lg = m_.logits.data() + (size_t)row * V_;
    if (a_.temperature != 1.f)
      for (int v = 0; v < V_; ++v) lg[v] = lg[v] / a_.temperature;
    const float lse = logsumexp(lg, V_);
    const float prev = step == 0 ? 0.f : bm.cum[i][step - 1];
    auto value = [&](float x) {
      x = x - lse;
      if (x != x) x = kNegInf;
      return step == 0 ? x : x + prev;
    };
    const int pad = m_.cfg.pad, unk = m_.cfg.unk, eos = m_.cfg.eos, base = i * V_;
    top_.clear();
    auto offer = [&](const Candidate& c) {
      if ((int)top_.size() == k && !better(c, top_.back())) return;
      top_.insert(std::upper_bound(top_.begin(), top_.end(), c, better), c);
      if ((int)top_.size() > k) top_.pop_back();
    };
    if (step >= a_.max_len) {  // only EOS; the other places go to the lowest ids at -inf
      offer({value(lg[eos]), base + eos});
      for (int v = 0; v < V_ && (int)top_.size() < k; ++v)
        if (v != eos) offer({kNegInf, base + v});
      out.insert(out.end(), top_.begin(), top_.end());
      return;
    }
    special_.clear();
    special_.push_back(pad);
    special_.push_back(unk);
    special_.push_back(eos);
    const int N = a_.no_repeat_ngram;
    if (N > 0 && step + 2 - N >= 0) {  // tokens that would repeat an n-gram of this hypothesis
      const std::vector<int32_t>& t = bm.toks[i];  // t[0 .. step]
      for (int s = 0; s < step + 2 - N; ++s)
        if (std::equal(t.begin() + s, t.begin() + s + N - 1, t.begin() + (step + 2 - N))) special_.push_back(t[s + N - 1]);
    }
    for (int v : special_) skip_[v] = 1;
    constexpr int kBlock = 16;
    for (int u = 0; u < V_; u += kBlock) {
      const int n = std::min(kBlock, V_ - u);
      if ((int)top_.size() == k && value(max_of(lg + u, n)) < top_.back().val) continue;
      for (int v = u; v < u + n; ++v)
        if (!skip_[v]) offer({value(lg[v]), base + v});
    }
    for (int v : special_) skip_[v] = 0;
    for (size_t j = 0; j < special_.size(); ++j) {
      const int v = special_[j];
      if (std::find(special_.begin(), special_.begin() + j, v) != special_.begin() + j) continue;  // once each
      const bool banned = std::find(special_.begin() + 3, special_.end(), v) != special_.end();
      float val;
      if (v == pad || banned || (v == eos && step < a_.min_len)) {
        val = kNegInf;
      } else if (v == unk) {  // fairseq: lprobs[unk] -= unk_penalty, then the hypothesis' score is added
        float x = lg[v] - lse;
        if (x != x) x = kNegInf;
        x = x - a_.unk_penalty;
        val = step == 0 ? x : x + prev;
      } else {
        val = value(lg[v]);
      }
      offer({val, base + v});
    }
    out.insert(out.end(), top_.begin(), top_.end());
  }

  void choose(Beam& bm, int step, int r0, int R) {
    const int K = a_.beam, cand_size = 2 * K;
    const int k = std::min(cand_size, R * V_ - 1);
    std::vector<Candidate> cands;
    cands.reserve((size_t)R * k);
    for (int i = 0; i < R; ++i) row_candidates(bm, i, r0 + i, step, k, cands);
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
    std::vector<int> parent(K), chosen(K);
    for (int i = 0; i < K; ++i) {
      chosen[i] = order[i];
      parent[i] = cands[order[i]].flat / V_;
      bm.ignore[i] = key[order[i]] >= cand_size;
    }
    // slots: a parent's first child keeps its slot, the others copy it into a childless parent's
    std::vector<int> new_slot(K, -1), free_slots;
    std::vector<char> kept(K, 0);
    for (int i = 0; i < K; ++i)
      if (!kept[parent[i]]) {
        kept[parent[i]] = 1;
        new_slot[i] = bm.slot[parent[i]];
      }
    for (int h = 0; h < K; ++h)
      if (!kept[h]) free_slots.push_back(bm.slot[h]);
    for (int i = 0, f = 0; i < K; ++i)
      if (new_slot[i] < 0) {
        new_slot[i] = free_slots[f++];
        copy_slot(bm.slot[parent[i]], new_slot[i]);
      }
    std::vector<std::vector<int32_t>> toks(K);
    std::vector<std::vector<float>> cum(K);
    for (int i = 0; i < K; ++i) {
      const Candidate& c = cands[chosen[i]];
      toks[i] = bm.toks[parent[i]];
      toks[i].push_back(c.flat % V_);
      cum[i].assign(bm.cum[parent[i]].begin(), bm.cum[parent[i]].begin() + step);
      cum[i].push_back(c.val);
    }
    bm.toks.swap(toks);
    bm.cum.swap(cum);
    bm.slot.swap(new_slot);
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

int decode_beam(Model& m, State& st, const BeamArgs& a) { return BeamSearch(m, st, a).run(); }

}  // namespace fa
