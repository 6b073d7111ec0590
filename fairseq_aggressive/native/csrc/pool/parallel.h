// The engine's thread pool: run(f, n) calls f(i) exactly once for every i in
// [0, n), on the calling thread and on whichever workers are running.
//
// Built for machines that also do other work (a server's other workers, a CI
// runner, a desktop, a VM whose virtual CPUs the host preempts), where a thread
// may stop between any two of its instructions for a whole time slice.
//
// The protocol (tests/test_pool_protocol.py checks every interleaving of a model
// of its atomic steps; tests/native/pool_stress.cpp runs it with each window
// between two atomic steps widened):
//
// 1. One atomic word is the whole claimable state of a job:
//        word_ = generation (bits 63..32) | items n (31..16) | next item (15..0).
//    A claim loads the word, checks that its generation is the claimer's and
//    next < n, and CASes it to next + 1.  Generation, bound and next are one
//    value, so a CAS that succeeds claims an item that exists in the job that is
//    current at that instant: a worker that loaded the word of an old job and was
//    delayed fails its CAS (the word changed) and then sees another generation.
//    (The same word value reappears only 2^32 calls later; a thread would have to
//    stop for all of them between the load and the CAS of one claim.)
// 2. The caller writes job_ and resets done_ before it publishes the word with a
//    release store, and does that only after the previous job's done_ reached its
//    n: a thread that claimed an item of the previous job had already counted it,
//    and no thread reads job_ or writes done_ except after a claim of the current
//    word (the claim's acquire orders those after the reset).
// 3. A call is complete when done_, the items counted by the threads that ran
//    them (each adds its own items once, after its last claim), reaches n.  The
//    bound used for that test is the one of the word the thread claimed from.
// 4. Sleeping: a thread that found nothing to do spins for a bounded time, then
//    blocks on a condition variable.  Lost wake-ups are excluded by the
//    seq_cst store/load pairs: a worker increments sleepers_ before it re-checks
//    the word under mu_, and the caller stores the word before it reads
//    sleepers_; the last worker adds to done_ before it reads caller_waiting_,
//    and the caller sets caller_waiting_ under done_mu_ before it re-checks done_.
//    In the single total order of seq_cst operations one of each pair sees the
//    other's store, so either the sleeper sees the new state or it is notified.
// 5. No call waits forever: a caller that has waited `timeout` for the last
//    items checks whether any worker still holds an item of the job (a worker
//    marks itself busy before its first claim and idle after it has counted its
//    items).  If one does, it is running (an item never blocks) and the caller
//    waits on.  If none does, a completion was lost: run() throws PoolError
//    with the pool's state, and the pool runs every later call on the caller
//    alone.
//
// Which thread runs an item never changes what the item computes, so results
// are bit-identical for any thread count and any load.
//
// A call whose caller had to wait far longer than an item takes (the worker
// holding it was descheduled) is a stall; so is a run of calls that no worker
// came to in time.  The pool then runs the next calls on the caller alone, twice
// as many after each further stall, and tries the workers again after that.  On
// an idle machine stalls do not happen and every call is parallel.
//
// Test-only compile switches (never in the engine's builds):
//   FA_POOL_FAULTS       widens every window between two atomic steps with
//                        yields and sleeps of up to 200 us;
//   FA_POOL_SPLIT_BOUND  reads the bound from a field stored apart from the
//                        word, a protocol with the lost-count race of point 1,
//                        so that the stress test is seen to catch it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pool/pool_support.h"

namespace fa {

class Pool {
 public:
  using Fn = std::function<void(int)>;
  static constexpr int kMaxItems = 0xFFFF;  // items of one job (a call of more runs as several jobs)

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
    busy_.reset(new Busy[n]);
    for (int k = 1; k < n; ++k) workers_.emplace_back([this, k] { loop(k); });
  }

  const PoolStats& stats() const { return stats_; }

  // The setters below, like resize(), are the caller's: only between run() calls.

  // How long a caller waits for the last items before it checks that a worker
  // still holds one (point 5 above).
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

#ifdef FA_TEST_HOOKS
  // Test hook (the test library and scripts/diagnostics/pool_stress.cpp only):
  // every call with more than one item is offered to the workers (no back-off
  // after stalls or calls the workers missed), so that stress tests exercise
  // the protocol on every call.
  void set_always_parallel(bool on) { always_parallel_ = on; }

  // Test hook (the test library only): the next parallel call counts one item
  // less than it ran, as a lost completion would; that call then fails with
  // PoolError after the timeout.
  void lose_next_count() { lose_count_ = true; }
#endif

  void run(const Fn& f, int n) {
    if (n <= 0) return;
    if (n > kMaxItems) {
      for (int base = 0; base < n; base += kMaxItems) run([&](int i) { f(base + i); }, std::min(kMaxItems, n - base));
      return;
    }
    if (n > 1) ++stats_.calls;
    #ifdef FA_TEST_HOOKS
    const bool alone = serial_left_ > 0 && !always_parallel_;
#else
    const bool alone = serial_left_ > 0;
#endif
    if (workers_.empty() || n == 1 || alone || broken_) {
      if (n > 1 && serial_left_ > 0) --serial_left_;
      for (int i = 0; i < n; ++i) f(i);
      return;
    }
    ++stats_.parallel;
    job_.store(&f, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
#ifdef FA_POOL_SPLIT_BOUND
    split_n_.store(n, std::memory_order_relaxed);
#endif
    FA_POOL_WINDOW();
    const uint32_t gen = ++gen_;
    word_.store(pack(gen, n), std::memory_order_seq_cst);  // publishes job_ and done_
    FA_POOL_WINDOW();
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> g(mu_);
      cv_.notify_all();
    }
    const auto t0 = std::chrono::steady_clock::now();
    int mine = 0, i, job_n;
    while (claim(gen, &i, &job_n)) {
      f(i);
      ++mine;
    }
    stats_.worker_items += n - mine;
    FA_POOL_WINDOW();
#ifdef FA_TEST_HOOKS
    const int counted = lose_count_ ? mine - 1 : mine;
    lose_count_ = false;
#else
    const int counted = mine;
#endif
    if (done_.fetch_add(counted, std::memory_order_acq_rel) + counted == n) {
      settle(mine == n ? Outcome::kAlone : Outcome::kShared);
      return;
    }
    // a worker holds an item: wait for it, spinning briefly, then blocking
    const auto t1 = std::chrono::steady_clock::now();
    wait_done(gen, n);
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

  static uint64_t pack(uint32_t gen, int n) { return (uint64_t)gen << 32 | (uint64_t)n << 16; }
  static uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> 32); }
  static int bound_of(uint64_t w) { return (int)((w >> 16) & 0xFFFF); }
  static int next_of(uint64_t w) { return (int)(w & 0xFFFF); }

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

  // The bound of the job whose word is w (point 1)
  int bound(uint64_t w) const {
#ifdef FA_POOL_SPLIT_BOUND
    (void)w;
    FA_POOL_WINDOW();
    return split_n_.load(std::memory_order_relaxed);
#else
    return bound_of(w);
#endif
  }

  // claim the next item of job gen and the job's item count; false when that job
  // has no item left or is not the current one
  bool claim(uint32_t gen, int* item, int* n) {
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      if (gen_of(w) != gen) return false;
      *n = bound(w);
      if (next_of(w) >= *n) return false;
      FA_POOL_WINDOW();
      // next < n <= 0xFFFF, so w + 1 only increments the next item
      if (word_.compare_exchange_weak(w, w + 1, std::memory_order_seq_cst, std::memory_order_acquire)) {
        *item = next_of(w);
        return true;
      }
    }
  }

  void wait_done(uint32_t gen, int n) {
    for (int spin = 0; spin < kCallerSpins; ++spin) {
      if (done_.load(std::memory_order_acquire) == n) return;
      cpu_relax();
      if ((spin & 255) == 255) std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lk(done_mu_);
    caller_waiting_.store(true, std::memory_order_seq_cst);
    FA_POOL_WINDOW();
    auto finished = [&] { return done_.load(std::memory_order_seq_cst) == n; };
    while (!done_cv_.wait_for(lk, timeout_, finished)) {
      // no completion for timeout_: a worker that holds an item is running it
      bool held = false;
      for (int k = 1; k < size(); ++k) held |= busy_[k].gen.load(std::memory_order_seq_cst) == gen;
      if (held) continue;
      if (finished()) break;
      caller_waiting_.store(false, std::memory_order_relaxed);
      broken_ = true;
      throw PoolError(state(gen, n));
    }
    caller_waiting_.store(false, std::memory_order_relaxed);
  }

  std::string state(uint32_t gen, int n) const {
    const uint64_t w = word_.load(std::memory_order_seq_cst);
    return "thread pool: a call of " + std::to_string(n) + " items made no progress for " +
           std::to_string(timeout_.count()) + " ms and no worker holds one of its items (job " +
           std::to_string(gen) + "; word: job " + std::to_string(gen_of(w)) + ", next item " +
           std::to_string(next_of(w)) + " of " + std::to_string(bound_of(w)) + "; items counted done " +
           std::to_string(done_.load()) + "; " + std::to_string(sleepers_.load()) + " of " +
           std::to_string(size() - 1) + " workers asleep): a completion was lost; this pool runs every " +
           "later call on the calling thread";
  }

  void loop(int k) {
    std::atomic<uint32_t>& busy = busy_[k].gen;
    uint32_t seen = gen_of(word_.load(std::memory_order_acquire));
    for (;;) {
      if (!wait_job(seen)) return;
      FA_POOL_WINDOW();
      const uint32_t gen = gen_of(word_.load(std::memory_order_acquire));
      seen = gen;
      // marked busy before the first claim, idle after the count: a caller that
      // reads "not busy" after its claims ended knows this worker holds no item
      busy.store(gen, std::memory_order_seq_cst);
      int mine = 0, i, n = 0;
      while (claim(gen, &i, &n)) {
        FA_POOL_WINDOW();
        // the job cannot end while this item is uncounted, so job_ is its own
        (*job_.load(std::memory_order_acquire))(i);
        ++mine;
      }
      if (mine > 0) {
        FA_POOL_WINDOW();
        if (done_.fetch_add(mine, std::memory_order_seq_cst) + mine == n) {
          FA_POOL_WINDOW();
          if (caller_waiting_.load(std::memory_order_seq_cst)) {
            std::lock_guard<std::mutex> g(done_mu_);
            done_cv_.notify_one();
          }
        }
      }
      busy.store(gen - 1, std::memory_order_seq_cst);  // any value but gen
    }
  }

  // wait for a job after `seen` (spin about kWorkerSpinUs, then sleep); false on quit
  bool wait_job(uint32_t seen) {
    auto fresh = [&] { return gen_of(word_.load(std::memory_order_seq_cst)) != seen; };
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
    FA_POOL_WINDOW();
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

  // a worker's mark: the generation whose items it may hold (own cache line)
  struct alignas(64) Busy {
    std::atomic<uint32_t> gen{0};
  };

  std::vector<std::thread> workers_;
  // the current job: word_ = generation << 32 | items << 16 | next item to claim
  std::atomic<uint64_t> word_{0};
  std::atomic<const Fn*> job_{nullptr};
  std::atomic<int> done_{0};
#ifdef FA_POOL_SPLIT_BOUND
  std::atomic<int> split_n_{0};
#endif
  uint32_t gen_ = 0;  // the caller's; word_ carries it to the workers
  std::unique_ptr<Busy[]> busy_;
  // workers asleep for the next job
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  // the caller asleep for the last items
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::atomic<bool> caller_waiting_{false};
  std::chrono::milliseconds timeout_{60000};
  // the caller's: calls left to run alone after a stall, and the next such count
  int serial_left_ = 0, backoff_ = kMinBackoff, shared_ = 0, alone_ = 0;
  bool broken_ = false;
#ifdef FA_TEST_HOOKS
  bool lose_count_ = false, always_parallel_ = false;
#endif
  PoolStats stats_;
};

}  // namespace fa
