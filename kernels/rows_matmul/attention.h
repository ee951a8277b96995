// Attention of a few query rows over a KV cache (attention.cpp).
#pragma once

#include <optional>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

// softmax(scale q k^T) v, heads merged ([B, L, Hq * D]), for q [B, Hq, L, D] over k, v [B, Hkv, S, D]
// (grouped heads: Hq a multiple of Hkv). causal: the cache ends with the L query rows, row i sees keys up to S - L + i. mask: a
// boolean array broadcastable to [B, Hq or 1, L, S], true where a row may see a key.
mx::array few_rows_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                             const std::optional<mx::array>& mask);

}  // namespace metrale
