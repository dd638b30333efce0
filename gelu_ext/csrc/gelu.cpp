// GELU, tanh approximation: the op schema (registered once, here) and its CPU kernels.
//
//   y     = 0.5 x (1 + tanh(u)),  u = k (x + c x^3),  k = sqrt(2/pi), c = 0.044715
//   dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2),  t = tanh(u)
//
// Both are evaluated through the identity 0.5 (1 + tanh(u)) = s = 1 / (1 + exp(-2u)), so that
// 1 - t^2 = 4 s (1 - s):  y = x s,  dy/dx = s + 2 x s (1 - s) k (1 + 3 c x^2),  s = 1 / (1 + exp(-2u)).
// One exp and one division per element, no cancellation in 1 + tanh(u) for negative x, and
// +-inf / nan come out exactly as in ATen's formula (inf -> inf, -inf -> nan, nan -> nan).
#include <Python.h>  // only for the empty module init below, so `import gelu_ext._C` loads the ops

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "gelu.h"

namespace gelu_ext {
namespace {  // the kernels are reached through the dispatcher only

constexpr int64_t kGrain = 32768;  // elements per parallel task (ATen uses the same)

// Works on at::vec::Vectorized<float> and <double> alike (half and bfloat16 are widened to float).
// e = exp(-2u), s = 1 / (1 + e) = 0.5 (1 + tanh(u)).
template <typename Vec>
inline Vec exp_minus_2u(const Vec& x, const Vec& x2) {
  using T = typename Vec::value_type;
  const Vec one{T(1)}, c{T(kKappa)}, minus_2k{T(-2 * kBeta)};
  return (minus_2k * x * (one + c * x2)).exp();
}

template <typename Vec>
inline Vec gelu_vec(const Vec& x) {
  using T = typename Vec::value_type;
  const Vec one{T(1)};
  return x / (one + exp_minus_2u(x, x * x));
}

template <typename Vec>
inline Vec gelu_grad_vec(const Vec& grad, const Vec& x) {
  using T = typename Vec::value_type;
  const Vec one{T(1)}, two{T(2)}, k{T(kBeta)}, c3{T(3 * kKappa)}, big{std::numeric_limits<T>::max()};
  Vec x2 = x * x;
  Vec e = exp_minus_2u(x, x2);
  Vec s = one / (one + e);
  // 1 - s = e s, without the cancellation of 1 - s for s near 1; e is capped so that e = inf
  // (x < -11 in float) gives 1 - s = 0 rather than inf * 0.
  Vec s_one_minus_s = at::vec::minimum(e, big) * s * s;
  return grad * (s + (two * x * s_one_minus_s) * (k * (one + c3 * x2)));
}

// A large fresh output is first touched by the kernel, and at 4 KiB per page fault that costs more
// than the arithmetic (2^24 floats: ~30 ms of faults against ~5 ms of math on 2 cores). Asking for
// transparent huge pages on it turns 512 faults into one. A hint only: a no-op where THP is off.
void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = (begin + t.nbytes()) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
}

at::Tensor gelu_forward_cpu(const at::Tensor& x) {
  check_forward_input(x);
  TORCH_INTERNAL_ASSERT(x.device().is_cpu());
  at::Tensor xc = x.contiguous();  // the kernels walk flat memory; views are copied once
  at::Tensor y = at::empty_like(xc);
  advise_huge_pages(y);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu_forward_cpu", [&] {
    using Vec = at::vec::Vectorized<at::opmath_type<scalar_t>>;  // half/bfloat16 computed in float
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, xc.numel(), kGrain, [&](int64_t begin, int64_t end) {
      // at::vec::map widens half/bfloat16 to float vectors and handles the ragged tail.
      at::vec::map([](Vec v) { return gelu_vec(v); }, out + begin, in + begin, end - begin);
    });
  });
  return y;
}

at::Tensor gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  check_backward_inputs(grad, x);
  TORCH_INTERNAL_ASSERT(x.device().is_cpu() && grad.device().is_cpu());
  at::Tensor gc = grad.contiguous(), xc = x.contiguous();
  at::Tensor dx = at::empty_like(xc);
  advise_huge_pages(dx);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu_backward_cpu", [&] {
    using Vec = at::vec::Vectorized<at::opmath_type<scalar_t>>;
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, xc.numel(), kGrain, [&](int64_t begin, int64_t end) {
      at::vec::map2([](Vec gv, Vec xv) { return gelu_grad_vec(gv, xv); }, out + begin, g + begin,
                    in + begin, end - begin);
    });
  });
  return dx;
}

}  // namespace

// The schema is defined once, here; CPU (below) and CUDA (cuda/gelu.cu) register their kernels,
// ops.py the rest (fake kernels for torch.compile, autograd) through torch.library.
TORCH_LIBRARY(gelu_ext, m) {
  m.def("gelu_forward(Tensor x) -> Tensor");
  m.def("gelu_backward(Tensor grad, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(gelu_ext, CPU, m) {
  m.impl("gelu_forward", &gelu_forward_cpu);
  m.impl("gelu_backward", &gelu_backward_cpu);
}

}  // namespace gelu_ext

extern "C" {
// `from . import _C` needs a module init; the module itself only carries the build flag.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
#ifdef WITH_CUDA
  PyModule_AddIntConstant(module, "with_cuda", 1);
#else
  PyModule_AddIntConstant(module, "with_cuda", 0);
#endif
  return module;
}
}
