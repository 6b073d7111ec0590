// The engine's thread pool: run(f, n) calls f(i) exactly once for every i in
// [0, n), on the calling thread and on whichever workers are running.
//
// Built for machines that also do other work (a server's other workers, a CI
// runner, a desktop), where a worker may not be scheduled for a whole time slice:
//
// - Work items are claimed one at a time from a job word that holds the job's
//   generation and its next item; a claim succeeds only for the current job, so
//   a worker that wakes late finds nothing left and goes back to waiting.  An
//   item is never run twice and never lost.
// - A call completes when every item is done, counted by items, not by workers
//   that checked in: when the caller has done every item itself it returns at
//   once, whatever the workers are doing.
// - The only wait left is for an item that a worker claimed and has not
//   finished.  Every spin (the caller's for such an item, a worker's for the
//   next job) is bounded and then blocks on a condition variable.
// - A call whose caller had to wait far longer than an item takes (the worker
//   holding it was descheduled) is a stall; so is a run of calls that no worker
//   came to in time.  The pool then runs the next calls on the caller alone, twice
//   as many after each further stall, and tries the workers again after that.  On
//   an idle machine stalls do not happen and every call is parallel.
//
// Which thread runs an item never changes what the item computes, so results
// are bit-identical for any thread count and any load.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fa {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Counters of a pool since it was made (fa_pool_stats).
struct PoolStats {
  int64_t calls = 0;          // run() calls with more than one item
  int64_t parallel = 0;       // of those, offered to the workers
  int64_t worker_items = 0;   // items run by workers
  int64_t waits = 0;          // calls whose caller waited for a worker's item
  int64_t stalls = 0;         // waits far longer than an item (the worker was descheduled)
  int64_t wait_ns = 0;        // total time callers waited for workers' items
};

class Pool {
 public:
  using Fn = std::function<void(int)>;

  explicit Pool(int n = 1) { resize(n); }
  ~Pool() { stop(); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int size() const { return (int)workers_.size() + 1; }

  // n threads in all (the caller and n - 1 workers); only between run() calls
  void resize(int n) {
    if (n < 1) n = 1;
    if (n == size()) return;
    stop();
    quit_.store(false);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }

  const PoolStats& stats() const { return stats_; }

  void run(const Fn& f, int n) {
    if (n <= 0) return;
    if (n > 1) ++stats_.calls;
    if (workers_.empty() || n == 1 || serial_left_ > 0) {
      if (n > 1 && serial_left_ > 0) --serial_left_;
      for (int i = 0; i < n; ++i) f(i);
      return;
    }
    ++stats_.parallel;
    job_.store(&f, std::memory_order_relaxed);
    n_items_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint32_t gen = ++gen_;
    word_.store((uint64_t)gen << 32, std::memory_order_seq_cst);  // publishes the three above
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> g(mu_);
      cv_.notify_all();
    }
    const auto t0 = std::chrono::steady_clock::now();
    int mine = 0, i;
    while (claim(gen, &i)) {
      f(i);
      ++mine;
    }
    stats_.worker_items += n - mine;
    if (done_.fetch_add(mine, std::memory_order_acq_rel) + mine == n) {
      settle(mine == n ? Outcome::kAlone : Outcome::kShared);
      return;
    }
    // a worker holds an item: wait for it, spinning briefly, then blocking
    const auto t1 = std::chrono::steady_clock::now();
    wait_done(n);
    const auto t2 = std::chrono::steady_clock::now();
    ++stats_.waits;
    const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
    stats_.wait_ns += waited;
    // the caller's own time per item is what an item costs; a wait many times that
    // long means the worker was not running
    const int64_t per_item = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() /
                             std::max(mine, 1);
    settle(waited > std::max<int64_t>(kStallMinNs, 8 * per_item) ? Outcome::kStalled : Outcome::kShared);
  }

 private:
  static constexpr int64_t kStallMinNs = 200000;  // 0.2 ms: far above any item of a pass
  static constexpr int kMinBackoff = 16, kMaxBackoff = 1 << 14, kSharedCalls = 64, kAloneCalls = 8;
  static constexpr int kCallerSpins = 4000, kWorkerSpinUs = 100;

  // How a parallel call went: the workers took a share of the items; the caller did
  // them all (no worker came in time); or the caller waited far longer than an item
  // takes for a worker's item (that worker was not running).
  enum class Outcome { kShared, kAlone, kStalled };

  // A stall, or kAloneCalls calls in a row that no worker came to, send the next
  // backoff_ calls to the caller alone (no wake-ups, no waiting) and double backoff_;
  // kSharedCalls shared calls in a row halve it.  So on an idle machine every call
  // is parallel, and on a busy one the workers are tried less and less often.
  void settle(Outcome how) {
    if (how == Outcome::kShared) {
      alone_ = 0;
      if (++shared_ >= kSharedCalls) {
        shared_ = 0;
        backoff_ = std::max(backoff_ / 2, kMinBackoff);
      }
      return;
    }
    shared_ = 0;
    if (how == Outcome::kAlone && ++alone_ < kAloneCalls) return;
    if (how == Outcome::kStalled) ++stats_.stalls;
    alone_ = 0;
    serial_left_ = backoff_;
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }

  // claim the next item of job gen; false when that job has none left (or is over)
  bool claim(uint32_t gen, int* item) {
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      if ((uint32_t)(w >> 32) != gen) return false;
      const int next = (int)(uint32_t)w;
      if (next >= n_items_.load(std::memory_order_relaxed)) return false;
      if (word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        *item = next;
        return true;
      }
    }
  }

  void wait_done(int n) {
    for (int spin = 0; spin < kCallerSpins; ++spin) {
      if (done_.load(std::memory_order_acquire) == n) return;
      cpu_relax();
      if ((spin & 255) == 255) std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lk(done_mu_);
    caller_waiting_.store(true, std::memory_order_seq_cst);
    done_cv_.wait(lk, [&] { return done_.load(std::memory_order_seq_cst) == n; });
    caller_waiting_.store(false, std::memory_order_relaxed);
  }

  void loop() {
    uint32_t seen = (uint32_t)(word_.load(std::memory_order_acquire) >> 32);
    for (;;) {
      if (!wait_job(seen)) return;
      const uint32_t gen = (uint32_t)(word_.load(std::memory_order_acquire) >> 32);
      seen = gen;
      int mine = 0, i, n = 0;
      while (claim(gen, &i)) {
        // the job cannot end while this item is unfinished, so job_ and n_items_ are its own
        (*job_.load(std::memory_order_acquire))(i);
        n = n_items_.load(std::memory_order_relaxed);
        ++mine;
      }
      if (mine == 0) continue;  // woke late: nothing left
      if (done_.fetch_add(mine, std::memory_order_seq_cst) + mine == n &&
          caller_waiting_.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> g(done_mu_);
        done_cv_.notify_one();
      }
    }
  }

  // wait for a job after `seen` (spin about kWorkerSpinUs, then sleep); false on quit
  bool wait_job(uint32_t seen) {
    auto fresh = [&] { return (uint32_t)(word_.load(std::memory_order_seq_cst) >> 32) != seen; };
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      if (quit_.load(std::memory_order_relaxed)) return false;
      if (fresh()) return true;
      cpu_relax();
      if ((spin & 63) == 63) {
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kWorkerSpinUs)) break;
      }
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return fresh() || quit_.load(); });
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return !quit_.load();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  // the current job: word_ = generation << 32 | next item to claim
  std::atomic<uint64_t> word_{0};
  std::atomic<const Fn*> job_{nullptr};
  std::atomic<int> n_items_{0}, done_{0};
  uint32_t gen_ = 0;  // the caller's; word_ carries it to the workers
  // workers asleep for the next job
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  // the caller asleep for the last items
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::atomic<bool> caller_waiting_{false};
  // the caller's: calls left to run alone after a stall, and the next such count
  int serial_left_ = 0, backoff_ = kMinBackoff, shared_ = 0, alone_ = 0;
  PoolStats stats_;
};

}  // namespace fa
