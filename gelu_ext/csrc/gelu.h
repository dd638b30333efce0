// What the CPU (gelu.cpp) and CUDA (cuda/gelu.cu) kernels share: the constants of the tanh
// approximation and the checks of what a caller can get wrong (formulas: gelu.cpp's header).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace gelu_ext {

constexpr double kBeta = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kKappa = 0.044715;

inline void check_forward_input(const at::Tensor& x) {
  TORCH_CHECK(x.is_floating_point(), "gelu_ext.gelu: expected a floating-point tensor, got ", x.scalar_type());
}

inline void check_backward_inputs(const at::Tensor& grad, const at::Tensor& x) {
  TORCH_CHECK(grad.sizes() == x.sizes(), "gelu_ext.gelu_backward: grad shape ", grad.sizes(),
              " differs from input shape ", x.sizes());
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), "gelu_ext.gelu_backward: grad dtype ", grad.scalar_type(),
              " differs from input dtype ", x.scalar_type());
  TORCH_CHECK(grad.device() == x.device(), "gelu_ext.gelu_backward: grad on ", grad.device(), ", input on ",
              x.device());
  TORCH_CHECK(x.is_floating_point(), "gelu_ext.gelu_backward: expected a floating-point tensor, got ",
              x.scalar_type());
}

}  // namespace gelu_ext
