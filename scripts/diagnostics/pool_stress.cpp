// Stress driver of the engine's thread pool (csrc/pool/parallel.h), built and run
// by pool_stress.py beside it, optionally with the pool's test-only switches
// (-DFA_POOL_FAULTS, -DFA_POOL_SPLIT_BOUND).
//
//   pool_stress THREADS CALLS MAX_ITEMS SEED TIMEOUT_MS
//
// One caller makes CALLS calls of an item count drawn anew in [1, MAX_ITEMS]
// each (a decoder's calls change size from one to the next); every item records
// the call it ran for and spins a varying time.  After each call every item of
// it must have run exactly once and no slot beyond it may have been touched.
// Prints one line "calls C bad B" and exits 0 when all is right, 1 on a
// miscounted item, 2 if the pool threw PoolError, 3 if no call completed for
// 10 x TIMEOUT_MS (a hang the pool did not report; a watchdog thread ends it).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "pool/parallel.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s THREADS CALLS MAX_ITEMS SEED TIMEOUT_MS\n", argv[0]);
    return 64;
  }
  const int threads = std::atoi(argv[1]), max_items = std::max(1, std::atoi(argv[3]));
  const long calls = std::atol(argv[2]);
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(std::atoll(argv[4]) + 1);
  const int timeout_ms = std::max(1, std::atoi(argv[5]));
  auto draw = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };

  fa::Pool pool(threads);
  pool.set_timeout(std::chrono::milliseconds(timeout_ms));
  pool.set_always_parallel(true);
  // slot i holds (call + 1) * 2 per run of item i in that call: a second run, or
  // a run for another call, leaves another value
  std::vector<std::atomic<long>> slot(max_items + 1);
  std::atomic<long> completed{0};
  std::atomic<bool> finished{false};

  std::thread watchdog([&] {
    long last = -1;
    auto since = std::chrono::steady_clock::now();
    while (!finished.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const long now = completed.load();
      if (now != last) {
        last = now;
        since = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - since > std::chrono::milliseconds(10L * timeout_ms)) {
        std::printf("calls %ld bad 0 hang\n", now);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  });

  long bad = 0, c = 0;
  int rc = 0;
  for (; c < calls && bad == 0; ++c) {
    const int n = 1 + (int)(draw() % (uint64_t)max_items);
    const int work = (int)(draw() % 300);
    for (auto& s : slot) s.store(0, std::memory_order_relaxed);
    const long mark = (c + 1) * 2;
    try {
      pool.run(
          [&](int i) {
            if (i < 0 || i > max_items) {
              slot[max_items].fetch_add(1);
              return;
            }
            slot[i].fetch_add(mark, std::memory_order_relaxed);
            volatile int spin = 0;
            for (int j = 0; j < work + (i % 5) * 40; ++j) spin = spin + j;
          },
          n);
    } catch (const fa::PoolError& e) {
      std::fprintf(stderr, "call %ld: %s\n", c, e.what());
      rc = 2;
      break;
    }
    for (int i = 0; i <= max_items; ++i) bad += slot[i].load(std::memory_order_relaxed) != (i < n ? mark : 0);
    completed.fetch_add(1);
  }
  finished.store(true);
  watchdog.join();
  const fa::PoolStats& st = pool.stats();
  std::printf("calls %ld bad %ld parallel %lld worker_items %lld stalls %lld\n", c, bad, (long long)st.parallel,
              (long long)st.worker_items, (long long)st.stalls);
  if (bad != 0) return 1;
  return rc;
}
