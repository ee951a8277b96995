// silu(gate) * up, the SwiGLU between a decode step's MLP products. MLX's CPU element-wise kernel
// costs ~20 us per 1,536 values here (a scalar exp per value); this one is vectorized and the same
// for every row whatever the row count.

#include "activation.h"

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
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
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(inputs[0]);
    encoder.set_input_array(inputs[1]);
    encoder.set_output_array(out);
    encoder.dispatch([g = mx::array::unsafe_weak_copy(inputs[0]), u = mx::array::unsafe_weak_copy(inputs[1]),
                      out = mx::array::unsafe_weak_copy(out)]() mutable {
      // Row by row: a row's bits never depend on the rows beside it (a flat span would put the
      // scalar tail elsewhere), and rows may be strided (a split of one product's outputs).
      size_t width = out.shape(-1);
      Rows gate_rows(g), up_rows(u);
      for (size_t r = 0; r < gate_rows.count(); ++r)
        swiglu_span(gate_rows[r], up_rows[r], out.data<float>() + r * width, width);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("swiglu runs on the CPU only");
  }

  const char* name() const override { return "SwiGLU"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

}  // namespace

mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape() || gate.ndim() == 0)
    throw std::invalid_argument("swiglu: float32 gate and up of one shape");
  auto stream = mx::default_stream(mx::Device::cpu);
  // Inputs go in as they are: strides are known only once they are evaluated (in a compiled graph too).
  return mx::array(gate.shape(), mx::float32, std::make_shared<SwiGLU>(stream), {gate, up});
}

}  // namespace metrale
