// Helper threads that share one kernel call's work in chunks claimed one at a time, so a helper the OS
// has not scheduled costs nothing: the calling thread claims whatever is left. Helpers spin briefly
// between calls (a step runs ~300 back to back) and sleep when the model is idle.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace metrale {

class Workers {
 public:
  static Workers& get() {
    // Never destroyed: its threads outlive the interpreter's teardown.
    static Workers* pool = new Workers(std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
    return *pool;
  }

  int count() const { return count_; }

  // fn(c) for every chunk c < chunks, shared with the helpers; returns when all are done.
  template <typename Fn>
  void run(int chunks, const Fn& fn) {
    if (chunks > kMaxChunks) {  // more than a claim word holds: alone (no caller comes near)
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    job_ = &fn;
    call_ = [](const void* f, int c) { (*static_cast<const Fn*>(f))(c); };
    done_.store(0, std::memory_order_relaxed);
    uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    // Released after the job: a claim of this word sees it. The word carries its own chunk count, so a
    // helper still in the last call's work() never reads this call's count against that call's word
    // (it did: it claimed a chunk past the last call's end, ran this call's job, counted it done, and
    // run() returned while a chunk still ran in its frame; a served step crashed in attention).
    claim_.store(word(g, chunks, 0), std::memory_order_release);
    generation_.store(g);  // seq_cst: a helper going to sleep sees it, or is seen asleep below
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> g_(sleep_mutex_);
      wake_.notify_all();
    }
    work(g);
    while (done_.load(std::memory_order_acquire) < chunks) {
    }
  }

 private:
  explicit Workers(unsigned n) : count_(n) {
    for (unsigned i = 1; i < n; ++i) std::thread([this] { loop(); }).detach();
  }

  // A claim word: the generation (32 bits), its chunk count and the next chunk (16 bits each).
  static constexpr int kMaxChunks = 0xFFFF;
  static uint64_t word(uint32_t g, int chunks, int next) {
    return (uint64_t)g << 32 | (uint64_t)chunks << 16 | (uint64_t)next;
  }

  // Claim chunks of generation g until none are left; a claim of a finished generation fails.
  void work(uint32_t g) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      int chunks = (int)(c >> 16 & 0xFFFF), next = (int)(c & 0xFFFF);
      if ((uint32_t)(c >> 32) != g || next >= chunks) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      // An unfinished chunk of g was claimed, so run() has not moved on: the job's fields are g's.
      call_(job_, next);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void loop() {
    uint32_t seen = 0;
    for (;;) {
      uint32_t g = generation_.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < 20000; ++spin) g = generation_.load(std::memory_order_acquire);
      if (g == seen) {
        std::unique_lock<std::mutex> hold(sleep_mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(hold, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        g = generation_.load();
      }
      seen = g;
      work(g);
    }
  }

  const int count_;
  std::mutex run_mutex_, sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint64_t> claim_{0};  // word(generation, chunks, next chunk)
  std::atomic<int> done_{0}, sleepers_{0};
  const void* job_ = nullptr;
  void (*call_)(const void*, int) = nullptr;
};

}  // namespace metrale
