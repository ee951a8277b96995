// y = x W^T for a few rows of x: each weight row is read once, for every row of x, while it is in L1.
// Decode and verify steps multiply 1-16 rows by each weight matrix; a BLAS packs or re-reads the
// weights there. Built at first use by kernels/rows_matmul.py; any failure falls back to stock ops.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "activation.h"
#include "attention.h"
#include "realign.h"
#include "vectors.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace metrale;

namespace {

// A block holds XR x-rows by WR weight rows of accumulators in vector registers (32 with AVX-512, 16
// with AVX2). An FMA's latency needs about 8 independent accumulators to keep both FMA units busy,
// so fewer x-rows take more weight rows; a block never spills its registers.
#if defined(__AVX512F__)
template <int XR> constexpr int weight_rows_for = XR >= 3 ? 4 : 8;
#else
template <int XR> constexpr int weight_rows_for = XR >= 3 ? 2 : XR == 2 ? 4 : 8;
#endif
constexpr int kPanel = 8;  // weight rows every x-row group of a product reads while they sit in L1
constexpr int kMaxRows = 16;

// Lane sums, pairwise: at each half-width h, lane i < h of an output takes lane i + h; the same order
// for every output whatever block computes it. Many accumulators are summed at once, packed into
// shared vectors (a few shuffles per output instead of a scalar chain each).
// Lane i of halving (a, b) at half-width h: a holds kLanes / 2h outputs of 2h partial sums, b after it.
constexpr int source_lane(int i, int h, bool upper) {
  int per_vector = kLanes / (2 * h), output = i / h, base = output < per_vector ? output * 2 * h
                                                                             : kLanes + (output - per_vector) * 2 * h;
  return base + i % h + (upper ? h : 0);
}

template <int h, size_t... I>
inline vf halve(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, source_lane(I, h, false)...) +
         __builtin_shufflevector(a, b, source_lane(I, h, true)...);
}

// The sums of count accumulators (a power of two, at most kLanes) into the first count lanes of v[0].
template <int h, int count>
inline void lane_sums(vf* v) {
  if constexpr (h >= 1) {
    constexpr int pairs = count > 1 ? count / 2 : 1;
    for (int i = 0; i < pairs; ++i)
      v[i] = halve<h>(v[2 * i], v[count > 1 ? 2 * i + 1 : 0], std::make_index_sequence<kLanes>{});
    lane_sums<h / 2, pairs>(v);
  }
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
      for (int j = 0; j < WR; ++j) acc[r][j] = multiply_add(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < XR; ++r) {
    lane_sums<kLanes / 2, WR>(acc[r]);
    float sums[kLanes];
    __builtin_memcpy(sums, &acc[r][0], sizeof sums);
    for (int j = 0; j < WR; ++j) {
      float s = sums[j];
      for (int t = k; t < K; ++t) s += x[(size_t)r * K + t] * w[(size_t)(n + j) * K + t];  // unfused: contract off
      y[(size_t)r * N + n + j] = s;
    }
  }
}

// kPanel weight rows from n against XR x-rows, in blocks of as many weight rows as registers allow.
template <int XR>
inline void panel(const float* x, const float* w, float* y, int N, int K, int n) {
  constexpr int WR = weight_rows_for<XR>;
  for (int j = 0; j < kPanel; j += WR) block<XR, WR>(x, w, y, N, K, n + j);
}

// fn.template operator()<XR>(x rows, y rows) for each group of x-rows: fours, then the 1-3 left.
template <typename Fn>
inline void by_row_groups(const float* x, float* y, int M, int N, int K, Fn fn) {
  int r = 0;
  for (; r + 4 <= M; r += 4) fn.template operator()<4>(x + (size_t)r * K, y + (size_t)r * N);
  const float* xr = x + (size_t)r * K;
  float* yr = y + (size_t)r * N;
  switch (M - r) {
    case 3: fn.template operator()<3>(xr, yr); break;
    case 2: fn.template operator()<2>(xr, yr); break;
    case 1: fn.template operator()<1>(xr, yr); break;
    default: break;
  }
}

// Whole panels, then one weight row at a time for the rest. Every output's sum runs in the same
// order whatever block computes it: a row's bits never depend on how many rows came with it.
void span(const float* x, const float* w, float* y, int M, int N, int K, int n0, int n1) {
  int n = n0;
  for (; n + kPanel <= n1; n += kPanel)
    by_row_groups(x, y, M, N, K, [&]<int XR>(const float* xr, float* yr) { panel<XR>(xr, w, yr, N, K, n); });
  for (; n < n1; ++n)
    by_row_groups(x, y, M, N, K, [&]<int XR>(const float* xr, float* yr) { block<XR, 1>(xr, w, yr, N, K, n); });
}

// Helper threads that share one product's weight rows in chunks claimed one at a time, so a helper the
// OS has not scheduled costs nothing: the calling thread claims whatever is left. Helpers spin briefly
// between products (a step runs ~200 back to back) and sleep when the model is idle.
class Workers {
 public:
  static Workers& get() {
    // Never destroyed: its threads outlive the interpreter's teardown.
    static Workers* pool = new Workers(std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
    return *pool;
  }

  int count() const { return count_; }

  void run(const float* x, const float* w, float* y, int M, int N, int K) {
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    x_ = x, w_ = w, y_ = y, M_ = M, N_ = N, K_ = K;
    chunk_rows_ = std::max(kPanel, (32768 / std::max(K, 1)) / kPanel * kPanel);
    chunks_ = (N + chunk_rows_ - 1) / chunk_rows_;
    done_.store(0, std::memory_order_relaxed);
    uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store((uint64_t)g << 32, std::memory_order_relaxed);
    generation_.store(g);  // seq_cst: a helper going to sleep sees it, or is seen asleep below
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> g_(sleep_mutex_);
      wake_.notify_all();
    }
    work(g);
    while (done_.load(std::memory_order_acquire) < chunks_) {
    }
  }

 private:
  explicit Workers(unsigned n) : count_(n) {
    for (unsigned i = 1; i < n; ++i) std::thread([this] { loop(); }).detach();
  }

  // Claim chunks of generation g until none are left; a claim of a finished generation fails.
  void work(uint32_t g) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      if ((uint32_t)(c >> 32) != g || (int)(uint32_t)c >= chunks_) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      // The claimed chunk is unfinished, so run() has not moved on: the job's fields are g's.
      int n0 = (int)(uint32_t)c * chunk_rows_, n1 = std::min(N_, n0 + chunk_rows_);
      span(x_, w_, y_, M_, N_, K_, n0, n1);
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
  std::atomic<uint64_t> claim_{0};  // generation << 32 | next chunk
  std::atomic<int> done_{0}, sleepers_{0};
  const float* x_ = nullptr;
  const float* w_ = nullptr;
  float* y_ = nullptr;
  int M_ = 0, N_ = 0, K_ = 0, chunk_rows_ = 1, chunks_ = 0;
};

void rows_times_weights(const float* x, const float* w, float* y, int M, int N, int K) {
  Workers& pool = Workers::get();
  if (pool.count() <= 1 || (size_t)N * K < (1u << 16)) return span(x, w, y, M, N, K, 0, N);  // small: alone
  pool.run(x, w, y, M, N, K);
}

// A strided array's elements in row-major order.
std::vector<float> gather(const mx::array& x) {
  std::vector<float> out(x.size());
  std::vector<int> index(x.ndim(), 0);
  const float* base = x.data<float>();
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t offset = 0;
    for (int d = 0; d < (int)x.ndim(); ++d) offset += (int64_t)index[d] * x.strides()[d];
    out[i] = base[offset];
    for (int d = (int)x.ndim() - 1; d >= 0 && ++index[d] == x.shape(d); --d) index[d] = 0;
  }
  return out;
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
      if (x.flags().row_contiguous) {
        rows_times_weights(x.data<float>(), w.data<float>(), out.data<float>(), M, N, K);
      } else {
        std::vector<float> rows = gather(x);  // a few rows: copied here, not by an extra graph node
        rows_times_weights(rows.data(), w.data<float>(), out.data<float>(), M, N, K);
      }
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
  // Weights are evaluated and contiguous: no copy node per product (x is gathered in eval if strided).
  mx::array wc = w.is_available() && w.flags().row_contiguous ? w : mx::contiguous(w, false, stream);
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<RowsMatmul>(stream), {x, wc});
}

}  // namespace

NB_MODULE(_rows_matmul, m) {
  nb::module_::import_("mlx.core");  // the array type's bindings
  m.def("rows_matmul", &rows_matmul, nb::arg("x"), nb::arg("w"));
  m.attr("MAX_ROWS") = kMaxRows;
  m.def("few_rows_attention", &metrale::few_rows_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("scale"), nb::arg("causal"), nb::arg("mask").none());
  m.def("swiglu", &metrale::swiglu, nb::arg("gate"), nb::arg("up"));
  m.def("shift_rows", &metrale::shift_rows, nb::arg("x"), nb::arg("shifts"), nb::arg("end"));
}
