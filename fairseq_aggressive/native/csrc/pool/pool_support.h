// What the thread pool (parallel.h) is built from besides its protocol: the
// spin-wait hint, the windows the fault-injection build (FA_POOL_FAULTS) widens
// between two atomic steps, the pool's counters and the error of a call that
// could not complete.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <thread>

namespace fa {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

#ifdef FA_POOL_FAULTS
// a window between two atomic steps: now and then yield or sleep up to 200 us
inline void pool_window() {
  thread_local uint64_t s = 0x9E3779B97F4A7C15ull ^ std::hash<std::thread::id>()(std::this_thread::get_id());
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  const int r = (int)(s & 15);
  if (r == 0) std::this_thread::yield();
  if (r == 1) std::this_thread::sleep_for(std::chrono::microseconds(1 + (s >> 8) % 200));
}
#define FA_POOL_WINDOW() ::fa::pool_window()
#else
#define FA_POOL_WINDOW() ((void)0)
#endif

// Counters of a pool since it was made (fa_pool_stats).
struct PoolStats {
  int64_t calls = 0;          // run() calls with more than one item
  int64_t parallel = 0;       // of those, offered to the workers
  int64_t worker_items = 0;   // items run by workers
  int64_t waits = 0;          // calls whose caller waited for a worker's item
  int64_t stalls = 0;         // waits far longer than an item (the worker was descheduled)
  int64_t wait_ns = 0;        // total time callers waited for workers' items
};

// The counters in their order (calls, parallel, worker_items, waits, stalls,
// wait_ns) into out[0..6): fa_pool_stats and the test library's self-test
inline void put_stats(const PoolStats& s, int64_t* out) {
  const int64_t v[6] = {s.calls, s.parallel, s.worker_items, s.waits, s.stalls, s.wait_ns};
  for (int i = 0; i < 6; ++i) out[i] = v[i];
}

// A call that could not complete: a completion was lost (point 5 of parallel.h's argument).
class PoolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fa
