// silu(gate) * up (activation.cpp).
#pragma once

#include <optional>

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

// silu(gate) * up; without up, gate holds each row's gate values then its up values (one product's).
mx::array swiglu(const mx::array& gate, const std::optional<mx::array>& up);

}  // namespace metrale
