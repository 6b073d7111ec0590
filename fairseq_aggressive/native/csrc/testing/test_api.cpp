// Entry points only tests call, built into the test library
// (fairseq_aggressive.native.build.test_library: csrc/*.cpp and this directory,
// with FA_TEST_HOOKS), never into the engine decoding loads.
#ifndef FA_TEST_HOOKS
#error "csrc/testing/ is built into the test library only (FA_TEST_HOOKS)"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "cpu/amx.h"
#include "cpu/linear.h"
#include "cpu/linear_int8.h"
#include "model/decoder.h"
#include "model/screen.h"
#include "cpu/ops.h"
#include "pool/parallel.h"
#include "model/stages.h"
#include "cpu/weight_hints.h"
#include "loop/draft_lengths.h"

namespace fa {
extern int beam_mutant;            // beam_search.cpp
extern int drafted_pass_delay_us;  // draft_check.cpp
extern int run_fault_token;        // running_batch.cpp
}

#pragma GCC visibility push(default)
extern "C" {

// A pool of `threads` runs `calls` calls, each of an item count drawn anew in
// [1, max_items] (seeded), as a decoder's calls are; every item records that it
// ran and spins for a varying time.  In every `slow`-th call (0: none) the items
// the workers run sleep `slow_us` microseconds, as a descheduled worker would, and
// the caller gives the workers up to 2 ms to come before it takes its first item.
// Returns the number of items that did not run exactly once (0 when the pool is
// right), or -1 if a call failed with fa::PoolError or the pool could not start
// (the message on stderr); the
// pool's counters go to stats (6 values, as fa_pool_stats).
int64_t fa_pool_selftest(int threads, int calls, int max_items, int seed, int slow, int slow_us, int timeout_ms,
                         int64_t* stats) try {
  fa::Pool pool(threads);
  if (timeout_ms > 0) pool.set_timeout(std::chrono::milliseconds(timeout_ms));
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> hits(std::max(max_items, 1));
  std::atomic<int> worker_came{0};
  uint64_t rng = 0x2545F4914F6CDD1Dull * (uint64_t)(seed + 1);
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int64_t bad = 0;
  for (int c = 0; c < calls; ++c) {
    const int items = 1 + (int)(next() % (uint64_t)std::max(max_items, 1));
    const int work = 50 + (int)(next() % 400);
    for (auto& h : hits) h.store(0, std::memory_order_relaxed);
    worker_came.store(0, std::memory_order_relaxed);
    const bool slow_call = slow > 0 && c % slow == 0;
    bool caller_waited = false;
    try {
      pool.run(
          [&](int i) {
            const bool on_caller = std::this_thread::get_id() == caller;
            if (slow_call && on_caller && !caller_waited) {
              caller_waited = true;
              const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
              while (worker_came.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until)
                std::this_thread::yield();
            }
            if (!on_caller) worker_came.store(1, std::memory_order_release);
            hits[i].fetch_add(1, std::memory_order_relaxed);
            volatile uint64_t spin = 0;
            for (int j = 0; j < work + 7 * i; ++j) spin = spin + j;  // an item's work: under a microsecond to a few
            if (slow_call && !on_caller) std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
          },
          items);
    } catch (const fa::PoolError& e) {
      std::fprintf(stderr, "fa_pool_selftest: call %d: %s\n", c, e.what());
      bad = -1;
      break;
    }
    for (int i = 0; i < (int)hits.size(); ++i) bad += hits[i].load(std::memory_order_relaxed) != (i < items ? 1 : 0);
  }
  if (stats != nullptr) fa::put_stats(pool.stats(), stats);
  return bad;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_pool_selftest: %s\n", e.what());
  return -1;
}

// Test hook: the model's next parallel call loses one completion (fa::Pool::lose_next_count).
void fa_pool_lose_next_count(void* mp) { static_cast<fa::Decoder*>(mp)->pool.lose_next_count(); }

// Test hook: beam search runs broken rule n (beam_search.cpp; 0: none): 1 a
// child reads its parent's draft whatever its token, 2 it reads its parent's
// row again, 3 a child off the draft keeps the draft's positions in its
// parent's slot, 4 the child on the draft leaves its parent's slot (and the
// draft's positions) to the parent's first child
void fa_set_beam_mutant(int n) { fa::beam_mutant = n; }

// Test hook: every pass that verified a draft under the draft-length policy
// takes `us` microseconds more (spent after the pass-cost table's timing, so
// only the policy's check on whole passes sees it), as drafted passes on a
// loaded CPU cost more than the table says; and the check on (1) or off (0)
void fa_set_drafted_pass_delay(int us) { fa::drafted_pass_delay_us = us; }
// Test hook: a running batch's pass fails, as an engine error does, while one
// of its rows' copy sources holds `token` (-1: never), so that a test can pin a
// fault on one sentence
void fa_set_run_fault_token(int token) { fa::run_fault_token = token; }
void fa_set_realized_check(int on) { fa::realized_check = on != 0; }

// Test hook: the projection size beyond which the model's passes project a
// whole path in one round (0: always, -1: never); results never depend on it.
void fa_set_eager_projection_bytes(void* mp, int64_t bytes) {
  static_cast<fa::Decoder*>(mp)->eager_projection_bytes = bytes < 0 ? SIZE_MAX : (size_t)bytes;
}

// Test hook: whether the model's passes may project through the screen
// (model/screen.h), and a factor on its bound (below 1 it no longer holds:
// outputs may then differ, a mutant the tests use)
void fa_set_screen(void* mp, int on, float slack) {
  auto* m = static_cast<fa::Decoder*>(mp);
  m->screen_on = on != 0;
  m->screen_slack = slack;
}

// The screen's counts in this process (model/screen.h): rows screened, panels
// computed exactly, rows projected whole
void fa_screen_counts(int64_t* out) {
  const fa::ScreenCounts c = fa::screen_counts();
  out[0] = c.rows;
  out[1] = c.panels;
  out[2] = c.whole;
}

// y (M x N) = x (M x K) W^T + b on a pool of `threads`, through the engine's
// linear kernels: W float32 (kind 0), float16 bits (kind 1) or int8 with per
// row scales (kind 2), plus 4 for the tiles that ask for their weights ahead
// (Linear::prefetch); bias may be null.  Returns 0, or -1 on an exception (the
// message on stderr).
int fa_test_linear(int threads, int kind, int N, int K, int M, const void* W, const float* scale,
                   const float* bias, const float* x, float* y) try {
  fa::Pool pool(threads);
  fa::Linear L;
  L.prefetch = (kind & 4) != 0;  // kind + 4: the tiles that ask for weights ahead
  const bool backward = (kind & 8) != 0;  // kind + 8: the panel groups in the backward order
  kind &= 3;
  if (kind == 2)
    L.pack_q8(static_cast<const int8_t*>(W), scale, bias, N, K);
  else if (kind == 1)
    L.pack(nullptr, static_cast<const uint16_t*>(W), bias, N, K);
  else
    L.pack(static_cast<const float*>(W), nullptr, bias, N, K);
  fa::set_panels_backward(backward);
  fa::linear(pool, L, x, K, M, y, N);
  fa::set_panels_backward(false);
  return 0;
} catch (const std::exception& e) {
  fa::set_panels_backward(false);
  std::fprintf(stderr, "fa_test_linear: %s\n", e.what());
  return -1;
}

// Where the storage the kernels read starts, as bytes past a cache line: the
// packed weights of float32, float16 and int8 layers (large and small, the
// sizes malloc serves from mmap and from its heap) and the buffers a model's
// rows, caches and logits live in (LineVector, grown as Decoder's ensure does).
// Writes up to n offsets (0 on a line) and returns how many it checked.
int fa_test_storage_offsets(int64_t* out, int n) try {
  std::vector<int64_t> offs;
  auto at = [&](const void* p) { offs.push_back((int64_t)((uintptr_t)p % 64)); };
  for (const int rows : {1000, 17})
    for (const int cols : {300, 5}) {
      std::vector<float> W((size_t)rows * cols, 0.25f), scale(rows, 0.01f);
      std::vector<uint16_t> Wh((size_t)rows * cols, 0x3c00);  // 1.0
      std::vector<int8_t> Wq((size_t)rows * cols, 3);
      fa::Linear f, h, q;
      f.pack(W.data(), nullptr, nullptr, rows, cols);
      h.pack(nullptr, Wh.data(), nullptr, rows, cols);
      q.pack_q8(Wq.data(), scale.data(), nullptr, rows, cols);
      at(f.w.data());
      at(h.half ? (const void*)h.wh.data() : (const void*)h.w.data());
      at(q.wq.data());
    }
  fa::LineVector<float> buf;
  for (const size_t size : {(size_t)3, (size_t)1000, (size_t)300000}) {
    fa::ensure(buf, size);
    at(buf.data());
  }
  for (int i = 0; i < std::min(n, (int)offs.size()); ++i) out[i] = offs[i];
  return (int)offs.size();
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_storage_offsets: %s\n", e.what());
  return -1;
}

// How many cache lines ahead StreamHints asks (kStreamAhead: per build target)
int fa_test_stream_ahead_lines() { return fa::kStreamAhead; }

// The lines StreamHints asks for: a tile of nr panels of panel_bytes, `step`
// bytes (16, 32 or 64) per k step over `steps` steps, its thread's share ending
// end_offset bytes after the tile's first panel.  out[k] for each k step: the
// offset from the first panel of the line asked for in it, or -1 for none.
// Returns 0, or -1 for a step it has no instance for.
int fa_test_stream_hints(int64_t panel_bytes, int nr, int steps, int step, int64_t end_offset, int64_t* out) try {
  if (step != 16 && step != 32 && step != 64) return -1;
  const std::vector<char> share((size_t)std::max<int64_t>(end_offset, (int64_t)steps * step) + 1);
  const char* panel = share.data();
  const fa::StreamHints h(panel, (size_t)panel_bytes, nr, steps, (size_t)step, panel + end_offset);
  for (int k = 0; k < steps; ++k) {
    const char* cur = panel + (size_t)k * step;
    const char* p = step == 16 ? h.line<16>(cur, k) : step == 32 ? h.line<32>(cur, k) : h.line<64>(cur, k);
    out[k] = p ? (int64_t)(p - panel) : -1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_stream_hints: %s\n", e.what());
  return -1;
}

// A row's logsumexp and first argmax (the scores of emitted tokens, greedy's
// choice): lse/arg from the engine's, ref_lse/ref_arg from their definitions
// (the maximum; exp(x - max) with fexp, summed as 8 lane partials over whole
// groups of 8 added from lane 0, then the rest one by one; the first index
// holding the maximum).  Returns 0, or -1 on an exception (the message on stderr).
int fa_test_row_reductions(int n, const float* x, float* lse, int* arg, float* ref_lse, int* ref_arg) try {
  *lse = fa::logsumexp(x, n);
  *arg = fa::argmax_first(x, n);
  float mx = x[0];
  for (int j = 1; j < n; ++j) mx = std::max(mx, x[j]);
  *ref_arg = (int)(std::find(x, x + n, mx) - x);
  if (mx == -std::numeric_limits<float>::infinity()) {
    *ref_lse = mx;
    return 0;
  }
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.f;
  const int whole = n / 8 * 8;
  for (int j = 0; j < whole; ++j) part[j % 8] = part[j % 8] + fa::fexp(x[j] - mx);
  for (int l = 0; l < 8; ++l) sum = sum + part[l];
  for (int j = whole; j < n; ++j) sum = sum + fa::fexp(x[j] - mx);
  *ref_lse = mx + std::log(sum);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_row_reductions: %s\n", e.what());
  return -1;
}

// A row's confidence normaliser: *coarse from the engine's logsumexp_coarse,
// *ref from its definition (the maximum m; each value's 2^y as the float whose
// bits are (int)max(2^23, x a + b), a = log2(e) 2^23, b = 127 2^23 - m a; 64
// partial sums, value j into sum j mod 64 over whole groups of 64, added from
// sum 0, then the rest one by one).  Returns 0, or -1 on an exception.
int fa_test_logsumexp_coarse(int n, const float* x, float* coarse, float* ref) try {
  *coarse = fa::logsumexp_coarse(x, n);
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  if (mx == -std::numeric_limits<float>::infinity()) {
    *ref = mx;
    return 0;
  }
  const float a = 12102203.f, b = 1065353216.f - mx * a;
  auto term = [&](float v) {
    const int32_t bits = (int32_t)std::max(8388608.f, v * a + b);
    float e;
    std::memcpy(&e, &bits, 4);
    return e;
  };
  float part[64] = {}, sum = 0.f;
  const int whole = n / 64 * 64;
  for (int j = 0; j < whole; ++j) part[j % 64] = part[j % 64] + term(x[j]);
  for (int l = 0; l < 64; ++l) sum = sum + part[l];
  for (int j = whole; j < n; ++j) sum = sum + term(x[j]);
  *ref = mx + std::log(sum);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_logsumexp_coarse: %s\n", e.what());
  return -1;
}

// The draft check (loop/draft_lengths.h, Realized) on synthetic passes: a fresh
// check observes n passes, pass i from p[6 i .. 6 i + 5] (rows, drafted,
// tokens, ms, greedy_ms, carried_ms); may[i]: whether it then lets the next pass
// of those rows draft.  Returns 0, or -1 on an exception.
int fa_test_realized(int n, const double* p, int32_t* may) try {
  fa::Realized r;
  for (int i = 0; i < n; ++i) {
    const double* q = p + 6 * (size_t)i;
    r.observe((int)q[0], q[1] != 0, (int)q[2], q[3], q[4], q[5]);
    may[i] = r.may_draft((int)q[0]) ? 1 : 0;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_realized: %s\n", e.what());
  return -1;
}

// The stage times (csrc/model/stages.h) of this process: for each stage i <
// min(n, stages), ns[2 i] nanoseconds and ns[2 i + 1] entries, then zeroed
// when reset.  Returns the number of stages.
int fa_stage_times(int64_t* ns, int n, int reset) {
  const int count = (int)fa::Stage::kCount;
  for (int i = 0; i < 2 * std::min(n, count); ++i)
    ns[i] = reset ? fa::stage_ns()[i].exchange(0) : fa::stage_ns()[i].load();
  return count;
}

// Test hook: pieces per thread of a shared product (process-wide; results
// never depend on it).  Returns the previous value.
int fa_set_product_pieces(int pieces) {
  const int previous = fa::product_pieces();
  fa::set_product_pieces(pieces);
  return previous;
}

// Test hook: the fewest rows an int8 product runs on AMX tiles (process-wide;
// results never depend on it).  Returns the previous value, or -1 in a build
// without AMX tiles.
int fa_set_amx_min_rows(int rows) {
#if defined(FA_AMX)
  const int previous = fa::amx_min_rows();
  fa::set_amx_min_rows(rows);
  return previous;
#else
  (void)rows;
  return -1;
#endif
}

// Test hook: the int8 products run on AMX tiles so far in this process (-1 in
// a build without them)
int64_t fa_amx_products() {
#if defined(FA_AMX)
  return fa::amx_products();
#else
  return -1;
#endif
}

// Test hook: the calling thread loads tile shapes of its own (`shaped`) or
// none, runs an int8 product of `rows` rows on a pool of `threads`, and says
// whether its shapes are then what they were: 1 yes, 0 no, -1 where this
// build or process has no tiles (or the product would not use them).
int fa_test_amx_caller_shapes(int shaped, int rows, int threads) try {
#if defined(FA_AMX)
  if (fa::amx::state() != 1 || rows < fa::amx_min_rows()) return -1;
  fa::amx::Config mine;
  if (shaped) {
    mine.rows[0] = 3;
    mine.colsb[0] = 12;
    fa::amx::configure(mine);
  } else {
    mine.palette = 0;
    fa::amx::release();
  }
  const int N = 40, K = 70;
  std::vector<int8_t> w((size_t)N * K);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (int8_t)((int)(i * 37 % 255) - 127);
  std::vector<float> scale(N, 0.01f), x((size_t)rows * K, 0.5f), y((size_t)rows * N);
  fa::Pool pool(threads);
  fa::Linear L;
  L.pack_q8(w.data(), scale.data(), nullptr, N, K);
  fa::linear(pool, L, x.data(), K, rows, y.data(), N);
  fa::amx::Config after;
  fa::amx::save(after);
  return std::memcmp(&after, &mine, sizeof(mine)) == 0 ? 1 : 0;
#else
  (void)shaped, (void)rows, (void)threads;
  return -1;
#endif
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_amx_caller_shapes: %s\n", e.what());
  return -1;
}

}  // extern "C"
#pragma GCC visibility pop
