// CUDA kernels of gelu_ext::gelu_forward / gelu_backward (schema and formulas: ../gelu.cpp).
//
// Memory-bound elementwise work, so the kernels are about moving bytes: 16-byte vector loads and
// stores where the pointers allow it, a grid-stride loop sized to fill the GPU once, 64-bit
// indices, math in float (double for double) whatever the storage type.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

namespace gelu_ext {
namespace {

constexpr double kBeta = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kKappa = 0.044715;
constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ T exp_minus_2u(T x, T x2) {  // s = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh(u))
  return exp(T(-2 * kBeta) * x * (T(1) + T(kKappa) * x2));
}

struct Forward {  // out = gelu(x)
  static constexpr bool kBinary = false;
  template <typename T>
  __device__ __forceinline__ T operator()(T /*grad*/, T x) const {
    return x / (T(1) + exp_minus_2u(x, x * x));
  }
};

struct Backward {  // out = grad * gelu'(x); 1 - s = e s with e capped, as in ../gelu.cpp
  static constexpr bool kBinary = true;
  template <typename T>
  __device__ __forceinline__ T operator()(T grad, T x) const {
    T x2 = x * x;
    T e = exp_minus_2u(x, x2);
    T s = T(1) / (T(1) + e);
    T s_one_minus_s = fmin(e, std::numeric_limits<T>::max()) * s * s;
    return grad * (s + (T(2) * x * s_one_minus_s) * (T(kBeta) * (T(1) + T(3 * kKappa) * x2)));
  }
};

template <typename scalar_t, int N>
struct alignas(sizeof(scalar_t) * N) Pack {
  scalar_t v[N];
};

// out[i] = op(a[i], b[i]), where a (the incoming gradient) is only read for Op::kBinary.
// N elements per 16-byte pack; the host falls back to N = 1 when a pointer is not 16-byte aligned.
template <int N, typename scalar_t, typename Op>
__global__ void elementwise_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                   scalar_t* __restrict__ out, int64_t n, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t packs = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    Pack<scalar_t, N> pa{};
    if constexpr (Op::kBinary) pa = reinterpret_cast<const Pack<scalar_t, N>*>(a)[p];
    Pack<scalar_t, N> pb = reinterpret_cast<const Pack<scalar_t, N>*>(b)[p];
    Pack<scalar_t, N> po;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      po.v[j] = scalar_t(op(opmath_t(pa.v[j]), opmath_t(pb.v[j])));
    }
    reinterpret_cast<Pack<scalar_t, N>*>(out)[p] = po;
  }
  // The ragged tail (< N elements) is handled by the first threads of block 0.
  const int64_t tail = packs * N + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) {
    out[tail] = scalar_t(op(Op::kBinary ? opmath_t(a[tail]) : opmath_t(0), opmath_t(b[tail])));
  }
}

template <typename scalar_t, typename Op>
void launch(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, Op op) {
  if (n == 0) return;
  constexpr int kVec = 16 / sizeof(scalar_t);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vectorise = (!Op::kBinary || aligned(a)) && aligned(b) && aligned(out);
  const int64_t work = vectorise ? n / kVec : n;
  // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t max_blocks = int64_t(sms) * 8;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, max_blocks)));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (vectorise) {
    elementwise_kernel<kVec><<<blocks, kThreads, 0, stream>>>(a, b, out, n, op);
  } else {
    elementwise_kernel<1><<<blocks, kThreads, 0, stream>>>(a, b, out, n, op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor gelu_forward_cuda(const at::Tensor& x) {
  TORCH_CHECK(x.is_floating_point(), "gelu_ext.gelu: expected a floating-point tensor, got ", x.scalar_type());
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
  TORCH_CHECK(grad.sizes() == x.sizes(), "gelu_ext.gelu_backward: grad shape ", grad.sizes(),
              " differs from input shape ", x.sizes());
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), "gelu_ext.gelu_backward: grad dtype ",
              grad.scalar_type(), " differs from input dtype ", x.scalar_type());
  TORCH_CHECK(grad.device() == x.device(), "gelu_ext.gelu_backward: grad on ", grad.device(),
              ", input on ", x.device());
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
