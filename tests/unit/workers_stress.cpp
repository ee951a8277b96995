// Stress check of kernels/rows_matmul/workers.h, built and run by test_workers_pool.py: back-to-back
// calls of few chunks each, every chunk checking that its call is still running and counting itself.
// Prints "ok" or what went wrong, and exits 1 on a fault it saw.
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "workers.h"

int main(int argc, char** argv) {
  long calls = argc > 1 ? std::atol(argv[1]) : 200000;
  metrale::Workers& pool = metrale::Workers::get();
  std::atomic<long> late{0}, wrong{0};
  for (long i = 0; i < calls; ++i) {
    int chunks = 1 + (int)(i % 7);
    std::atomic<int> live{1};
    std::atomic<int> seen[8] = {};
    pool.run(chunks, [&](int c) {
      if (live.load() != 1) late.fetch_add(1);
      if (c < 0 || c >= chunks) wrong.fetch_add(1);
      else seen[c].fetch_add(1);
    });
    for (int c = 0; c < chunks; ++c)
      if (seen[c].load() != 1) wrong.fetch_add(1);
    live.store(0);
  }
  if (late.load() || wrong.load()) {
    std::printf("late %ld wrong %ld of %ld calls\n", late.load(), wrong.load(), calls);
    return 1;
  }
  std::printf("ok %ld calls on %d threads\n", calls, pool.count());
  return 0;
}
