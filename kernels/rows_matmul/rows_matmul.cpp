// y = x W^T for a few rows of x: each weight row is read once, for every row of x, while it is in L1.
// Decode and verify steps multiply 1-16 rows by each weight matrix; a BLAS packs or re-reads the
// weights there. Built at first use by kernels/rows_matmul.py; any failure falls back to stock ops.
// The weights may be float16 where each value is one exactly (the default model's are): a step reads
// half the bytes, and each is widened in a register to the float32 it stands for, so every sum is
// the float32 weights' bit for bit.

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

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "activation.h"
#include "attention.h"
#include "dispatch.h"
#include "layer_ops.h"
#include "realign.h"
#include "strided.h"
#include "vectors.h"
#include "workers.h"

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

using half = mx::float16_t;

inline vf load_weights(const float* p) { return load(p); }
inline float weight_at(const float* p) { return *p; }
#if defined(__AVX512F__)
inline vf load_weights(const half* p) { return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
#elif defined(__F16C__)
inline vf load_weights(const half* p) { return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
#endif
inline float weight_at(const half* p) { return static_cast<float>(*p); }
#if defined(__AVX512F__) || defined(__F16C__)
constexpr bool kHalfWeights = true;
#else
constexpr bool kHalfWeights = false;  // no conversion instruction: float16 weights are refused
#endif

// XR rows of x against WR weight rows starting at n: y[r][n + j] for r < XR, j < WR, plus res[r][n + j]
// where a residual is added (res not null; the same one rounding as adding it after).
template <int XR, int WR, typename W>
inline void block(const float* x, const W* w, float* y, const float* res, int N, int K, int n) {
  vf acc[XR][WR];
  for (int r = 0; r < XR; ++r)
    for (int j = 0; j < WR; ++j) acc[r][j] = vf{};
  // The next block's weight rows are asked for while this one computes, without keeping them in the
  // caches (locality 0): a block reads only a few KB of each row, too short a stream for the hardware
  // prefetcher to be ahead, so each block waited for memory before computing.
  const W* next = w + (size_t)std::min(n + WR, N - WR) * K;  // the last block asks for itself
  int k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    vf wv[WR];
    for (int j = 0; j < WR; ++j) __builtin_prefetch(next + (size_t)j * K + k, 0, 0);
    for (int j = 0; j < WR; ++j) wv[j] = load_weights(w + (size_t)(n + j) * K + k);
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
      for (int t = k; t < K; ++t) s += x[(size_t)r * K + t] * weight_at(w + (size_t)(n + j) * K + t);  // unfused: contract off
      y[(size_t)r * N + n + j] = res ? res[(size_t)r * N + n + j] + s : s;
    }
  }
}

// kPanel weight rows from n against XR x-rows, in blocks of as many weight rows as registers allow.
template <int XR, typename W>
inline void panel(const float* x, const W* w, float* y, const float* res, int N, int K, int n) {
  constexpr int WR = weight_rows_for<XR>;
  for (int j = 0; j < kPanel; j += WR) block<XR, WR>(x, w, y, res, N, K, n + j);
}

// fn.template operator()<XR>(x rows, y rows, residual rows) for each group of x-rows: fours, then the
// 1-3 left.
template <typename Fn>
inline void by_row_groups(const float* x, float* y, const float* res, int M, int N, int K, Fn fn) {
  auto at = [&](int r) { return res ? res + (size_t)r * N : nullptr; };
  int r = 0;
  for (; r + 4 <= M; r += 4) fn.template operator()<4>(x + (size_t)r * K, y + (size_t)r * N, at(r));
  const float* xr = x + (size_t)r * K;
  float* yr = y + (size_t)r * N;
  switch (M - r) {
    case 3: fn.template operator()<3>(xr, yr, at(r)); break;
    case 2: fn.template operator()<2>(xr, yr, at(r)); break;
    case 1: fn.template operator()<1>(xr, yr, at(r)); break;
    default: break;
  }
}

// Whole panels, then one weight row at a time for the rest. Every output's sum runs in the same
// order whatever block computes it: a row's bits never depend on how many rows came with it.
template <typename W>
void span(const float* x, const W* w, float* y, const float* res, int M, int N, int K, int n0, int n1) {
  int n = n0;
  for (; n + kPanel <= n1; n += kPanel)
    by_row_groups(x, y, res, M, N, K,
                  [&]<int XR>(const float* xr, float* yr, const float* rr) { panel<XR>(xr, w, yr, rr, N, K, n); });
  for (; n < n1; ++n)
    by_row_groups(x, y, res, M, N, K,
                  [&]<int XR>(const float* xr, float* yr, const float* rr) { block<XR, 1>(xr, w, yr, rr, N, K, n); });
}

template <typename W>
void rows_times_weights(const float* x, const W* w, float* y, const float* res, int M, int N, int K) {
  Workers& pool = Workers::get();
  if (pool.count() <= 1 || (size_t)N * K < (1u << 16)) return span(x, w, y, res, M, N, K, 0, N);  // small: alone
  // Chunks of weight rows of about 128 KiB: small enough to share out, large enough to stream.
  int chunk_rows = std::max(kPanel, (32768 / std::max(K, 1)) / kPanel * kPanel);
  pool.run((N + chunk_rows - 1) / chunk_rows, [&](int c) {
    int n0 = c * chunk_rows;
    span(x, w, y, res, M, N, K, n0, std::min(N, n0 + chunk_rows));
  });
}

class RowsMatmul : public mx::Primitive {
 public:
  explicit RowsMatmul(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    dispatch(stream(), inputs, outputs, [](std::vector<mx::array>& held, std::vector<mx::array>& outs) {
      mx::array& out = outs[0];
      const mx::array &x = held[0], &w = held[1];
      int K = x.shape(-1), N = w.shape(0), M = (int)(x.size() / K);
      // A few rows: a strided x or residual is copied here, not by an extra graph node.
      std::vector<float> x_rows = x.flags().row_contiguous ? std::vector<float>() : gather(x);
      const float* xp = x_rows.empty() ? x.data<float>() : x_rows.data();
      std::vector<float> res_rows = held.size() < 3 || held[2].flags().row_contiguous ? std::vector<float>()
                                                                                     : gather(held[2]);
      const float* res = held.size() < 3 ? nullptr : res_rows.empty() ? held[2].data<float>() : res_rows.data();
      if (w.dtype() == mx::float16)
        rows_times_weights(xp, w.data<half>(), out.data<float>(), res, M, N, K);
      else
        rows_times_weights(xp, w.data<float>(), out.data<float>(), res, M, N, K);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("rows_matmul runs on the CPU only");
  }

  const char* name() const override { return "RowsMatmul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// x [..., K] times w [N, K] transposed, plus the residual where one is given: [..., N]. x float32, w
// float32 or float16, at most kMaxRows rows of x.
mx::array rows_matmul(const mx::array& x, const mx::array& w, const std::optional<mx::array>& residual) {
  bool weights_ok = w.dtype() == mx::float32 || (kHalfWeights && w.dtype() == mx::float16);
  if (x.dtype() != mx::float32 || !weights_ok || w.ndim() != 2 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("rows_matmul: float32 x [..., K] and w [N, K] (float32, or float16 if built with it)");
  if ((int)(x.size() / x.shape(-1)) > kMaxRows) throw std::invalid_argument("rows_matmul: too many rows");
  auto stream = mx::default_stream(mx::Device::cpu);
  // Weights are evaluated and contiguous: no copy node per product (x is gathered in eval if strided).
  mx::array wc = w.is_available() && w.flags().row_contiguous ? w : mx::contiguous(w, false, stream);
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs = {x, wc};
  if (residual) {
    if (residual->shape() != shape || residual->dtype() != mx::float32)
      throw std::invalid_argument("rows_matmul: a float32 residual shaped as the product");
    inputs.push_back(*residual);
  }
  return mx::array(shape, mx::float32, std::make_shared<RowsMatmul>(stream), std::move(inputs));
}

}  // namespace

NB_MODULE(_rows_matmul, m) {
  nb::module_::import_("mlx.core");  // the array type's bindings
  m.def("rows_matmul", &rows_matmul, nb::arg("x"), nb::arg("w"), nb::arg("residual") = nb::none());
  m.attr("MAX_ROWS") = kMaxRows;
  m.attr("HALF_WEIGHTS") = kHalfWeights;
  m.def("few_rows_attention", &metrale::few_rows_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("scale"), nb::arg("causal"), nb::arg("mask").none(), nb::arg("length") = nb::none());
  m.def("swiglu", &metrale::swiglu, nb::arg("gate"), nb::arg("up") = nb::none());
  m.def("rms_norm", &metrale::rms_norm, nb::arg("x"), nb::arg("weight"), nb::arg("eps"));
  m.def("add_rms_norm", &metrale::add_rms_norm, nb::arg("x"), nb::arg("r"), nb::arg("weight"), nb::arg("eps"));
  m.def("heads_rope", &metrale::heads_rope, nb::arg("qkv"), nb::arg("offset"), nb::arg("inv_freq"),
        nb::arg("q_heads"), nb::arg("kv_heads"), nb::arg("traditional"));
  m.def("shift_rows", &metrale::shift_rows, nb::arg("x"), nb::arg("shifts"), nb::arg("end"));
}
