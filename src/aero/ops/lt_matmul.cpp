#include "aero/ops/lt_matmul.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#if defined(SLIPSTREAM_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define SLIPSTREAM_LT_MATMUL 1
// fp8 tensors: LibTorch 2.1 and later.
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1
#define SLIPSTREAM_LT_FP8 1
#endif
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
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
// fp8 products (a_type, b_type fp8) take each operand's scale by device
// pointer, and their types' own rules: A transposed, B not.
struct Problem {
  cublasOperation_t ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  cudaDataType_t a_type, b_type, d_type;
  cublasLtEpilogue_t epilogue;
  const void *a, *b, *c;
  void* d;
  void* vec;
  float beta;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accum = false;

  auto key(int device) const {
    return std::make_tuple(device, int(ta), int(tb), m, n, k, lda, ldb, ldd, int(a_type),
                           int(b_type), int(d_type), int(epilogue), alignment(a), alignment(b),
                           alignment(c), alignment(d), beta != 0.f, fast_accum, int(mode()));
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

struct Layouts {
  Layout a, b, c, d;
};

// How many of the heuristic's algorithms Mode::tuned times.
constexpr int kTuneCandidates = 16;

// Up to `count` of cuBLASLt's heuristic algorithms for a problem, best
// guess first; empty where it has none.
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(const Problem& p, cublasLtHandle_t handle,
                                                  cublasLtMatmulDesc_t op, const Layouts& l,
                                                  size_t workspace, int count) {
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
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  const auto s = cublasLtMatmulAlgoGetHeuristic(handle, op, l.a.h, l.b.h, l.c.h, l.d.h, pref.h,
                                                count, results.data(), &found);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (s != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  }
  return algos;
}

struct Event {
  cudaEvent_t e = nullptr;
  Event() { TORCH_CHECK(cudaEventCreate(&e) == cudaSuccess, "lt_matmul: cudaEventCreate failed"); }
  ~Event() { cudaEventDestroy(e); }
};

// The fastest of `algos` for p on `stream`, each run kTuneWarmup + kTuneReps
// times, writing `scratch` (p's output shape and type) in place of p.d; the
// device is synchronised once per candidate. -1 where none ran.
int fastest(const Problem& p, cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const Layouts& l,
            const std::vector<cublasLtMatmulAlgo_t>& algos, void* scratch, void* workspace,
            size_t workspace_size, cudaStream_t stream, std::vector<float>& times) {
  constexpr int kTuneWarmup = 1, kTuneReps = 4;
  const float alpha = 1.f;
  const Event start, stop;
  int best = -1;
  times.assign(algos.size(), -1.f);
  for (size_t i = 0; i < algos.size(); ++i) {
    bool ok = true;
    for (int r = 0; r < kTuneWarmup + kTuneReps && ok; ++r) {
      if (r == kTuneWarmup) cudaEventRecord(start.e, stream);
      ok = cublasLtMatmul(handle, op, &alpha, p.a, l.a.h, p.b, l.b.h, &p.beta, p.c, l.c.h, scratch,
                          l.d.h, &algos[i], workspace, workspace_size,
                          stream) == CUBLAS_STATUS_SUCCESS;
    }
    cudaEventRecord(stop.e, stream);
    TORCH_CHECK(cudaEventSynchronize(stop.e) == cudaSuccess, "lt_matmul: timing a GEMM failed");
    float ms = 0.f;
    if (!ok || cudaEventElapsedTime(&ms, start.e, stop.e) != cudaSuccess) continue;
    times[i] = ms / kTuneReps;
    if (best < 0 || times[i] < times[best]) best = static_cast<int>(i);
  }
  return best;
}

std::atomic<bool> report_each_tuning{false};

bool report_tuning() { return report_each_tuning.load(std::memory_order_relaxed); }

// ATen's GEMM of a problem, written into its argument (the problem's output
// shape and type).
using AtenGemm = std::function<void(at::Tensor&)>;

// The mean time of `reps` runs of f on `stream` after one more, in ms.
float time_ms(const std::function<void()>& f, cudaStream_t stream, int reps) {
  const Event start, stop;
  f();
  cudaEventRecord(start.e, stream);
  for (int r = 0; r < reps; ++r) f();
  cudaEventRecord(stop.e, stream);
  TORCH_CHECK(cudaEventSynchronize(stop.e) == cudaSuccess, "lt_matmul: timing a GEMM failed");
  float ms = 0.f;
  TORCH_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e) == cudaSuccess,
              "lt_matmul: timing a GEMM failed");
  return ms / reps;
}

// Each problem's algorithm, found once per shape, layout, alignment and
// device; nullopt: cuBLASLt has none or, when `aten` (ATen's GEMM of the
// same product) is given, ATen's was the fastest, and the caller runs that.
// Picks made inside a CUDA graph capture, where nothing can be timed, are
// cuBLASLt's first and are not kept, so that the first use outside a
// capture tunes.
std::optional<cublasLtMatmulAlgo_t> pick_algo(const Problem& p, cublasLtHandle_t handle,
                                              cublasLtMatmulDesc_t op, const Layouts& l,
                                              void* workspace, size_t workspace_size,
                                              cudaStream_t stream, int device,
                                              const at::Tensor& out, const AtenGemm* aten) {
  using Key = decltype(p.key(0));
  static std::mutex mutex;
  static std::map<Key, std::optional<cublasLtMatmulAlgo_t>> cache;
  const auto key = p.key(device);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const bool tune = mode() == Mode::tuned;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess,
              "lt_matmul: cudaStreamIsCapturing failed");
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  const auto algos =
      heuristic_algos(p, handle, op, l, workspace_size, tune && !capturing ? kTuneCandidates : 1);
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (!algos.empty()) algo = algos.front();
  if (capturing) return algo;
  if (tune && (algos.size() > 1 || (aten != nullptr && !algos.empty()))) {
    // The candidates write the output itself, which the chosen one then
    // overwrites, unless the product accumulates into it in place.
    auto into = p.beta != 0.f && p.c == p.d ? at::empty_like(out) : out;
    std::vector<float> times;
    const int best =
        fastest(p, handle, op, l, algos, into.data_ptr(), workspace, workspace_size, stream, times);
    if (best >= 0) algo = algos[best];
    const float aten_ms = aten != nullptr ? time_ms([&] { (*aten)(into); }, stream, 4) : -1.f;
    if (aten != nullptr && (best < 0 || aten_ms < times[best])) algo.reset();
    if (report_tuning()) {
      std::printf("lt_matmul: m %lld n %lld k %lld op %c%c d %s%s: cuBLASLt's pick %.3f ms",
                  static_cast<long long>(p.m), static_cast<long long>(p.n),
                  static_cast<long long>(p.k), p.ta == CUBLAS_OP_T ? 'T' : 'N',
                  p.tb == CUBLAS_OP_T ? 'T' : 'N', p.d_type == CUDA_R_32F ? "fp32" : "bf16",
                  p.beta != 0.f ? " +C" : "", times[0]);
      std::printf(", fastest of %zu: #%d %.3f ms; ATen %.3f ms: %s\n", algos.size(), best,
                  best >= 0 ? times[best] : -1.f, aten_ms, algo ? "cuBLASLt" : "ATen");
    }
  }
  cache.emplace(key, algo);
  return algo;
}

// cuBLASLt's workspace on a stream: PyTorch's where it holds at least
// kWorkspace bytes, else one of that size of our own, kept for the process
// (split-K over 200k rows needs room for its partial sums). PyTorch's is
// made for its (handle, stream); ours, likewise, one a device and stream.
constexpr size_t kWorkspace = size_t(32) << 20;

std::pair<void*, size_t> workspace_for(int device, cudaStream_t stream) {
  const size_t torch_size = at::cuda::getCUDABlasLtWorkspaceSize();
  if (torch_size >= kWorkspace) return {at::cuda::getCUDABlasLtWorkspace(), torch_size};
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, at::Tensor> held;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& w = held[{device, stream}];
  if (!w.defined()) {
    w = at::empty({static_cast<int64_t>(kWorkspace)},
                  at::TensorOptions().device(at::kCUDA, device).dtype(at::kByte));
    if (report_tuning()) {
      std::printf("lt_matmul: PyTorch's cuBLASLt workspace %zu bytes; our own %zu a stream\n",
                  torch_size, kWorkspace);
    }
  }
  return {w.data_ptr(), kWorkspace};
}

// Runs p, whose output is `out`, on the current stream; false where
// cuBLASLt has no algorithm or ATen's GEMM (`aten`, when given) was timed
// faster.
bool run(const Problem& p, int device, const at::Tensor& out, const AtenGemm* aten = nullptr) {
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
  if (p.vec != nullptr) {
    check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.vec,
                                         sizeof(p.vec)),
          "setting the epilogue's vector");
  }
  if (p.a_scale != nullptr) {
    const int8_t fast = p.fast_accum ? 1 : 0;
    check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.a_scale,
                                         sizeof(p.a_scale)),
          "setting A's scale");
    check(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.b_scale,
                                         sizeof(p.b_scale)),
          "setting B's scale");
    check(
        cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)),
        "setting fast accumulation");
  }
  // Stored shapes: op(A) is (m, k), op(B) (k, n).
  const bool ta = p.ta == CUBLAS_OP_T, tb = p.tb == CUBLAS_OP_T;
  Layouts l;
  check(cublasLtMatrixLayoutCreate(&l.a.h, p.a_type, ta ? p.k : p.m, ta ? p.m : p.k, p.lda),
        "the layout of A");
  check(cublasLtMatrixLayoutCreate(&l.b.h, p.b_type, tb ? p.n : p.k, tb ? p.k : p.n, p.ldb),
        "the layout of B");
  check(cublasLtMatrixLayoutCreate(&l.c.h, p.d_type, p.m, p.n, p.ldd), "the layout of C");
  check(cublasLtMatrixLayoutCreate(&l.d.h, p.d_type, p.m, p.n, p.ldd), "the layout of D");
  const auto handle = at::cuda::getCurrentCUDABlasLtHandle();
  const auto stream = at::cuda::getCurrentCUDAStream(device).stream();
  const auto [workspace, workspace_size] = workspace_for(device, stream);
  const auto algo =
      pick_algo(p, handle, op.h, l, workspace, workspace_size, stream, device, out, aten);
  if (!algo) return false;
  const float alpha = 1.f;
  check(cublasLtMatmul(handle, op.h, &alpha, p.a, l.a.h, p.b, l.b.h, &p.beta, p.c, l.c.h, p.d,
                       l.d.h, &*algo, workspace, workspace_size, stream),
        "cublasLtMatmul");
  return true;
}

bool bf16_cuda(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// A row-major (r, c) operand t as cuBLASLt reads it, column-major: with
// unit stride along c its memory is t^T (op N, ld its row stride); with unit
// stride along r it is t (op T, ld its column stride). ok: bf16 on CUDA, one
// unit stride, ld a multiple of 8 and the data 16-byte aligned.
struct Operand {
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 0;
  bool ok = false;
};

Operand operand(const at::Tensor& t, at::ScalarType type = at::kBFloat16) {
  Operand o;
  if (!t.defined() || !t.is_cuda() || t.scalar_type() != type || t.dim() != 2 ||
      reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
    return o;
  }
  if (t.stride(1) == 1 && t.stride(0) >= t.size(1)) {
    o.op = CUBLAS_OP_N, o.ld = t.stride(0);
  } else if (t.stride(0) == 1 && t.stride(1) >= t.size(0)) {
    o.op = CUBLAS_OP_T, o.ld = t.stride(1);
  } else {
    return o;
  }
  o.ok = o.ld % (c10::elementSize(type) == 1 ? 16 : 8) == 0 && o.ld > 0;
  return o;
}

// The product out = a (rows, inner) b (inner, cols) [+ bias] [+ c] as
// cuBLASLt's Problem, but for the operations and operand types (the
// caller's): false where bias (bf16, cols), c or out (out_dtype, (rows,
// cols), contiguous) or out_dtype (bf16 or fp32) does not fit. result:
// out, or a new tensor. Row-major out (rows, cols) is column-major (cols,
// rows) = b^T a^T: b is cuBLASLt's A, a its B.
bool problem_of(const at::Tensor& a, const at::Tensor& b, const Operand& oa, const Operand& ob,
                const at::Tensor& bias, const at::Tensor& c, const at::Tensor& out,
                at::ScalarType out_dtype, Problem& p, at::Tensor& result) {
  const int64_t rows = a.size(0), inner = a.size(1), cols = b.size(1);
  if (out_dtype != at::kBFloat16 && out_dtype != at::kFloat) return false;
  if (bias.defined() && (out_dtype != at::kBFloat16 || !bf16_cuda(bias) || bias.numel() != cols)) {
    return false;
  }
  const auto fits = [&](const at::Tensor& t) {
    return t.is_cuda() && t.get_device() == a.get_device() && t.scalar_type() == out_dtype &&
           t.is_contiguous() && t.dim() == 2 && t.size(0) == rows && t.size(1) == cols &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (c.defined() && !fits(c)) return false;
  if (out.defined() && !fits(out)) return false;
  result = out.defined() ? out : at::empty({rows, cols}, a.options().dtype(out_dtype));
  p.m = cols, p.n = rows, p.k = inner, p.lda = ob.ld, p.ldb = oa.ld, p.ldd = cols;
  p.d_type = out_dtype == at::kFloat ? CUDA_R_32F : CUDA_R_16BF;
  p.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  p.a = b.data_ptr(), p.b = a.data_ptr(), p.d = result.data_ptr();
  p.c = c.defined() ? c.data_ptr() : result.data_ptr();
  p.vec = bias.defined() ? bias.data_ptr() : nullptr;
  p.beta = c.defined() ? 1.f : 0.f;
  return true;
}

// mm() and linear_residual(): `plain` marks a product without an epilogue,
// which Mode::aten leaves to ATen.
bool gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, const at::Tensor& c,
          at::Tensor& out, at::ScalarType out_dtype, bool plain) {
  if (plain && mode() == Mode::aten) return false;
  const auto oa = operand(a), ob = operand(b);
  if (!oa.ok || !ob.ok || a.get_device() != b.get_device()) return false;
  const int64_t rows = a.size(0), inner = a.size(1), cols = b.size(1);
  if (b.size(0) != inner || rows == 0 || inner == 0 || cols % 8 != 0) return false;
  const c10::cuda::CUDAGuard guard(a.device());
  Problem p{};
  at::Tensor result;
  if (!problem_of(a, b, oa, ob, bias, c, out, out_dtype, p, result)) return false;
  p.ta = ob.op, p.tb = oa.op;
  p.a_type = p.b_type = CUDA_R_16BF;
  // What the caller does where this declines: ATen's GEMM in bf16 (cast
  // to an fp32 out).
  const AtenGemm aten = [&](at::Tensor& into) {
    if (out_dtype == at::kBFloat16) {
      if (c.defined()) {
        at::addmm_out(into, c, a, b);
      } else if (bias.defined()) {
        at::addmm_out(into, bias, a, b);
      } else {
        at::mm_out(into, a, b);
      }
      return;
    }
    into.copy_(a.mm(b));
    if (c.defined()) into.add_(c);
  };
  if (!run(p, a.get_device(), result, plain ? &aten : nullptr)) return false;
  out = result;
  return true;
}

#ifdef SLIPSTREAM_LT_FP8
cudaDataType_t fp8_type(at::ScalarType t) {
  return t == at::ScalarType::Float8_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

bool fp8_operand(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::ScalarType::Float8_e4m3fn ||
                         t.scalar_type() == at::ScalarType::Float8_e5m2);
}

bool scale_on(const at::Tensor& s, const at::Tensor& like) {
  return s.defined() && s.is_cuda() && s.get_device() == like.get_device() &&
         s.scalar_type() == at::kFloat && s.numel() == 1 &&
         reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0;
}
#endif

}  // namespace

namespace {

std::atomic<Mode>& current_mode() {
  static std::atomic<Mode> m{Mode::tuned};
  return m;
}

}  // namespace

Mode mode() { return current_mode().load(std::memory_order_relaxed); }

void set_mode(Mode m) { current_mode().store(m, std::memory_order_relaxed); }

void set_report(bool on) { report_each_tuning.store(on, std::memory_order_relaxed); }

bool mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, const at::Tensor& c,
        at::Tensor& out, at::ScalarType out_dtype) {
  return gemm(a, b, bias, c, out, out_dtype, /*plain=*/true);
}

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
  at::Tensor result;
  if (!gemm(x.view({rows, in}), w.t(), b, r.view({rows, out}), result, at::kBFloat16,
            /*plain=*/false)) {
    return false;
  }
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  y = result.view(sizes);
  return true;
}

#ifdef SLIPSTREAM_LT_FP8
bool scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
               const at::Tensor& scale_b, const at::Tensor& bias, const at::Tensor& c,
               at::Tensor& out, at::ScalarType out_dtype, bool fast_accum) {
  if (!c.defined() && !bias.defined() && mode() == Mode::aten) return false;
  if (!fp8_operand(a) || !fp8_operand(b) || !a.is_cuda() || a.get_device() != b.get_device()) {
    return false;
  }
  const auto oa = operand(a, a.scalar_type()), ob = operand(b, b.scalar_type());
  // The fp8 GEMMs' layout: the contracted dimension contiguous in both.
  if (!oa.ok || !ob.ok || oa.op != CUBLAS_OP_N || ob.op != CUBLAS_OP_T) return false;
  if (a.scalar_type() == at::ScalarType::Float8_e5m2 &&
      b.scalar_type() == at::ScalarType::Float8_e5m2) {
    return false;
  }
  const int64_t rows = a.size(0), inner = a.size(1), cols = b.size(1);
  if (b.size(0) != inner || rows == 0 || inner % 16 != 0 || cols % 16 != 0) return false;
  if (!scale_on(scale_a, a) || !scale_on(scale_b, a)) return false;
  const c10::cuda::CUDAGuard guard(a.device());
  Problem p{};
  at::Tensor result;
  if (!problem_of(a, b, oa, ob, bias, c, out, out_dtype, p, result)) return false;
  // b's memory is cuBLASLt's A (op T), a's its B (op N).
  p.ta = CUBLAS_OP_T, p.tb = CUBLAS_OP_N;
  p.a_type = fp8_type(b.scalar_type()), p.b_type = fp8_type(a.scalar_type());
  p.a_scale = scale_b.data_ptr<float>(), p.b_scale = scale_a.data_ptr<float>();
  p.fast_accum = fast_accum;
  if (!run(p, a.get_device(), result)) return false;
  out = result;
  return true;
}
#else
bool scaled_mm(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
               const at::Tensor&, const at::Tensor&, at::Tensor&, at::ScalarType, bool) {
  return false;
}
#endif

#else

Mode mode() { return Mode::aten; }

void set_mode(Mode) {}

void set_report(bool) {}

bool mm(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
        at::ScalarType) {
  return false;
}

bool linear_residual(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                     at::Tensor&) {
  return false;
}

bool scaled_mm(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
               const at::Tensor&, const at::Tensor&, at::Tensor&, at::ScalarType, bool) {
  return false;
}

#endif

}  // namespace slipstream::aero::lt_matmul
