// CUDA kernels of gelu_ext::gelu_forward / gelu_backward (schema and formulas: ../gelu.cpp).
//
// Memory-bound elementwise work, so the kernels are about moving bytes: 16-byte vector loads and
// stores where the pointers allow it, four of them in flight per thread, a grid-stride loop over
// exactly as many blocks as the SMs hold at once, 64-bit indices, math in float (double for
// double) whatever the storage type.
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

constexpr int kThreads = 256;

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

constexpr int kUnroll = 4;  // packs per thread and iteration: four 16-byte loads in flight, issued first
// (and __launch_bounds__(kThreads, 4) below caps registers at 64: >= 4 blocks of 256 per SM)

// out[i] = op(a[i], b[i]), where a (the incoming gradient) is only read for Op::kBinary.
// N elements per 16-byte pack; the host falls back to N = 1 when a pointer is not 16-byte aligned.
template <int N, typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads, 4) elementwise_kernel(const scalar_t* __restrict__ a,
                                                               const scalar_t* __restrict__ b,
                                                               scalar_t* __restrict__ out, int64_t n, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t, N>;
  constexpr bool kFast = sizeof(scalar_t) == 2;
  const P* pa_in = reinterpret_cast<const P*>(a);
  const P* pb_in = reinterpret_cast<const P*>(b);
  P* p_out = reinterpret_cast<P*>(out);
  const int64_t packs = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;  // neighbouring threads, neighbouring packs
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; base < packs; base += stride * kUnroll) {
    P pa[kUnroll], pb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all loads before any math
      const int64_t p = base + u * stride;
      if (p < packs) {
        if constexpr (Op::kBinary) pa[u] = pa_in[p];
        pb[u] = pb_in[p];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * stride;
      if (p < packs) {
        P po;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const opmath_t g = Op::kBinary ? opmath_t(pa[u].v[j]) : opmath_t(0);
          po.v[j] = scalar_t(op.template apply<kFast>(g, opmath_t(pb[u].v[j])));
        }
        p_out[p] = po;
      }
    }
  }
  // The ragged tail (< N elements) is handled by the first threads of block 0.
  const int64_t tail = packs * N + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) {
    const opmath_t g = Op::kBinary ? opmath_t(a[tail]) : opmath_t(0);
    out[tail] = scalar_t(op.template apply<kFast>(g, opmath_t(b[tail])));
  }
}

// As many blocks as the SMs hold at once (from the occupancy calculator: the kernel's register
// count decides, not a guess), fewer for small inputs; the grid-stride loop covers the rest.
template <int N, typename scalar_t, typename Op>
void launch_kernel(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, Op op, int64_t work) {
  int device = 0, sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, elementwise_kernel<N, scalar_t, Op>,
                                                               kThreads, 0));
  const int64_t needed = (work + int64_t(kThreads) * kUnroll - 1) / (int64_t(kThreads) * kUnroll);
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t(sms) * std::max(per_sm, 1))));
  elementwise_kernel<N><<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a, b, out, n, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename Op>
void launch(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, Op op) {
  if (n == 0) return;
  constexpr int kVec = 16 / sizeof(scalar_t);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if ((!Op::kBinary || aligned(a)) && aligned(b) && aligned(out)) {
    launch_kernel<kVec>(a, b, out, n, op, n / kVec);
  } else {
    launch_kernel<1>(a, b, out, n, op, n);
  }
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
