// The screened projection (screen.h): the bound's terms per output at build,
// per row the bound's pieces, the best lower bound, the panels that could hold
// the maximum, and those panels computed exactly.
#include "model/screen.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "cpu/ops.h"
#include "model/decoder.h"

namespace fa {

namespace {

// W[n][k] of a packed float layer (linear.h: panel p holds W[PANEL p + l][k] at [k PANEL + l])
float weight_at(const Linear& L, int n, int k) {
  const size_t at = ((size_t)(n / PANEL) * L.K + k) * PANEL + n % PANEL;
  return L.half ? half_to_float(L.wh[at]) : L.w[at];
}

// x rounded up by a relative margin far above a float's rounding (2^-20)
float up(double x) { return (float)(x * (1.0 + 1.0 / (1 << 20))); }

#if defined(FA_TEST_HOOKS)
std::atomic<int64_t> g_rows{0}, g_panels{0}, g_whole{0};
void count(int64_t rows, int64_t panels, int64_t whole) {
  g_rows.fetch_add(rows, std::memory_order_relaxed);
  g_panels.fetch_add(panels, std::memory_order_relaxed);
  g_whole.fetch_add(whole, std::memory_order_relaxed);
}
float slack(const Decoder& m) { return m.screen_slack; }
#else
void count(int64_t, int64_t, int64_t) {}
constexpr float slack(const Decoder&) { return 1.f; }
#endif

// A row's scratch: the columns the filter keeps, the panels to compute exactly
struct RowScratch {
  std::vector<int32_t> cols, panels;
};

// Row r of out: the screen's logits made exact where they could be the maximum
// (screen.h); false where the row needs the whole projection (x zero or not finite,
// or so many candidates that the panels would cost about as much).
//
// Column n's bound is e_n = a W_n + b T_n + c |z~_n|.  A column is a candidate where
// z~_n + e_n >= L, L = max over the ordinary columns of z~_n - e_n.  Two passes over
// the row find them without evaluating e_n at every column: the maximum mx of z~
// gives a lower bound L0 = mx - (A + c |mx|) <= L (A = a max W + b max T, so e_n <= A +
// c |z~_n| at its column), and since f(t) = t + c |t| rises with t (c < 1), a column
// with f(z~_n) < L0 - A has z~_n + e_n < L0 <= L: only columns with z~_n >= theta =
// f^-1(L0 - A) (rounded down) can be candidates.  Among those few, L itself (the
// column that attains it has z~_n - e_n >= L0, so it is among them) and the
// candidates are exactly the whole row's.
bool screen_row(const Decoder& m, const float* x, float* z, RowScratch& rs) {
  const Linear& P = m.w.proj;
  const Screen& S = m.w.screen;
  const int K = P.K, V = P.N;
  const float amax = abs_max_of(x, K);  // (the int8 product's own quantization: linear_int8.h)
  if (!(amax > 0.f) || !std::isfinite(amax)) return false;
  const float sx = amax / 127.f;
  double l1 = 0;
  for (int k = 0; k < K; ++k) l1 += std::fabs(x[k]);
  const double R = 0.5 * sx * (1.0 + 1.0 / (1 << 14)) + amax / (double)(1 << 20);
  const double gamma = (double)K / (1 << 23);
  // e_n = a W_n + b T_n + c |z~_n|, with a margin of 2^-10 for the float arithmetic evaluating it
  const double margin = (1.0 + 1.0 / (1 << 10)) * slack(m);
  const float a = up((R + gamma * amax) * margin), b = up((l1 * (1.0 + 1.0 / (1 << 20)) + K * R) * margin),
              c = up(margin / (1 << 20));
  const int special[3] = {m.cfg.pad, m.cfg.unk, m.cfg.eos};
  for (int s : special) z[s] = -std::numeric_limits<float>::infinity();  // (computed below)
  const float mx = max_of(z, V);
  if (!std::isfinite(mx)) return false;
  const double A = (double)a * S.w1_max + (double)b * S.t_max_all, L0 = mx - (A + (double)c * std::fabs(mx));
  const double y = L0 - A, theta = y >= 0 ? y / (1.0 + c) : y / (1.0 - c);
  const float th = (float)(theta - std::fabs(theta) / (1 << 20)) - std::numeric_limits<float>::min();
  rs.cols.clear();
  const V8 vth = V8::bcast(th);
  int n = 0;
  for (; n + LANES <= V; n += LANES)
    for (unsigned hit = V8::at_least_lanes(V8::load(z + n), vth); hit; hit &= hit - 1)
      rs.cols.push_back(n + __builtin_ctz(hit));
  for (; n < V; ++n)
    if (z[n] >= th) rs.cols.push_back(n);
  if ((int)rs.cols.size() * 8 > V) return false;  // (a flat row: the whole projection costs about as much)
  const float* w1 = S.w1.data();
  const float* tm = S.t_max.data();
  auto bound_at = [&](int col) { return a * w1[col] + (b * tm[col] + c * std::fabs(z[col])); };
  float L = -std::numeric_limits<float>::infinity();
  for (int col : rs.cols) L = std::max(L, z[col] - bound_at(col));
  // the panels of every column whose upper bound reaches L (cols ascend), and of the special columns
  std::vector<int32_t>& panels = rs.panels;
  panels.clear();
  for (int col : rs.cols)
    if (z[col] + bound_at(col) >= L && (panels.empty() || panels.back() != col / PANEL)) panels.push_back(col / PANEL);
  for (int s : special) panels.push_back(s / PANEL);
  std::sort(panels.begin(), panels.end());
  panels.erase(std::unique(panels.begin(), panels.end()), panels.end());
  if ((int)panels.size() * 4 > P.P) return false;
  linear_panels(P, x, panels.data(), (int)panels.size(), z);
  return true;
}

}  // namespace

void build_screen(const Linear& proj, Screen& s) {
  s = Screen();
  // (the screen pays where int8 products run several to a float product's one: kVectorISA)
  if (!kVectorISA || proj.q8 || proj.has_bias || proj.N == 0) return;
  const int N = proj.N, K = proj.K;
  std::vector<int8_t> q((size_t)N * K);
  std::vector<float> scale(N);
  s.w1.assign((size_t)N + LANES, 0.f);  // (the vector loops read whole groups of LANES)
  s.t_max.assign((size_t)N + LANES, 0.f);
  for (int n = 0; n < N; ++n) {
    float amax = 0.f;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(weight_at(proj, n, k)));
    const float sw = amax > 0.f ? amax / 127.f : 1.f;
    double w1 = 0, tmax = 0;
    for (int k = 0; k < K; ++k) {
      const double w = weight_at(proj, n, k);
      const double lv = std::max(-127.0, std::min(127.0, std::nearbyint(w / sw)));
      q[(size_t)n * K + k] = (int8_t)lv;
      w1 += std::fabs(w);
      tmax = std::max(tmax, std::fabs(w - (double)sw * lv));  // (exact in double)
    }
    scale[n] = sw;
    s.w1[n] = up(w1);
    s.t_max[n] = up(tmax);
    s.w1_max = std::max(s.w1_max, s.w1[n]);
    s.t_max_all = std::max(s.t_max_all, s.t_max[n]);
  }
  s.q.pack_q8(q.data(), scale.data(), nullptr, N, K);
  s.q.prefetch = proj.prefetch;
}

void project_screened(Decoder& m, const float* h, int M, float* out) {
  const int C = m.cfg.C, V = m.cfg.tgt_vocab;
  linear(m.pool, m.w.screen.q, h, C, M, out, V);
  // the calling thread's, kept across passes; the pool's threads write into it through this reference
  // (a lambda names a thread_local directly, so inside it `whole_of_thread` would be each thread's own)
  thread_local std::vector<int> whole_of_thread;
  std::vector<int>& whole = whole_of_thread;
  whole.assign(M, 0);
  const int chunks = std::min(M, m.pool.size() > 1 && M >= 8 ? m.pool.size() : 1);
  std::atomic<int64_t> n_panels{0};
  m.pool.run(
      [&](int c) {
        thread_local RowScratch rs;  // (each pool thread's own, kept across passes)
        int64_t np = 0;
        for (int r = (int)((int64_t)M * c / chunks); r < (int)((int64_t)M * (c + 1) / chunks); ++r) {
          whole[r] = !screen_row(m, h + (size_t)r * C, out + (size_t)r * V, rs);
          np += whole[r] ? 0 : (int64_t)rs.panels.size();
        }
        n_panels.fetch_add(np, std::memory_order_relaxed);
      },
      chunks);
  int64_t n_whole = 0;
  for (int r = 0; r < M; ++r)
    if (whole[r]) {  // (each alone: a row's bits never depend on its block)
      linear(m.pool, m.w.proj, h + (size_t)r * C, C, 1, out + (size_t)r * V, V);
      ++n_whole;
    }
  count(M, n_panels.load(std::memory_order_relaxed), n_whole);
}

ScreenCounts screen_counts() {
#if defined(FA_TEST_HOOKS)
  return {g_rows.load(), g_panels.load(), g_whole.load()};
#else
  return {};
#endif
}

}  // namespace fa
