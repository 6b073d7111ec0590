// The rate of the engine's linear kernels (csrc/cpu/linear.cpp) by rows per call,
// beside the rate of independent float32 fused multiply-adds on the same
// threads: how far a pass over M positions is from the core's arithmetic.
//
//   linear_rate THREADS PRECISION(float32|int8) M1,M2,... N:K [N:K ...]
//
// Prints "peak GFLOPS GOPS" (2 flops per fused multiply-add lane; int8: the
// int8 products' rate, 2 operations per product, else 0; the best of the
// probe's rounds before and after the kernels' rounds) and one line per
// shape and M: "N K M us GFLOPS" (int8: 2 operations per product), the median
// of 7 timed rounds, each repeated to take about 20 ms.  The weights are the
// same for every call, so they stay in the caches as far as their size allows.
// With LINEAR_RATE_PASS="L;I,I,...;J,..." (indices of the N:K arguments: each
// layer's products in order, then those made once), also "pass M us MB": the
// products of a decoder pass of L layers over M rows, each layer its own
// weights (MB in all).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/amx.h"
#include "cpu/linear.h"
#include "cpu/linear_int8.h"
#include "cpu/vec.h"

namespace {

using Clock = std::chrono::steady_clock;

// Independent accumulators: more than the multiply-adds in flight (latency x
// units: 10 on a Zen 3 core, 8 on Golden Cove's), and with the operands (and
// int8's products) within the vector registers: 32 with AVX-512 (one each);
// 16 on AVX2 and SSE, where 16 chains spilled to the stack on every step (on a
// 2-core Zen 3 guest the float32 peak read 113 GFLOP/s instead of 180, below
// what the kernels themselves ran at); 32 on aarch64, where a vector of 8
// lanes takes two
#if defined(FA_ISA_AVX512)
constexpr int kChains = 16;
#else
constexpr int kChains = 12;
#endif

double fma_rate(long iters) {
  fa::VP acc[kChains];
  const fa::VP a = fa::VP::bcast(0.999f), b = fa::VP::bcast(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = fa::VP::bcast((float)i);
  const auto t0 = Clock::now();
  for (long n = 0; n < iters; ++n)
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = fa::VP::fma(acc[i], a, b);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  alignas(64) float out[fa::PANEL];
  float s = 0.f;
  for (int i = 0; i < kChains; ++i) {
    acc[i].store(out);
    s += out[0];
  }
  if (s == 1234.5f) std::printf(" ");  // keeps the loop
  return (double)kChains * fa::PANEL * 2.0 * iters / dt / 1e9;
}

// The same for the int8 products the kernels use (VNNI's vpdpbusd, or
// vpmaddwd and an addition): 2 operations per int8 product
double q8_rate(long iters) {
  typename fa::Q8P::Acc acc[kChains];
  alignas(64) int8_t wb[fa::PANEL * fa::Q8_GROUP];
  alignas(64) fa::Q8In xb[fa::Q8_GROUP];
  for (int i = 0; i < fa::PANEL * fa::Q8_GROUP; ++i) wb[i] = (int8_t)(i % 7 - 3);
  for (int i = 0; i < fa::Q8_GROUP; ++i) xb[i] = (fa::Q8In)(i + 1);
  for (int i = 0; i < kChains; ++i) acc[i] = fa::Q8P::zero();
  const auto w = fa::Q8P::load(wb);
  const auto g = fa::Q8P::group(xb);
  const auto t0 = Clock::now();
  for (long n = 0; n < iters; ++n)
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = fa::Q8P::madd(g, w, acc[i]);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  alignas(64) int32_t out[fa::PANEL];
  int64_t s = 0;
  for (int i = 0; i < kChains; ++i) {
    fa::Q8P::store(out, acc[i]);
    s += out[0];
  }
  if (s == 12345) std::printf(" ");  // keeps the loop
  return (double)kChains * fa::PANEL * fa::Q8_GROUP * 2.0 * iters / dt / 1e9;
}

// The threads' rates summed, the best of 5 rounds: a busy host only slows a
// round, and a peak read low would put the kernels above it
double peak(int threads, bool q8) {
  const long iters = 20000000;
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<double> r(threads);
    std::vector<std::thread> ts;
    auto rate = [&] { return q8 ? q8_rate(iters) : fma_rate(iters); };
    for (int t = 1; t < threads; ++t) ts.emplace_back([&, t] { r[t] = rate(); });
    r[0] = rate();
    for (auto& t : ts) t.join();
    double s = 0;
    for (double v : r) s += v;
    best = std::max(best, s);
  }
  return best;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: linear_rate THREADS float32|int8 M1,M2,... N:K [N:K ...]\n");
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const bool q8 = std::strcmp(argv[2], "int8") == 0;
  const std::vector<int> Ms = parse_list(argv[3]);
  // The peaks are the best of their rounds before and after the kernels' (printed first):
  // a neighbour that takes the CPUs during one probe leaves the other
  double peak32 = peak(threads, false), peak8 = q8 ? peak(threads, true) : 0.0;
  std::string lines;
  char line[256];
#if defined(FA_AMX)
#if defined(FA_TEST_HOOKS)  // built with the test library's switches (linear_rate.py --amx-min-rows)
  if (const char* r = std::getenv("LINEAR_RATE_AMX_MIN_ROWS")) fa::set_amx_min_rows(std::atoi(r));
#endif
  lines += "amx " + (fa::amx::state() != 1 ? std::string("off")
                                            : "from-" + std::to_string(fa::amx_min_rows()) + "-rows") + "\n";
#else
  lines += "amx none\n";
#endif
  fa::Pool pool(threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  auto make = [&](const char* shape) {
    const int N = std::atoi(shape), K = std::atoi(std::strchr(shape, ':') + 1);
    std::vector<float> bias(N, 0.01f);
    fa::Linear L;
    if (q8) {
      std::vector<int8_t> w((size_t)N * K);
      std::vector<float> scale(N, 0.01f);
      for (auto& v : w) v = (int8_t)((int)(rng() % 255) - 127);
      L.pack_q8(w.data(), scale.data(), bias.data(), N, K);
    } else {
      std::vector<float> w((size_t)N * K);
      for (auto& v : w) v = nd(rng);
      L.pack(w.data(), nullptr, bias.data(), N, K);
    }
    return L;
  };
  for (int a = 4; a < argc; ++a) {
    const fa::Linear L = make(argv[a]);
    const int N = L.N, K = L.K;
    for (int M : Ms) {
      std::vector<float> x((size_t)M * K), y((size_t)M * N);
      for (auto& v : x) v = nd(rng);
      const double flops = 2.0 * M * N * K;
      const int reps = std::max(5, (int)(4e9 * 0.02 / flops));
      for (int r = 0; r < reps; ++r) fa::linear(pool, L, x.data(), K, M, y.data(), N);
      std::vector<double> t;
      for (int round = 0; round < 7; ++round) {
        const auto t0 = Clock::now();
        for (int r = 0; r < reps; ++r) fa::linear(pool, L, x.data(), K, M, y.data(), N);
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
      }
      std::sort(t.begin(), t.end());
      std::snprintf(line, sizeof line, "%d %d %d %.2f %.1f\n", N, K, M, t[3] * 1e6, flops / t[3] / 1e9);
      lines += line;
    }
  }
  // A decoder pass's products, as LINEAR_RATE_PASS="LAYERS;I,I,...;J,..." names them: LAYERS
  // layers of their own weights, each the shapes I (0: the first N:K argument) in order, then
  // the shapes J once (the vocabulary); read as a pass reads them (the weights cycle through
  // the caches as in a decode loop); the row counts alternate within each round
  std::vector<fa::Linear> pass;
  if (const char* spec = std::getenv("LINEAR_RATE_PASS")) {
    const int layers = std::atoi(spec);
    const char* per_layer = std::strchr(spec, ';');
    const char* once = per_layer ? std::strchr(per_layer + 1, ';') : nullptr;
    if (layers <= 0 || !once) {
      std::fprintf(stderr, "LINEAR_RATE_PASS: LAYERS;I,I,...;J,... (got %s)\n", spec);
      return 2;
    }
    const std::vector<int> each = parse_list(per_layer + 1), last = parse_list(once + 1);
    std::vector<int> all(each);
    all.insert(all.end(), last.begin(), last.end());
    for (int i : all)
      if (i < 0 || i >= argc - 4) {
        std::fprintf(stderr, "LINEAR_RATE_PASS: no shape %d (%d given)\n", i, argc - 4);
        return 2;
      }
    for (int l = 0; l < layers; ++l)
      for (int i : each) pass.push_back(make(argv[4 + i]));
    for (int j : last) pass.push_back(make(argv[4 + j]));
  }
  if (!pass.empty()) {
    size_t bytes = 0, widest = 0;
    for (const auto& L : pass) {
      bytes += L.bytes();
      widest = std::max(widest, (size_t)std::max(L.N, L.K));
    }
    for (auto& L : pass) L.prefetch = bytes >= fa::kPrefetchModelBytes;  // as the engine sets it for a decoder
    const size_t most = (size_t)*std::max_element(Ms.begin(), Ms.end());
    std::vector<float> x(most * widest), y(most * widest);
    for (auto& v : x) v = nd(rng);
    auto run = [&](int M) {
      for (const auto& L : pass) fa::linear(pool, L, x.data(), L.K, M, y.data(), L.N);
    };
    std::vector<std::vector<double>> t(Ms.size());
    for (int round = 0; round < 15; ++round)
      for (size_t i = 0; i < Ms.size(); ++i) {
        run(Ms[i]);
        const auto t0 = Clock::now();
        for (int r = 0; r < 5; ++r) run(Ms[i]);
        t[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 5);
      }
    for (size_t i = 0; i < Ms.size(); ++i) {
      std::sort(t[i].begin(), t[i].end());
      std::snprintf(line, sizeof line, "pass %d %.2f %.4g\n", Ms[i], t[i][7] * 1e6, bytes / 1e6);
      lines += line;
    }
  }
  peak32 = std::max(peak32, peak(threads, false));
  if (q8) peak8 = std::max(peak8, peak(threads, true));
  std::printf("peak %.1f %.1f\n%s", peak32, peak8, lines.c_str());
  return 0;
}
