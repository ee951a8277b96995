// y = x W^T for a few rows of x: each weight row is read once, for every row of x, while it is in L1.
// Decode and verify steps multiply 1-16 rows by each weight matrix; a BLAS packs or re-reads the
// weights there. Built at first use by kernels/rows_matmul.py; any failure falls back to stock ops.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

// 4 x-rows by kWeightRows weight rows of accumulators, plus their operands, fit the vector registers:
// 32 with AVX-512, 16 with AVX2 (where 4 x 4 would spill).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kWeightRows = 4;
#else
constexpr int kLanes = 8;
constexpr int kWeightRows = 2;
#endif
constexpr int kMaxRows = 16;
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef float vfu __attribute__((vector_size(kLanes * 4), aligned(4)));

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }

inline float lane_sum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// XR rows of x against WR weight rows starting at n: y[r][n + j] for r < XR, j < WR.
template <int XR, int WR>
inline void block(const float* x, const float* w, float* y, int N, int K, int n) {
  vf acc[XR][WR];
  for (int r = 0; r < XR; ++r)
    for (int j = 0; j < WR; ++j) acc[r][j] = vf{};
  int k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    vf wv[WR];
    for (int j = 0; j < WR; ++j) wv[j] = load(w + (size_t)(n + j) * K + k);
    for (int r = 0; r < XR; ++r) {
      vf xv = load(x + (size_t)r * K + k);
      for (int j = 0; j < WR; ++j) acc[r][j] += xv * wv[j];
    }
  }
  for (int r = 0; r < XR; ++r)
    for (int j = 0; j < WR; ++j) {
      float s = lane_sum(acc[r][j]);
      for (int t = k; t < K; ++t) s += x[(size_t)r * K + t] * w[(size_t)(n + j) * K + t];
      y[(size_t)r * N + n + j] = s;
    }
}

template <int WR>
inline void rows_block(const float* x, const float* w, float* y, int M, int N, int K, int n) {
  int r = 0;
  for (; r + 4 <= M; r += 4) block<4, WR>(x + (size_t)r * K, w, y + (size_t)r * N, N, K, n);
  switch (M - r) {
    case 3: block<3, WR>(x + (size_t)r * K, w, y + (size_t)r * N, N, K, n); break;
    case 2: block<2, WR>(x + (size_t)r * K, w, y + (size_t)r * N, N, K, n); break;
    case 1: block<1, WR>(x + (size_t)r * K, w, y + (size_t)r * N, N, K, n); break;
    default: break;
  }
}

void span(const float* x, const float* w, float* y, int M, int N, int K, int n0, int n1) {
  int n = n0;
  for (; n + kWeightRows <= n1; n += kWeightRows) rows_block<kWeightRows>(x, w, y, M, N, K, n);
  for (; n < n1; ++n) rows_block<1>(x, w, y, M, N, K, n);
}

// A fixed set of workers that split one product's weight rows; they spin briefly between products
// (a step runs ~200 of them back to back) and sleep when the model is idle.
class Workers {
 public:
  static Workers& get() {
    // Never destroyed: its threads outlive the interpreter's teardown.
    static Workers* pool = new Workers(std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
    return *pool;
  }

  void run(const std::function<void(int, int)>& part) {
    std::unique_lock<std::mutex> hold(run_mutex_);  // one product at a time
    job_ = &part;
    pending_.store(count_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    { std::lock_guard<std::mutex> g(sleep_mutex_); }
    wake_.notify_all();
    part(0, count_);
    while (pending_.load(std::memory_order_acquire) > 0) {
    }
  }

  int count() const { return count_; }

 private:
  explicit Workers(unsigned n) : count_(n) {
    for (unsigned i = 1; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
    for (auto& t : threads_) t.detach();
  }

  void loop(int index) {
    unsigned long seen = 0;
    for (;;) {
      unsigned long now = generation_.load(std::memory_order_acquire);
      for (int spin = 0; now == seen && spin < 20000; ++spin) now = generation_.load(std::memory_order_acquire);
      if (now == seen) {
        std::unique_lock<std::mutex> g(sleep_mutex_);
        wake_.wait(g, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        now = generation_.load(std::memory_order_acquire);
      }
      seen = now;
      (*job_)(index, count_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  const int count_;
  std::vector<std::thread> threads_;
  std::mutex run_mutex_, sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<unsigned long> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int, int)>* job_ = nullptr;
};

void rows_times_weights(const float* x, const float* w, float* y, int M, int N, int K) {
  Workers& pool = Workers::get();
  int blocks = (N + kWeightRows - 1) / kWeightRows;
  int threads = std::min(pool.count(), std::max(1, (int)(((size_t)N * K) >> 16)));  // small ones alone
  if (threads <= 1) return span(x, w, y, M, N, K, 0, N);
  pool.run([&](int index, int count) {
    if (index >= threads) return;
    int per = (blocks + threads - 1) / threads;
    int n0 = std::min(N, index * per * kWeightRows), n1 = std::min(N, (index + 1) * per * kWeightRows);
    if (n0 < n1) span(x, w, y, M, N, K, n0, n1);
  });
}

class RowsMatmul : public mx::Primitive {
 public:
  explicit RowsMatmul(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    int K = x.shape(-1), N = w.shape(0), M = (int)(x.size() / K);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_output_array(out);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                      out = mx::array::unsafe_weak_copy(out), M, N, K]() mutable {
      rows_times_weights(x.data<float>(), w.data<float>(), out.data<float>(), M, N, K);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("rows_matmul runs on the CPU only");
  }

  const char* name() const override { return "RowsMatmul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// x [..., K] times w [N, K] transposed: [..., N]. float32, at most kMaxRows rows of x.
mx::array rows_matmul(const mx::array& x, const mx::array& w) {
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32 || w.ndim() != 2 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("rows_matmul: float32 x [..., K] and w [N, K]");
  if ((int)(x.size() / x.shape(-1)) > kMaxRows) throw std::invalid_argument("rows_matmul: too many rows");
  auto stream = mx::default_stream(mx::Device::cpu);
  mx::array xc = mx::contiguous(x, false, stream), wc = mx::contiguous(w, false, stream);
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<RowsMatmul>(stream), {xc, wc});
}

}  // namespace

NB_MODULE(_rows_matmul, m) {
  nb::module_::import_("mlx.core");  // the array type's bindings
  m.def("rows_matmul", &rows_matmul, nb::arg("x"), nb::arg("w"));
  m.attr("MAX_ROWS") = kMaxRows;
}
