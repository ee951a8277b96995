// Right-align the rows of a batch KV cache buffer after a ragged rollback (realign.cpp).
#pragma once

#include <vector>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

mx::array shift_rows(const mx::array& x, const std::vector<int>& shifts, int end);

}  // namespace metrale
