// The test library's entry points for attention: the engine's attend and
// attend_queries against their definitions (see test_api.cpp for the rest).
#ifndef FA_TEST_HOOKS
#error "csrc/testing/ is built into the test library only (FA_TEST_HOOKS)"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "cpu/ops.h"
#include "cpu/vec.h"

#pragma GCC visibility push(default)
extern "C" {

// Attention of one query over n keys (then n2 more at k2/v2), rows of stride
// ld, head width D: out from the engine's attend, ref from the operations it
// is defined by, one value at a time (per key: 8 lane partial sums over d, d
// mod 8 = lane, added from lane 0, then the d beyond the last whole 8 by fused
// multiply-adds; the softmax: exp(s - max) with fexp, summed as 8 lane partials
// over whole groups of 8 keys added from lane 0, then the rest one by one; out[d]:
// one fused multiply-add chain over the keys in order with weights e / sum).
// Returns 0, or -1 on an exception (the message on stderr).
int fa_test_attend(int D, int n, int n2, int64_t ld, const float* q, const float* k, const float* v, const float* k2,
                   const float* v2, float* out, float* ref) try {
  const int N = n + n2;
  std::vector<float> scratch(((size_t)N + 7) / 8 * 8 + 16);
  fa::attend(q, k, v, (size_t)ld, n, D, out, scratch.data(), k2, v2, n2);
  auto key = [&](int j) { return j < n ? k + (size_t)j * ld : k2 + (size_t)(j - n) * ld; };
  auto val = [&](int j) { return j < n ? v + (size_t)j * ld : v2 + (size_t)(j - n) * ld; };
  std::vector<float> s(N), e(N);
  for (int j = 0; j < N; ++j) {
    const float* kj = key(j);
    const int whole = D / 8 * 8;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int d = 0; d < whole; ++d) lane[d % 8] = std::fma(q[d], kj[d], lane[d % 8]);
    float dot = 0.f;
    if (D >= 8)
      for (int l = 0; l < 8; ++l) dot = dot + lane[l];
    for (int d = whole; d < D; ++d) dot = std::fma(q[d], kj[d], dot);
    s[j] = dot;
  }
  float mx = s[0];
  for (int j = 1; j < N; ++j) mx = std::max(mx, s[j]);
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.f;
  const int whole = N / 8 * 8;
  for (int j = 0; j < N; ++j) e[j] = fa::fexp(s[j] - mx);
  for (int j = 0; j < whole; ++j) part[j % 8] = part[j % 8] + e[j];
  for (int l = 0; l < 8; ++l) sum = sum + part[l];
  for (int j = whole; j < N; ++j) sum = sum + e[j];
  for (int d = 0; d < D; ++d) {
    float acc = 0.f;
    for (int j = 0; j < N; ++j) acc = std::fma(e[j] / sum, val(j)[d], acc);
    ref[d] = acc;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_attend: %s\n", e.what());
  return -1;
}

// attend_queries for nq queries (rows of stride q_ld) over n keys and values
// (rows of stride ld), head width D: out from it (rows of stride D), ref from
// attend, one query at a time.  Returns 0, or -1 on an exception.
int fa_test_attend_queries(int D, int n, int nq, int64_t q_ld, int64_t ld, const float* q, const float* k,
                           const float* v, float* out, float* ref) try {
  std::vector<float> scratch((size_t)fa::kAttendQueries * (n + 16));
  fa::attend_queries(q, (size_t)q_ld, nq, k, v, (size_t)ld, n, D, out, (size_t)D, scratch.data());
  std::vector<float> one(((size_t)n + 7) / 8 * 8 + 16);
  for (int i = 0; i < nq; ++i) fa::attend(q + i * q_ld, k, v, (size_t)ld, n, D, ref + (size_t)i * D, one.data());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fa_test_attend_queries: %s\n", e.what());
  return -1;
}

}  // extern "C"
#pragma GCC visibility pop
