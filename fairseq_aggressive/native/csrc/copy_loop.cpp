// The loop of source-copy drafting and greedy search in the engine (see copy_loop.h).
#include "copy_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "pass.h"

namespace fa {

namespace {

constexpr int kNone = -1;

// One sentence's copy source and where its copy stands (input_copy.py's
// src, ptr; anchor and since only serve several branches, absent here).
struct Copy {
  const int32_t* src = nullptr;
  int len = 0;
  int ptr = 0;  // the next source position to draft, or kNone
};

// The source position right after the unique occurrence of out's suffix of n
// tokens, for the shortest n in [nmin, nmax] (n <= out's length) whose suffix
// occurs once; kNone where the shortest that occurs at all occurs more than
// once up to nmax, where one does not occur (no longer one can), or where the
// unique occurrence ends the source (input_copy.py's _resync).
int resync(const Copy& c, const std::vector<int32_t>& out, int nmin, int nmax) {
  const int have = (int)out.size();
  for (int n = nmin; n <= std::min(nmax, have); ++n) {
    const int32_t* suffix = out.data() + have - n;
    int found = 0, end = kNone;
    for (int e = n; e <= c.len && found < 2; ++e)
      if (std::equal(suffix, suffix + n, c.src + e - n)) {
        ++found;
        end = e;
      }
    if (found == 0) return kNone;
    if (found == 1) return end < c.len ? end : kNone;
  }
  return kNone;
}

}  // namespace

int decode_copy(Model& m, State& st, const CopyLoopArgs& a, CopyLoopStats& stats) {
  const int B = a.n;
  if (B != (int)st.sents.size() || a.out_cap < a.max_len + 1 || a.max_draft < 0 || a.ngram_min < 1 ||
      a.ngram_max < a.ngram_min)
    return -1;
  std::vector<Copy> copy(B);
  for (int b = 0, o = 0; b < B; o += a.src_len[b++]) {
    if (a.src_len[b] < 0 || st.sents[b].len != 0) return -1;
    copy[b].src = a.src + o;
    copy[b].len = a.src_len[b];
    copy[b].ptr = copy[b].len > 0 ? 0 : kNone;
  }
  LoopOutputs out(B);
  std::vector<int32_t> last(B, a.first);
  std::vector<int32_t> active(B);
  for (int b = 0; b < B; ++b) active[b] = b;
  for (int b = 0; b < B; ++b) a.passes[b] = 0;

  // one pass's rows and outputs
  std::vector<int32_t> row_len, tokens, n_emit, n_match, done, start, kind;
  std::vector<int32_t> choice;
  std::vector<float> score;
  PassArgs p = pass_settings(a);

  using Clock = std::chrono::steady_clock;
  while (!active.empty()) {
    const int n = (int)active.size();
    const auto t0 = Clock::now();
    row_len.assign(n, 0);
    start.assign(n, kNone);  // the source position each draft copies from (kNone: no draft)
    kind.assign(n, 0);       // 0: continuing a copy, 1: re-anchored
    tokens.clear();
    for (int i = 0; i < n; ++i) {
      const int b = active[i];
      const int cap = std::min(a.max_len - out.length(b), a.max_draft);
      tokens.push_back(last[b]);
      int r = kNone;
      if (cap > 0) {
        r = copy[b].ptr;
        kind[i] = r == kNone;
        if (r == kNone) r = resync(copy[b], out.tokens(b), a.ngram_min, a.ngram_max);
      }
      int L = 0;
      if (r != kNone) {
        L = std::min(cap, copy[b].len - r);
        tokens.insert(tokens.end(), copy[b].src + r, copy[b].src + r + L);
      }
      start[i] = L > 0 ? r : kNone;
      row_len[i] = 1 + L;
    }
    stats.loop.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();

    const size_t total = tokens.size();
    choice.resize(total);
    score.resize(total);
    n_emit.resize(n);
    n_match.resize(n);
    done.resize(n);
    p.n = n;
    p.sent = active.data();
    p.row_len = row_len.data();
    p.tokens = tokens.data();
    p.choice = choice.data();
    p.score = score.data();
    p.n_emit = n_emit.data();
    p.n_match = n_match.data();
    p.done = done.data();
    // (rows fit: a draft never reaches beyond max_len, the caches hold max_len + 1 positions)
    if (verify_pass(m, st, p) != 0) throw std::logic_error("a draft does not fit its sentence's cache");
    stats.loop.passes += 1;
    stats.loop.sentence_passes += n;

    int kept = 0, o = 0;
    for (int i = 0; i < n; o += row_len[i++]) {
      const int b = active[i], L = row_len[i] - 1, k = n_match[i];
      a.passes[b] += 1;
      stats.loop.count(L, k);
      out.emit(b, choice.data() + o, score.data() + o, n_emit[i]);
      if (done[i]) continue;
      active[kept++] = b;
      last[b] = out.tokens(b).back();
      // what the drafter learns (InputCopyDrafter.update with one branch)
      Copy& c = copy[b];
      c.ptr = kNone;
      if (start[i] == kNone) continue;
      (kind[i] ? stats.sync_trials : stats.copy_trials) += 1;
      (kind[i] ? stats.sync_hits : stats.copy_hits) += k >= 1;
      if (k >= 1) {
        stats.cont_hits += k - 1;
        stats.cont_trials += k - 1 + (k < L);
      }
      const int nxt = start[i] + k;
      if (k == L && nxt < c.len && last[b] == c.src[nxt] && nxt + 1 < c.len) c.ptr = nxt + 1;
    }
    active.resize(kept);
  }
  out.write(a.out_cap, a.out_tokens, a.out_scores, a.out_len);
  return 0;
}

}  // namespace fa
