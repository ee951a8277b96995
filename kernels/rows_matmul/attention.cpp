// Attention of a few query rows over a KV cache, fused: decode and verify steps (1-16 rows).
// MLX's CPU backend composes attention from a dozen ops per layer (a mask, two batched products,
// a softmax, copies of the cache's strided views), about 0.2 ms a layer at any context; here each
// query row reads its keys and values once, straight from the cache's buffer.
//
// Each row is computed alone, over its allowed keys in ascending order, so a row's output is bit for
// bit the same whatever rows came with it: a verify row equals the plain step at its position.

#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "vectors.h"

namespace metrale {
namespace {

// A strided 4-d view: element (a, b, c, d) at data[a*s0 + b*s1 + c*s2 + d] (the last stride is 1).
template <typename T>
struct View {
  const T* data;
  int64_t s0, s1, s2;
  const T* at(int a, int b, int c) const { return data + a * s0 + b * s1 + c * s2; }
};

template <typename T>
View<T> view_of(const mx::array& x) {
  auto& s = x.strides();
  return {x.data<T>(), s[0], s[1], s[2]};
}

float dot(const float* a, const float* b, int D) {
  int d = 0;
  vf acc = vf{};
  for (; d + kLanes <= D; d += kLanes) acc = multiply_add(load(a + d), load(b + d), acc);
  float s = lane_total(acc);
  for (; d < D; ++d) s += a[d] * b[d];  // unfused: contract off
  return s;
}

// out += p * v, D floats.
void add_scaled(float* out, const float* v, float p, int D) {
  int d = 0;
  vf pv = vf{} + p;
  for (; d + kLanes <= D; d += kLanes) store(out + d, multiply_add(pv, load(v + d), load(out + d)));
  for (; d < D; ++d) out[d] += p * v[d];
}

struct Job {
  View<float> q, k, v;
  View<bool> mask;  // data null: no mask array
  bool causal;
  float scale;
  int B, Hq, Hkv, L, S, D;
  float* out;  // [B, L, Hq * D] contiguous: heads merged, as the output projection takes them
};

// One query row: softmax(scale q K^T) V over the keys this row may see.
void row(const Job& j, int b, int h, int i, std::vector<float>& scores) {
  const float* q = j.q.at(b, h, i);
  int kvh = h / (j.Hq / j.Hkv);
  int limit = j.causal ? j.S - j.L + i + 1 : j.S;  // the cache ends with these L rows
  const bool* allowed = j.mask.data ? j.mask.at(b, h, i) : nullptr;
  float top = -std::numeric_limits<float>::infinity();
  scores.resize(j.S);
  for (int t = 0; t < limit; ++t) {
    if (allowed && !allowed[t]) continue;
    float s = dot(q, j.k.at(b, kvh, t), j.D) * j.scale;
    scores[t] = s;
    top = std::max(top, s);
  }
  float* out = j.out + (((size_t)b * j.L + i) * j.Hq + h) * j.D;
  std::fill(out, out + j.D, 0.0f);
  if (top == -std::numeric_limits<float>::infinity()) return;  // nothing visible: zeros
  float total = 0.0f;
  for (int t = 0; t < limit; ++t) {
    if (allowed && !allowed[t]) continue;
    float p = std::exp(scores[t] - top);
    total += p;
    add_scaled(out, j.v.at(b, kvh, t), p, j.D);
  }
  float inverse = 1.0f / total;
  for (int d = 0; d < j.D; ++d) out[d] *= inverse;
}

void run(const Job& j) {
  std::vector<float> scores;
  for (int b = 0; b < j.B; ++b)
    for (int h = 0; h < j.Hq; ++h)
      for (int i = 0; i < j.L; ++i) row(j, b, h, i, scores);
}

class FewRowsAttention : public mx::Primitive {
 public:
  FewRowsAttention(mx::Stream stream, float scale, bool causal, bool masked)
      : mx::Primitive(stream), scale_(scale), causal_(causal), masked_(masked) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& x : inputs) encoder.set_input_array(x);
    encoder.set_output_array(out);
    std::vector<mx::array> held;
    for (auto& x : inputs) held.push_back(mx::array::unsafe_weak_copy(x));
    encoder.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), scale = scale_,
                      causal = causal_, masked = masked_]() mutable {
      const mx::array &q = held[0], &k = held[1], &v = held[2];
      Job job{view_of<float>(q), view_of<float>(k), view_of<float>(v), View<bool>{nullptr, 0, 0, 0}, causal, scale,
              q.shape(0), q.shape(1), k.shape(1), q.shape(2), k.shape(2), q.shape(3), out.data<float>()};
      if (masked) {
        job.mask = view_of<bool>(held[3]);
        if (held[3].shape(1) == 1) job.mask.s1 = 0;  // one mask for every head (a size-1 axis's stride is arbitrary)
      }
      run(job);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("few-rows attention runs on the CPU only");
  }

  const char* name() const override { return "FewRowsAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const FewRowsAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && masked_ == o.masked_;
  }

 private:
  float scale_;
  bool causal_, masked_;
};

// The last axis in unit stride (the cache's views already are; anything else is copied once).
mx::array unit_last(const mx::array& x, mx::Stream stream) {
  return x.strides().back() == 1 || x.shape().back() == 1 ? x : mx::contiguous(x, false, stream);
}

}  // namespace

mx::array few_rows_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                             bool causal, const std::optional<mx::array>& mask) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.dtype() != mx::float32 ||
      k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("few_rows_attention: float32 q [B, H, L, D], k and v [B, Hkv, S, D]");
  int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3), Hkv = k.shape(1), S = k.shape(2);
  if (k.shape() != v.shape() || k.shape(0) != B || k.shape(3) != D || Hkv == 0 || Hq % Hkv != 0 || L > S)
    throw std::invalid_argument("few_rows_attention: k and v [B, Hkv, S, D] with Hq a multiple of Hkv, L <= S");
  auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {unit_last(q, stream), unit_last(k, stream), unit_last(v, stream)};
  if (mask) {
    if (mask->dtype() != mx::bool_ || mask->ndim() > 4)
      throw std::invalid_argument("few_rows_attention: a boolean mask broadcastable to [B, H, L, S]");
    int heads = mask->ndim() == 4 && mask->shape(1) != 1 ? Hq : 1;  // per head or shared by all
    inputs.push_back(unit_last(mx::broadcast_to(*mask, {B, heads, L, S}, stream), stream));
  }
  return mx::array({B, L, Hq * D}, mx::float32, std::make_shared<FewRowsAttention>(stream, scale, causal, (bool)mask),
                   std::move(inputs));
}

}  // namespace metrale
