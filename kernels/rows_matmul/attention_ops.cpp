// The fused attention as a graph node (the work itself: attention.cpp). It reads a KV cache's buffers
// in place up to the cache's length, so the views a cache hands out are no graph nodes.

#include "attention.h"

#include <stdexcept>

#include "attention_job.h"
#include "dispatch.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace metrale {
namespace {

// Inputs q, k, v[, mask]: the rows attend to the first `length` keys of k and v (a cache's whole
// buffers, read in place: no view of them is a graph node).
class FewRowsAttention : public mx::Primitive {
 public:
  FewRowsAttention(mx::Stream stream, float scale, bool causal, bool masked, int length)
      : mx::Primitive(stream), scale_(scale), causal_(causal), masked_(masked), length_(length) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    dispatch(stream(), inputs, outputs, [scale = scale_, causal = causal_, masked = masked_,
                                         length = length_](std::vector<mx::array>& held, std::vector<mx::array>& outs) {
      mx::array& out = outs[0];
      const mx::array &q = held[0], &k = held[1], &v = held[2];
      Job job{view_of<float>(q), view_of<float>(k), view_of<float>(v), View<bool>{nullptr, 0, 0, 0}, causal, scale,
              q.shape(0), q.shape(1), k.shape(1), q.shape(2), length, q.shape(3), out.data<float>()};
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
    return scale_ == o.scale_ && causal_ == o.causal_ && masked_ == o.masked_ && length_ == o.length_;
  }

 private:
  float scale_;
  bool causal_, masked_;
  int length_;
};

// The last axis in unit stride (the cache's views already are; anything else is copied once).
mx::array unit_last(const mx::array& x, mx::Stream stream) {
  return x.strides().back() == 1 || x.shape().back() == 1 ? x : mx::contiguous(x, false, stream);
}

}  // namespace

mx::array few_rows_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                             bool causal, const std::optional<mx::array>& mask, std::optional<int> length) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.dtype() != mx::float32 ||
      k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("few_rows_attention: float32 q [B, H, L, D], k and v [B, Hkv, S, D]");
  int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3), Hkv = k.shape(1);
  int S = length.value_or(k.shape(2));
  if (k.shape() != v.shape() || k.shape(0) != B || k.shape(3) != D || Hkv == 0 || Hq % Hkv != 0 || L > S ||
      S > k.shape(2))
    throw std::invalid_argument(
        "few_rows_attention: k and v [B, Hkv, S, D] with Hq a multiple of Hkv, L <= length <= S");
  auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {unit_last(q, stream), unit_last(k, stream), unit_last(v, stream)};
  if (mask) {
    if (mask->dtype() != mx::bool_ || mask->ndim() > 4)
      throw std::invalid_argument("few_rows_attention: a boolean mask broadcastable to [B, H, L, length]");
    int heads = mask->ndim() == 4 && mask->shape(1) != 1 ? Hq : 1;  // per head or shared by all
    inputs.push_back(unit_last(mx::broadcast_to(*mask, {B, heads, L, S}, stream), stream));
  }
  return mx::array({B, L, Hq * D}, mx::float32,
                   std::make_shared<FewRowsAttention>(stream, scale, causal, (bool)mask, S), std::move(inputs));
}

}  // namespace metrale
