// Where the time of the engine's computations goes, by stage, for the
// diagnostics (scripts/diagnostics/pass_cost.py --stages).  Counted in the
// test library only (FA_TEST_HOOKS): in the engine decoding loads a Stage
// scope is empty and compiles to nothing.  Times are wall clock on the calling
// thread (a stage's work on the pool's other threads is inside its scope).
#pragma once

#if defined(FA_TEST_HOOKS)
#include <atomic>
#include <chrono>
#include <cstdint>
#endif

namespace fa {

enum class Stage : int {
  kEncoder,         // encode: the whole encoder and the decoder's encoder-attention keys/values
  kPass,            // verify_pass: everything below and the bookkeeping between them
  kEmbed,           // decoder input embeddings (and their layer norm)
  kSelfQKV,         // self-attention: layer norm and the q/k/v product, keys/values into the cache
  kSelfAttention,   // self-attention over the cache
  kSelfOut,         // its output product and residual
  kCrossQ,          // encoder attention: layer norm and the query product
  kCrossAttention,  // attention over the encoder output
  kCrossOut,        // its output product and residual
  kFFN,             // feed-forward block (layer norm, two products, activation, residual)
  kProjection,      // final layer norm and the vocabulary projection of the positions checked
  kChoose,          // greedy's choice at each position (score rules, argmax)
  kEmit,            // the accepted tokens' scores (log-softmax) and cache commit
  kCount
};

#if defined(FA_TEST_HOOKS)
// nanoseconds and entries per stage, process-wide
inline std::atomic<int64_t>* stage_ns() {
  static std::atomic<int64_t> ns[2 * (int)Stage::kCount];
  return ns;
}

class StageClock {
 public:
  explicit StageClock(Stage s) : s_((int)s), t0_(std::chrono::steady_clock::now()) {}
  ~StageClock() {
    const auto dt = std::chrono::steady_clock::now() - t0_;
    stage_ns()[2 * s_].fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count(),
                                 std::memory_order_relaxed);
    stage_ns()[2 * s_ + 1].fetch_add(1, std::memory_order_relaxed);
  }
  StageClock(const StageClock&) = delete;
  StageClock& operator=(const StageClock&) = delete;

 private:
  int s_;
  std::chrono::steady_clock::time_point t0_;
};
#else
class StageClock {
 public:
  explicit StageClock(Stage) {}
};
#endif

}  // namespace fa
