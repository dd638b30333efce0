// CUDA kernels of gelu_ext::gelu_forward / gelu_backward (schema and formulas: ../gelu.cpp).
//
// Memory-bound elementwise work, so the kernels are about moving bytes: 16-byte vector loads and
// stores where the pointers allow it, organised as ATen's own elementwise kernels (below),
// 64-bit indices, math in float (double for double) whatever the storage type.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "../gelu.h"

namespace gelu_ext {
namespace {

// Math in float (double for double). For 16-bit storage the fast intrinsics (__expf, __fdividef:
// ~2 ulp in float) are far below half/bfloat16 rounding, and keep the kernel memory-bound.
template <bool kFast>
__device__ __forceinline__ float exp_(float v) { return kFast ? __expf(v) : expf(v); }
template <bool kFast>
__device__ __forceinline__ double exp_(double v) { return exp(v); }
template <bool kFast>
__device__ __forceinline__ float div_(float a, float b) { return kFast ? __fdividef(a, b) : a / b; }
template <bool kFast>
__device__ __forceinline__ double div_(double a, double b) { return a / b; }

template <bool kFast, typename T>
__device__ __forceinline__ T exp_minus_2u(T x, T x2) {  // s = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh(u))
  return exp_<kFast>(T(-2 * kBeta) * x * (T(1) + T(kKappa) * x2));
}

struct Forward {  // out = gelu(x)
  static constexpr bool kBinary = false;
  template <bool kFast, typename T>
  __device__ __forceinline__ T apply(T /*grad*/, T x) const {
    return div_<kFast>(x, T(1) + exp_minus_2u<kFast>(x, x * x));
  }
};

struct Backward {  // out = grad * gelu'(x); 1 - s = e s with e capped, as in ../gelu.cpp
  static constexpr bool kBinary = true;
  template <bool kFast, typename T>
  __device__ __forceinline__ T apply(T grad, T x) const {
    T x2 = x * x;
    T e = exp_minus_2u<kFast>(x, x2);
    T s = div_<kFast>(T(1), T(1) + e);
    T s_one_minus_s = fmin(e, std::numeric_limits<T>::max()) * s * s;
    return grad * (s + (T(2) * x * s_one_minus_s) * (T(kBeta) * (T(1) + T(3 * kKappa) * x2)));
  }
};

template <typename scalar_t, int N>
struct alignas(sizeof(scalar_t) * N) Pack {
  scalar_t v[N];
};

// The shape of ATen's vectorized_elementwise_kernel (ATen/native/cuda/CUDALoops.cuh), the baseline
// this kernel is measured against: blocks of 128 threads, 8 elements per thread, one block per 1,024
// elements (no grid-stride loop), all loads issued before any math. Thread t of a block reads packs
// t, t + 128, ... of the block's slice, so each load instruction of a warp covers 512 contiguous bytes.
constexpr int kThreads = 128;
constexpr int kPerThread = 8;
constexpr int kPerBlock = kThreads * kPerThread;

// out[i] = op(a[i], b[i]); a (the incoming gradient) is only read for Op::kBinary. kVec elements per
// load: 16 bytes where every pointer allows it, fewer for a misaligned view (down to 1).
template <int kVec, typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(const scalar_t* __restrict__ a,
                                                               const scalar_t* __restrict__ b,
                                                               scalar_t* __restrict__ out, int64_t n, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr bool kFast = sizeof(scalar_t) == 2;
  const int64_t base = int64_t(blockIdx.x) * kPerBlock;
  const int64_t remaining = n - base;
  scalar_t va[kPerThread], vb[kPerThread], vo[kPerThread];
  if (remaining >= kPerBlock) {  // a whole block's slice: vector loads and stores, no bounds checks
    using P = Pack<scalar_t, kVec>;
#pragma unroll
    for (int i = 0; i < kPerThread / kVec; ++i) {
      const int p = threadIdx.x + i * kThreads;
      const P pb = reinterpret_cast<const P*>(b + base)[p];
      P pa;
      if constexpr (Op::kBinary) pa = reinterpret_cast<const P*>(a + base)[p];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        vb[i * kVec + j] = pb.v[j];
        if constexpr (Op::kBinary) va[i * kVec + j] = pa.v[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const opmath_t g = Op::kBinary ? opmath_t(va[k]) : opmath_t(0);
      vo[k] = scalar_t(op.template apply<kFast>(g, opmath_t(vb[k])));
    }
#pragma unroll
    for (int i = 0; i < kPerThread / kVec; ++i) {
      P po;
#pragma unroll
      for (int j = 0; j < kVec; ++j) po.v[j] = vo[i * kVec + j];
      reinterpret_cast<P*>(out + base)[threadIdx.x + i * kThreads] = po;
    }
  } else {  // the last, partial slice: element by element, still coalesced
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = base + threadIdx.x + k * kThreads;
      if (i < n) {
        const opmath_t g = Op::kBinary ? opmath_t(a[i]) : opmath_t(0);
        out[i] = scalar_t(op.template apply<kFast>(g, opmath_t(b[i])));
      }
    }
  }
}

template <int kVec, typename scalar_t, typename Op>
void launch_kernel(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, Op op) {
  const int64_t blocks = (n + kPerBlock - 1) / kPerBlock;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "gelu_ext: ", n, " elements are too many for one launch");
  elementwise_kernel<kVec><<<unsigned(blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a, b, out, n, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The widest load (16 bytes at most) that every pointer is aligned for, as ATen's can_vectorize_up_to.
template <typename scalar_t, typename Op>
void launch(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, Op op) {
  if (n == 0) return;
  auto aligned = [](const void* p, int vec) { return reinterpret_cast<uintptr_t>(p) % (vec * sizeof(scalar_t)) == 0; };
  auto fits = [&](int vec) { return (!Op::kBinary || aligned(a, vec)) && aligned(b, vec) && aligned(out, vec); };
  constexpr int kMaxVec = 16 / sizeof(scalar_t);
  if constexpr (kMaxVec >= 8) {
    if (fits(8)) return launch_kernel<8>(a, b, out, n, op);
  }
  if constexpr (kMaxVec >= 4) {
    if (fits(4)) return launch_kernel<4>(a, b, out, n, op);
  }
  if (fits(2)) return launch_kernel<2>(a, b, out, n, op);
  launch_kernel<1>(a, b, out, n, op);
}

at::Tensor gelu_forward_cuda(const at::Tensor& x) {
  check_forward_input(x);
  TORCH_INTERNAL_ASSERT(x.device().is_cuda());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu_forward_cuda", [&] {
    launch<scalar_t>(nullptr, xc.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), xc.numel(),
                     Forward{});
  });
  return y;
}

at::Tensor gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x) {
  check_backward_inputs(grad, x);
  TORCH_INTERNAL_ASSERT(x.device().is_cuda());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor gc = grad.contiguous(), xc = x.contiguous();
  at::Tensor dx = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu_backward_cuda", [&] {
    launch<scalar_t>(gc.const_data_ptr<scalar_t>(), xc.const_data_ptr<scalar_t>(), dx.mutable_data_ptr<scalar_t>(),
           xc.numel(), Backward{});
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(gelu_ext, CUDA, m) {
  m.impl("gelu_forward", &gelu_forward_cuda);
  m.impl("gelu_backward", &gelu_backward_cuda);
}

}  // namespace gelu_ext
