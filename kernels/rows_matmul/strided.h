// A strided array's rows, read in place where each row's values are contiguous and from one copy
// where not (rare: a few rows, copied inside the kernel rather than by an extra graph node).
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

// Whether x's rows can be read in place: each row's values contiguous (its last axis' stride 1).
inline bool rows_readable(const mlx::core::array& x) {
  return x.flags().row_contiguous || x.strides().back() == 1;
}

// Row r's first element of x [..., width] whose rows are readable: its row index decomposed over the
// leading axes' strides.
inline const float* row_of(const mlx::core::array& x, size_t r, size_t width) {
  if (x.flags().row_contiguous) return x.data<float>() + r * width;
  int64_t offset = 0;
  for (int d = (int)x.ndim() - 2; d >= 0; --d) {
    offset += (int64_t)(r % x.shape(d)) * x.strides()[d];
    r /= x.shape(d);
  }
  return x.data<float>() + offset;
}

// The rows of an evaluated float32 array x [..., width]: rows[r] is row r's first value.
class Rows {
 public:
  explicit Rows(const mlx::core::array& x) : x_(x), width_(x.shape(-1)) {
    if (!rows_readable(x)) copy_ = gather(x);
  }
  const float* operator[](size_t r) const { return copy_.empty() ? row_of(x_, r, width_) : copy_.data() + r * width_; }
  size_t count() const { return width_ ? x_.size() / width_ : 0; }

 private:
  const mlx::core::array& x_;
  size_t width_;
  std::vector<float> copy_;
};

}  // namespace metrale
