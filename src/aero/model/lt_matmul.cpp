#include "aero/model/lt_matmul.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#if defined(SLIPSTREAM_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define SLIPSTREAM_LT_MATMUL 1
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#endif

namespace slipstream::aero::lt_matmul {

#ifdef SLIPSTREAM_LT_MATMUL
namespace {

void check(cublasStatus_t s, const char* what) {
  TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, "lt_matmul: ", what, " failed: cuBLAS status ",
              static_cast<int>(s));
}

// The largest power of two up to 256 that divides the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// One column-major cuBLASLt problem: D (m, n) = op(A) op(B) + beta C, with
// an epilogue and its vector (the bias).
struct Problem {
  cublasOperation_t ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  cudaDataType_t ab_type, d_type;
  cublasLtEpilogue_t epilogue;
  const void *a, *b, *c;
  void* d;
  void* vec;
  float beta;

  auto key(int device) const {
    return std::make_tuple(device, int(ta), int(tb), m, n, k, lda, ldb, ldd, int(ab_type),
                           int(d_type), int(epilogue), alignment(a), alignment(b), alignment(c),
                           alignment(d), beta != 0.f);
  }
};

template <typename T, cublasStatus_t (*Destroy)(T)>
struct Handle {
  T h = nullptr;
  ~Handle() {
    if (h != nullptr) Destroy(h);
  }
};

using Desc = Handle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Handle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Pref = Handle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The algorithm cuBLASLt's heuristic picks for a problem, found once per
// shape, layout, alignment and device; nullopt where it has none.
std::optional<cublasLtMatmulAlgo_t> cached_algo(const Problem& p, cublasLtHandle_t handle,
                                                cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                                cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                cublasLtMatrixLayout_t d, size_t workspace,
                                                int device) {
  using Key = decltype(p.key(0));
  static std::mutex mutex;
  static std::map<Key, std::optional<cublasLtMatmulAlgo_t>> cache;
  const auto key = p.key(device);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  Pref pref;
  check(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  check(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof(workspace)),
        "setting the workspace");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.d}};
  for (const auto& [attr, ptr] : aligned) {
    const uint32_t al = alignment(ptr);
    check(cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &al, sizeof(al)),
          "setting an alignment");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const auto s = cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, d, pref.h, 1, &result, &found);
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (s == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
  cache.emplace(key, algo);
  return algo;
}

// Runs p on the current stream; false where cuBLASLt has no algorithm.
bool run(const Problem& p, int device) {
  Desc op;
  check(cublasLtMatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof(p.ta)),
        "setting transa");
  check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof(p.tb)),
        "setting transb");
  check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue,
                                       sizeof(p.epilogue)),
        "setting the epilogue");
  check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.vec,
                                       sizeof(p.vec)),
        "setting the epilogue's vector");
  // Stored shapes: op(A) is (m, k), op(B) (k, n).
  const bool ta = p.ta == CUBLAS_OP_T, tb = p.tb == CUBLAS_OP_T;
  Layout a, b, c, d;
  check(cublasLtMatrixLayoutCreate(&a.h, p.ab_type, ta ? p.k : p.m, ta ? p.m : p.k, p.lda),
        "the layout of A");
  check(cublasLtMatrixLayoutCreate(&b.h, p.ab_type, tb ? p.n : p.k, tb ? p.k : p.n, p.ldb),
        "the layout of B");
  check(cublasLtMatrixLayoutCreate(&c.h, p.d_type, p.m, p.n, p.ldd), "the layout of C");
  check(cublasLtMatrixLayoutCreate(&d.h, p.d_type, p.m, p.n, p.ldd), "the layout of D");
  const auto handle = at::cuda::getCurrentCUDABlasLtHandle();
  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  const auto algo = cached_algo(p, handle, op.h, a.h, b.h, c.h, d.h, workspace_size, device);
  if (!algo) return false;
  const float alpha = 1.f;
  check(cublasLtMatmul(handle, op.h, &alpha, p.a, a.h, p.b, b.h, &p.beta, p.c, c.h, p.d, d.h,
                       &*algo, at::cuda::getCUDABlasLtWorkspace(), workspace_size,
                       at::cuda::getCurrentCUDAStream(device).stream()),
        "cublasLtMatmul");
  return true;
}

bool bf16_cuda(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

bool linear_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const at::Tensor& r, at::Tensor& y) {
  if (!bf16_cuda(x) || !bf16_cuda(w) || !bf16_cuda(b) || !bf16_cuda(r) || w.dim() != 2) {
    return false;
  }
  const int64_t out = w.size(0), in = w.size(1);
  if (x.size(-1) != in || b.numel() != out || r.size(-1) != out || in % 8 != 0 || out % 8 != 0) {
    return false;
  }
  const int64_t rows = x.numel() / in;
  if (rows == 0 || r.numel() != rows * out) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  auto result = at::empty(sizes, x.options());
  // Row-major y (rows, out) is column-major (out, rows) = w (in, out)^T x (in, rows).
  Problem p{};
  p.ta = CUBLAS_OP_T, p.tb = CUBLAS_OP_N;
  p.m = out, p.n = rows, p.k = in, p.lda = in, p.ldb = in, p.ldd = out;
  p.ab_type = CUDA_R_16BF, p.d_type = CUDA_R_16BF, p.epilogue = CUBLASLT_EPILOGUE_BIAS;
  p.a = w.data_ptr(), p.b = x.data_ptr(), p.c = r.data_ptr(), p.d = result.data_ptr();
  p.vec = b.data_ptr(), p.beta = 1.f;
  if (!run(p, x.get_device())) return false;
  y = result;
  return true;
}

#else

bool linear_residual(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                     at::Tensor&) {
  return false;
}

#endif

}  // namespace slipstream::aero::lt_matmul
