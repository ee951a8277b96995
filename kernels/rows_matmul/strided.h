// A strided array's elements in row-major order: a kernel's input whose rows are not contiguous (rare:
// a few rows, copied inside the kernel rather than by an extra graph node).
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"

namespace metrale {

inline std::vector<float> gather(const mlx::core::array& x) {
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

}  // namespace metrale
