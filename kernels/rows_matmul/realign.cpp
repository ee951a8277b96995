// A batch KV cache buffer [B, H, C, D] whose rows shed different numbers of entries: each row b moves
// its entries [0, end - s_b) to [s_b, end), so every row ends at `end` again (the vacated front is
// left padding, masked). MLX's stock roll gathers the whole buffer element by element; this moves only
// the shifted rows, in place where the buffer is not shared (a step's cache usually is not).

#include "realign.h"

#include <cstring>
#include <stdexcept>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace metrale {
namespace {

class ShiftRows : public mx::Primitive {
 public:
  ShiftRows(mx::Stream stream, std::vector<int> shifts, int end)
      : mx::Primitive(stream), shifts_(std::move(shifts)), end_(end) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_output_array(out);
    bool in_place = x.is_donatable();
    if (in_place)
      out.copy_shared_buffer(x);
    else
      out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), out = mx::array::unsafe_weak_copy(out), in_place,
                      shifts = shifts_, end = end_]() mutable {
      const size_t heads = x.shape(1), capacity = x.shape(2), row = x.shape(3) * x.itemsize();
      const char* src = x.data<char>();
      char* dst = out.data<char>();
      if (!in_place) std::memcpy(dst, src, x.nbytes());
      for (size_t b = 0; b < shifts.size(); ++b) {
        const size_t s = shifts[b];
        if (s == 0) continue;
        for (size_t h = 0; h < heads; ++h) {
          char* base = dst + ((b * heads + h) * capacity) * row;
          std::memmove(base + s * row, base, (end - s) * row);
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("shift_rows runs on the CPU only");
  }

  const char* name() const override { return "ShiftRows"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const ShiftRows&>(other);
    return shifts_ == o.shifts_ && end_ == o.end_;
  }

 private:
  std::vector<int> shifts_;
  int end_;
};

}  // namespace

mx::array shift_rows(const mx::array& x, const std::vector<int>& shifts, int end) {
  if (x.ndim() != 4 || (int)shifts.size() != x.shape(0) || end < 0 || end > x.shape(2))
    throw std::invalid_argument("shift_rows: x [B, H, C, D], one shift per row, end <= C");
  for (int s : shifts)
    if (s < 0 || s > end) throw std::invalid_argument("shift_rows: shifts within [0, end]");
  auto stream = mx::default_stream(mx::Device::cpu);
  mx::array flat = x.flags().row_contiguous ? x : mx::contiguous(x, false, stream);
  return mx::array(x.shape(), x.dtype(), std::make_shared<ShiftRows>(stream, shifts, end), {flat});
}

}  // namespace metrale
