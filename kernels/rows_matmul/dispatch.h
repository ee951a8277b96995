// The encoder set-up every primitive here repeats: inputs and outputs registered with the CPU
// stream's encoder, outputs allocated, and the work run on the stream's thread over weak copies
// (the graph keeps the arrays alive until the work has run).
#pragma once

#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace metrale {

// Runs fn(inputs, outputs) on the stream's thread once every input and output is set up (a fresh
// buffer for each output).
template <typename Fn>
void dispatch(mlx::core::Stream stream, const std::vector<mlx::core::array>& inputs,
              std::vector<mlx::core::array>& outputs, Fn fn) {
  namespace mx = mlx::core;
  auto& encoder = mx::cpu::get_command_encoder(stream);
  std::vector<mx::array> held_in, held_out;
  for (auto& x : inputs) {
    encoder.set_input_array(x);
    held_in.push_back(mx::array::unsafe_weak_copy(x));
  }
  for (auto& y : outputs) {
    y.set_data(mx::allocator::malloc(y.nbytes()));
    encoder.set_output_array(y);
    held_out.push_back(mx::array::unsafe_weak_copy(y));
  }
  encoder.dispatch([in = std::move(held_in), out = std::move(held_out), fn]() mutable { fn(in, out); });
}

}  // namespace metrale
