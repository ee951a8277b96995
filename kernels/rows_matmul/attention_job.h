// The fused attention's work unit (attention.cpp), shared by the graph ops that run it (attention_ops.cpp).
#pragma once

#include <cstdint>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

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

struct Job {
  View<float> q, k, v;
  View<bool> mask;  // data null: no mask array
  bool causal;
  float scale;
  int B, Hq, Hkv, L, S, D;
  float* out;  // [B, L, Hq * D] contiguous: heads merged, as the output projection takes them
};

// softmax(scale q k^T) v for every query row of the job, the cores sharing the key heads' groups.
void run(const Job& j);

}  // namespace metrale
