// Autograd for gelu_ext::gelu_forward and gelu_backward, in C++ (Autograd dispatch key), so that a
// forward + backward runs no Python at all. For both ops:
//   - backward mode: a graph node saving the inputs; gelu_forward's backward is gelu_backward(grad, x),
//     gelu_backward's own backward gives second derivatives (gradgradcheck, gradient penalties);
//   - forward mode (dual tensors, torch.func.jvp/jacfwd/hessian): the tangent of y = gelu(x) is
//     gelu'(x) * x_t = gelu_backward(x_t, x), set on the output at level 0.
//
// Why a hand-made Node and not torch::autograd::Function (the tutorial's way): Function::apply
// refuses inside torch.func transforms ("cannot use C++ torch::autograd::Function with functorch
// transforms") and has no jvp. A Node set with set_history is what PyTorch's own generated
// kernels (VariableType) do, and functorch's grad and jvp transforms work through it.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <memory>
#include <type_traits>

#include "gelu.h"

namespace gelu_ext {
namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Through the full dispatcher (autograd included): used where the result must itself be differentiable.
at::Tensor forward_op(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gelu_ext::gelu_forward", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gelu_ext::gelu_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, x);
}

// y'' = (1 - t^2) (u' + 0.5 x (u'' - 2 t u'^2)),  u' = k (1 + 3 c x^2),  u'' = 6 k c x  (function.py).
// Made of ATen ops, so it is differentiable in turn; 16-bit inputs are computed in float.
at::Tensor second_derivative(const at::Tensor& x) {
  const at::Tensor xf = c10::isReducedFloatingType(x.scalar_type()) ? x.to(at::kFloat) : x;
  const at::Tensor t = at::tanh(kBeta * (xf + kKappa * xf.pow(3)));
  const at::Tensor du = kBeta * (1 + 3 * kKappa * xf * xf);
  return (1 - t * t) * (du + 0.5 * xf * (6 * kBeta * kKappa * xf - 2 * t * du * du));
}

// Nodes are std::shared_ptr up to torch 2.11 and c10::intrusive_ptr after: build whichever Edge holds.
using NodePtr = decltype(torch::autograd::Edge::function);
template <typename T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return std::make_shared<T>();
  } else {
    return c10::make_intrusive<T>();
  }
}

// The tangent and primal of a dual tensor at forward-AD level 0 (undefined / itself if it has none).
const at::Tensor& tangent(const at::Tensor& t) { return t._fw_grad(/*level=*/0); }
at::Tensor primal(const at::Tensor& t) { return tangent(t).defined() ? t._fw_primal(/*level=*/0) : t; }

struct GeluForwardBackward : public Node {  // dx = gelu_backward(dy, x)
  SavedVariable x_;
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {backward_op(grads[0], x_.unpack())};
  }
  std::string name() const override { return "GeluExtForwardBackward"; }
  void release_variables() override { x_.reset_data(); }
};

struct GeluBackwardBackward : public Node {  // dx = grad * y'(x): d/dgrad = y'(x), d/dx = grad * y''(x)
  SavedVariable grad_, x_;
  variable_list apply(variable_list&& grads) override {
    const at::Tensor& gg = grads[0];
    if (!gg.defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor x = x_.unpack();
    at::Tensor d_grad, d_x;
    if (task_should_compute_output(0)) d_grad = backward_op(gg, x);
    if (task_should_compute_output(1)) d_x = (gg * grad_.unpack() * second_derivative(x)).to(x.scalar_type());
    return {d_grad, d_x};
  }
  std::string name() const override { return "GeluExtBackwardBackward"; }
  void release_variables() override {
    grad_.reset_data();
    x_.reset_data();
  }
};

at::Tensor gelu_forward_autograd(const at::Tensor& x) {
  at::Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // on to the CPU / CUDA kernel
    y = forward_op(x);
  }
  if (torch::autograd::compute_requires_grad(x)) {
    auto node = make_node<GeluForwardBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    node->x_ = SavedVariable(x, /*is_output=*/false);
    torch::autograd::set_history(y, node);
  }
  if (tangent(x).defined()) {
    y._set_fw_grad(backward_op(tangent(x), primal(x)), /*level=*/0, /*is_inplace_op=*/false);
  }
  return y;
}

at::Tensor gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  at::Tensor dx;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    dx = backward_op(grad, x);
  }
  if (torch::autograd::compute_requires_grad(grad, x)) {
    auto node = make_node<GeluBackwardBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(grad, x));
    node->grad_ = SavedVariable(grad, /*is_output=*/false);
    node->x_ = SavedVariable(x, /*is_output=*/false);
    torch::autograd::set_history(dx, node);
  }
  const at::Tensor &grad_t = tangent(grad), &x_t = tangent(x);
  if (grad_t.defined() || x_t.defined()) {  // d(grad * y'(x)) = grad_t * y'(x) + grad * y''(x) * x_t
    const at::Tensor grad_p = primal(grad), x_p = primal(x);
    at::Tensor dx_t = grad_t.defined() ? backward_op(grad_t, x_p) : at::zeros_like(dx);
    if (x_t.defined()) dx_t = dx_t + (grad_p * second_derivative(x_p) * x_t).to(x.scalar_type());
    dx._set_fw_grad(dx_t, /*level=*/0, /*is_inplace_op=*/false);
  }
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(gelu_ext, Autograd, m) {
  m.impl("gelu_forward", &gelu_forward_autograd);
  m.impl("gelu_backward", &gelu_backward_autograd);
}

}  // namespace gelu_ext
