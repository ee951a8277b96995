// Attention of a few query rows over a KV cache (attention.cpp, attention_ops.cpp).
#pragma once

#include <optional>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

// softmax(scale q k^T) v, heads merged ([B, L, Hq * D]), for q [B, Hq, L, D] over the first `length`
// (default: all S) keys of k, v [B, Hkv, S, D] (grouped heads: Hq a multiple of Hkv). causal: the keys end
// with the L query rows, row i sees keys up to length - L + i. mask: a boolean array broadcastable to
// [B, Hq or 1, L, length], true where a row may see a key.
mx::array few_rows_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                             const std::optional<mx::array>& mask, std::optional<int> length);

}  // namespace metrale
