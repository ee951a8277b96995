// silu(gate) * up (activation.cpp).
#pragma once

#include "mlx/array.h"

namespace mx = mlx::core;

namespace metrale {

mx::array swiglu(const mx::array& gate, const mx::array& up);

}  // namespace metrale
