// The small ops around a decode step's products, one graph node each. On MLX's CPU backend
// mx.fast.rms_norm and mx.fast.rope run as their decompositions: a norm is 3 nodes, a rotary
// embedding ~12, and with the heads' reshapes a default-model step evaluated ~1,500 nodes at a few
// microseconds each. Here a norm (with the residual add before it) is one node, and the heads'
// split with q's and k's rotation another.
//
// Every row is computed alone, in the same order whatever rows came with it, so a verify row's bits
// are the plain step's at its position.

#include "layer_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "dispatch.h"
#include "strided.h"
#include "vectors.h"

namespace metrale {
namespace {

// out = x / sqrt(mean(x^2) + eps) * w for one row of D values.
void norm_row(const float* x, const float* w, float* out, int D, float eps) {
  int d = 0;
  vf acc = vf{};
  for (; d + kLanes <= D; d += kLanes) acc = multiply_add(load(x + d), load(x + d), acc);
  float squares = lane_total(acc);
  for (; d < D; ++d) squares += x[d] * x[d];  // unfused: contract off
  float inverse = 1.0f / std::sqrt(squares / (float)D + eps);
  for (d = 0; d + kLanes <= D; d += kLanes) store(out + d, load(x + d) * inverse * load(w + d));
  for (; d < D; ++d) out[d] = x[d] * inverse * w[d];
}

// A norm of x's rows, with the residual add before it where `add` (inputs x, r, w; outputs h, norm).
class RmsNorm : public mx::Primitive {
 public:
  RmsNorm(mx::Stream stream, float eps, bool add) : mx::Primitive(stream), eps_(eps), add_(add) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    dispatch(stream(), inputs, outputs, [eps = eps_, add = add_](auto& in, auto& out) {
      int D = in[0].shape(-1);
      Rows x(in[0]);
      const float* w = in[add ? 2 : 1].template data<float>();
      if (!add) {
        for (size_t r = 0; r < x.count(); ++r) norm_row(x[r], w, out[0].template data<float>() + r * D, D, eps);
        return;
      }
      Rows residual(in[1]);
      for (size_t r = 0; r < x.count(); ++r) {
        float* h = out[0].template data<float>() + r * D;
        for (int d = 0; d < D; ++d) h[d] = x[r][d] + residual[r][d];
        norm_row(h, w, out[1].template data<float>() + r * D, D, eps);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("rms_norm runs on the CPU only");
  }

  const char* name() const override { return add_ ? "AddRmsNorm" : "RmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const RmsNorm&>(other);
    return eps_ == o.eps_ && add_ == o.add_;
  }

 private:
  float eps_;
  bool add_;
};

// Rotates one head's row (D values, the first 2 * half rotated) by the angles' cosines and sines.
void rotate(const float* x, float* out, const float* cosines, const float* sines, int half, int D, bool traditional) {
  for (int i = 0; i < half; ++i) {
    int a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    out[a] = x[a] * cosines[i] - x[b] * sines[i];
    out[b] = x[a] * sines[i] + x[b] * cosines[i];
  }
  for (int d = 2 * half; d < D; ++d) out[d] = x[d];
}

// Batch row b's first position: the one offset, or b's own (an offset vector may be strided).
int64_t offset_of(const mx::array& offset, int b) {
  int64_t i = offset.size() == 1 ? 0 : b * offset.strides()[0];
  return offset.dtype() == mx::int64 ? offset.data<int64_t>()[i] : offset.data<int32_t>()[i];
}

class HeadsRope : public mx::Primitive {
 public:
  HeadsRope(mx::Stream stream, int q_heads, int kv_heads, bool traditional)
      : mx::Primitive(stream), q_heads_(q_heads), kv_heads_(kv_heads), traditional_(traditional) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto work = [hq = q_heads_, hkv = kv_heads_, traditional = traditional_](auto& in, auto& out) {
      // Inputs: q, k and v, or their stacked product; then the offsets and the angles.
      size_t parts = in.size() - 2;
      const mx::array &offsets = in[parts], &angles = in[parts + 1];
      int B = in[0].shape(0), L = in[0].shape(1), D = in[0].shape(2) / (parts == 3 ? hq : hq + 2 * hkv);
      int half = angles.size();
      Rows q(in[0]);
      std::optional<Rows> k, v;
      if (parts == 3) k.emplace(in[1]), v.emplace(in[2]);
      const float* inv_freq = angles.template data<float>();
      std::vector<float> cosines(half), sines(half);
      for (int b = 0; b < B; ++b) {
        for (int l = 0; l < L; ++l) {
          float position = (float)(offset_of(offsets, b) + l);
          for (int i = 0; i < half; ++i) {
            float angle = position * inv_freq[i];
            cosines[i] = std::cos(angle);
            sines[i] = std::sin(angle);
          }
          size_t r = (size_t)b * L + l;
          const float* q_row = q[r];
          const float* k_row = k ? (*k)[r] : q_row + (size_t)hq * D;
          const float* v_row = v ? (*v)[r] : k_row + (size_t)hkv * D;
          auto head = [&](mx::array& y, int heads, int h) {  // row l of head h in [B, H, L, D]
            return y.template data<float>() + (((size_t)b * heads + h) * L + l) * D;
          };
          const float *c = cosines.data(), *s = sines.data();
          for (int h = 0; h < hq; ++h) rotate(q_row + h * D, head(out[0], hq, h), c, s, half, D, traditional);
          for (int h = 0; h < hkv; ++h) {
            rotate(k_row + h * D, head(out[1], hkv, h), c, s, half, D, traditional);
            std::copy(v_row + h * D, v_row + (h + 1) * D, head(out[2], hkv, h));
          }
        }
      }
    };
    dispatch(stream(), inputs, outputs, work);
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("heads_rope runs on the CPU only");
  }

  const char* name() const override { return "HeadsRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const HeadsRope&>(other);
    return q_heads_ == o.q_heads_ && kv_heads_ == o.kv_heads_ && traditional_ == o.traditional_;
  }

 private:
  int q_heads_, kv_heads_;
  bool traditional_;
};

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

// A parameter in one contiguous buffer: as it is where evaluated so (weights are), else a copy node.
mx::array flat(const mx::array& x) {
  return x.is_available() && x.flags().row_contiguous ? x : mx::contiguous(x, false, cpu());
}

void check_norm(const mx::array& x, const mx::array& weight) {
  if (x.dtype() != mx::float32 || weight.dtype() != mx::float32 || weight.ndim() != 1 || x.ndim() == 0 ||
      x.shape(-1) != weight.shape(0))
    throw std::invalid_argument("rms_norm: float32 x [..., D] and weight [D]");
}

}  // namespace

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps) {
  check_norm(x, weight);
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(cpu(), eps, false), {x, flat(weight)});
}

std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& r, const mx::array& weight, float eps) {
  check_norm(x, weight);
  if (r.shape() != x.shape() || r.dtype() != mx::float32) throw std::invalid_argument("add_rms_norm: r shaped as x");
  return mx::array::make_arrays({x.shape(), x.shape()}, {mx::float32, mx::float32},
                                std::make_shared<RmsNorm>(cpu(), eps, true), {x, r, flat(weight)});
}

std::vector<mx::array> heads_rope(const std::vector<mx::array>& qkv, const mx::array& offset,
                                  const mx::array& inv_freq, int q_heads, int kv_heads, bool traditional) {
  if (qkv.size() != 1 && qkv.size() != 3) throw std::invalid_argument("heads_rope: q, k and v, or their stack");
  const mx::array& q = qkv[0];
  for (auto& x : qkv)
    if (x.ndim() != 3 || x.dtype() != mx::float32 || x.shape(0) != q.shape(0) || x.shape(1) != q.shape(1))
      throw std::invalid_argument("heads_rope: float32 q, k and v [B, L, heads * D]");
  int B = q.shape(0), L = q.shape(1), all_heads = qkv.size() == 3 ? q_heads : q_heads + 2 * kv_heads;
  bool shaped = q_heads > 0 && kv_heads > 0 && q.shape(2) % all_heads == 0 &&
                (qkv.size() == 1 || (qkv[1].shape(2) == qkv[2].shape(2) &&
                                     (int64_t)qkv[1].shape(2) * q_heads == (int64_t)q.shape(2) * kv_heads));
  if (!shaped) throw std::invalid_argument("heads_rope: q of q_heads heads, k and v of kv_heads heads of one size");
  int D = q.shape(2) / all_heads;
  if (inv_freq.dtype() != mx::float32 || inv_freq.ndim() != 1 || 2 * inv_freq.shape(0) > D)
    throw std::invalid_argument("heads_rope: float32 inv_freq of at most D / 2 angles");
  if (offset.ndim() > 1 || (offset.size() != 1 && offset.size() != (size_t)B))
    throw std::invalid_argument("heads_rope: one offset, or a vector of one per batch row");
  mx::array positions = offset.dtype() == mx::int64 || offset.dtype() == mx::int32
                            ? offset : mx::astype(offset, mx::int32, cpu());
  std::vector<mx::array> inputs = qkv;
  inputs.push_back(positions);
  inputs.push_back(flat(inv_freq));
  return mx::array::make_arrays({{B, q_heads, L, D}, {B, kv_heads, L, D}, {B, kv_heads, L, D}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<HeadsRope>(cpu(), q_heads, kv_heads, traditional), inputs);
}

}  // namespace metrale
