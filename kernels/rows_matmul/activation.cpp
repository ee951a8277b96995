// silu(gate) * up, the SwiGLU between a decode step's MLP products. MLX's CPU element-wise kernel
// costs ~20 us per 1,536 values here (a scalar exp per value); this one is vectorized and the same
// for every row whatever the row count.

#include "activation.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dispatch.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "strided.h"
#include "vectors.h"

namespace metrale {
namespace {

void swiglu_span(const float* gate, const float* up, float* out, size_t size) {
  size_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    vf g = load(gate + i);
    store(out + i, g / (1.0f + vexp(-g)) * load(up + i));
  }
  for (; i < size; ++i) out[i] = gate[i] / (1.0f + sexp(-gate[i])) * up[i];
}

class SwiGLU : public mx::Primitive {
 public:
  explicit SwiGLU(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    dispatch(stream(), inputs, outputs, [](std::vector<mx::array>& held, std::vector<mx::array>& outs) {
      mx::array& out = outs[0];
      // Row by row: a row's bits never depend on the rows beside it (a flat span would put the
      // scalar tail elsewhere), and rows may be strided (a split of one product's outputs). One input:
      // the stacked gate and up product, each row's gate values then its up values.
      size_t width = out.shape(-1);
      Rows gate_rows(held[0]);
      std::optional<Rows> up_rows;
      if (held.size() > 1) up_rows.emplace(held[1]);
      for (size_t r = 0; r < gate_rows.count(); ++r) {
        const float* up = up_rows ? (*up_rows)[r] : gate_rows[r] + width;
        swiglu_span(gate_rows[r], up, out.data<float>() + r * width, width);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("swiglu runs on the CPU only");
  }

  const char* name() const override { return "SwiGLU"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

}  // namespace

mx::array swiglu(const mx::array& gate, const std::optional<mx::array>& up) {
  if (gate.dtype() != mx::float32 || gate.ndim() == 0)
    throw std::invalid_argument("swiglu: float32 gate and up of one shape, or gate and up stacked");
  auto stream = mx::default_stream(mx::Device::cpu);
  // Inputs go in as they are: strides are known only once they are evaluated (in a compiled graph too).
  if (!up) {
    if (gate.shape(-1) % 2 != 0) throw std::invalid_argument("swiglu: a stacked gate and up of even width");
    mx::Shape shape = gate.shape();
    shape.back() /= 2;
    return mx::array(shape, mx::float32, std::make_shared<SwiGLU>(stream), {gate});
  }
  if (up->dtype() != mx::float32 || gate.shape() != up->shape())
    throw std::invalid_argument("swiglu: float32 gate and up of one shape, or gate and up stacked");
  return mx::array(gate.shape(), mx::float32, std::make_shared<SwiGLU>(stream), {gate, *up});
}

}  // namespace metrale
