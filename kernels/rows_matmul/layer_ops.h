// The small ops around a decode step's products, one graph node each (layer_ops.cpp).
#pragma once

#include <vector>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

// x / rms(x) * weight over the last axis, for float32 x [..., D] and weight [D].
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps);

// h = x + r and rms_norm(h, weight, eps): the residual stream and the next products' input.
std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& r, const mx::array& weight, float eps);

// q [B, L, Hq * D], k and v [B, L, Hkv * D] (or the three stacked on the last axis, one array) split
// into heads ([B, H, L, D]), q and k rotated (RoPE) at positions offset + 0..L-1 (offset: one integer,
// or one per batch row) by angles position * inv_freq[i] over their first 2 * inv_freq.size dims;
// traditional: rotating pairs (2i, 2i + 1), else (i, i + half).
std::vector<mx::array> heads_rope(const std::vector<mx::array>& qkv, const mx::array& offset,
                                  const mx::array& inv_freq, int q_heads, int kv_heads, bool traditional);

}  // namespace metrale
