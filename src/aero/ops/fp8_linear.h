// precision: fp8 — the model's Linear layers' three GEMMs (forward, input
// gradient, weight gradient) in fp8 on the GPU's fp8 tensor cores
// (cuBLASLt: lt_matmul::scaled_mm, each problem's algorithm timed once as
// numerics.gemm says; ATen's _scaled_mm where it declines one), everything
// else as under bf16 autocast: the fp32 master weights, the optimizer,
// LayerNorm, GELU, the slice and attention kernels.
//
// Formats and scales, as Transformer Engine's delayed scaling has them:
// activations and weights in e4m3, output gradients in e5m2, each with a
// per-tensor scale. Every Linear (keyed by its weight) has three scaled
// tensors: its input, its weight and its output's gradient. Each cast
// records the tensor's amax on the device; update_scales() (the trainer
// calls it at each training forward's start, inside the CUDA graph when
// the step is graphed) enters those amaxes into a history of the last
// `history` steps and makes each scale limit / max(history) / 2^margin, so
// no cast waits for a reduction over its own input and nothing syncs. A
// tensor's first scale comes from its own first cast's amax (one extra
// pass, once). A non-finite amax (an overflowing step, which the step
// guard then skips) is entered as 0 and leaves the scales as they were.
// The histories are not checkpointed: a resumed run starts them again, as
// from each tensor's first cast.
//
// The fp8 copies kept for the backward are the input's and the weight's,
// transposed (the fp8 GEMMs take both operands with the contracted
// dimension contiguous), one byte a value where bf16 keeps two.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace slipstream::aero::fp8 {

// The model's parts whose Linears may stay in bf16 under fp8 (the model
// code marks them with a Scope below): kEmbedding, the MLPs that lift the
// inputs (coordinates, SDF, normals, freestream) to the hidden width;
// kAttentionInputs, the projections of each block's attention inputs
// (Transolver's and GALE's in_project_x and in_project_fx, whose output
// makes the slice weights).
enum class Part { kBlocks, kEmbedding, kAttentionInputs };

struct Recipe {
  int history = 16;           // numerics.fp8_amax_history: steps of amaxes a scale is made from
  int margin = 0;             // numerics.fp8_margin: scales 2^-margin of the largest that fits
  std::vector<Part> exclude;  // numerics.fp8_exclude: these parts' Linears stay bf16
};

// The config's name of a part ("embedding", "attention_inputs") and back;
// part_named throws naming the config key for any other name.
std::string name_of(Part part);
Part part_named(const std::string& name);

// Marks the Linears run on this thread while it lives as `part`'s (scopes
// nest; the innermost counts). Under a recipe that excludes the part,
// applies() is false for them.
class Scope {
 public:
  explicit Scope(Part part);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Part previous_;
};

// Keys, while it lives, the Linears run on this thread whose weight is
// `derived` by `source` instead: for a weight a model makes from a
// parameter at each call (GALE's projections padded per head), so that its
// scaling state (slots, amax history, scales) is the parameter's, kept
// across steps, rather than a new one for each call's copy. Scopes nest.
class KeyAs {
 public:
  KeyAs(const at::Tensor& derived, const at::Tensor& source);
  ~KeyAs();
  KeyAs(const KeyAs&) = delete;
  KeyAs& operator=(const KeyAs&) = delete;
};

// How many Linears have fp8 scaling state (three slots each), for tests.
int64_t linears();

// Why fp8 GEMMs cannot run on `device` ("" when they can): not a GPU, a
// build without them (no CUDA, or a LibTorch before 2.1), or a GPU without
// fp8 tensor cores (compute capability below 8.9).
std::string unsupported(c10::Device device);

// Turns the fp8 GEMMs on (with `recipe`) or off for this process, and
// drops every tensor's scaling state.
void configure(bool on, const Recipe& recipe);
bool enabled();

// Whether linear(x, weight, bias) below takes this product: fp8 on, the
// current Scope's part not excluded, x and weight on one GPU, x floating,
// weight 2-D, and its widths multiples of 16, as the fp8 GEMMs need (x's
// rows, the weight gradient's contracted dimension, are padded with zero
// rows to a multiple of 16 in its fp8 copies). Otherwise the caller's bf16
// path runs.
bool applies(const at::Tensor& x, const at::Tensor& weight);

// x (..., in) weight^T (out, in) + bias (out, or undefined) [+ residual
// (..., out)]: (..., out) bf16, one autograd function whose three GEMMs run
// in fp8 as above. The residual, where given, is added by the GEMM's
// epilogue (cuBLASLt, lt_matmul::scaled_mm; the sum rounded to bf16 once)
// where it takes the product, else after it. Gradients: x's in x's dtype,
// weight's (fp32 from the GEMM) in the weight's, the bias's summed over
// rows in fp32 (or the sums a LayerNorm's backward offered, linear.h), the
// residual's the output's.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& residual = {});

// Whether linear_pair below takes these products: applies() to both.
bool linear_pair_applies(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2);

// {linear(x, w1, b1), linear(x, w2, b2)} as one autograd function: x cast
// to e4m3 once (at w1's input scale), for both products and both weight
// gradients; x's gradient is g1 w1 with g2 w2 added by the second GEMM's
// epilogue where cuBLASLt takes it. Outputs and weight gradients bitwise
// the two apart (x's scale is the same: its amax history is w1's); x's
// gradient rounded to bf16 once rather than twice. Both biases defined.
std::pair<at::Tensor, at::Tensor> linear_pair(const at::Tensor& x, const at::Tensor& w1,
                                              const at::Tensor& b1, const at::Tensor& w2,
                                              const at::Tensor& b2);

// Whether gelu_mlp below takes this MLP: applies(x, w1), and w2 (out,
// hidden) on x's GPU with w1 (hidden, in), out a multiple of 16.
bool gelu_mlp_applies(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2);

// linear(gelu(linear(x, w1, b1)), w2, b2) (exact GELU), both products in
// fp8 as linear() makes them, as one autograd function: the same values as
// the three apart, bitwise but for b1's gradient, summed in fp32 in another
// order. gelu(h) is written only as the second product's e4m3 copies, by
// the GELU pass itself; backward, h's gradient is made, cast to e5m2 and
// summed over rows (b1's gradient) in one pass over h and dL/dgelu(h)
// (fp8_kernels.h's quantize_gelu). Keeps h and the fp8 copies the two
// linear()s keep; keep_gelu false (an Mlp's recompute_gelu): all but
// gelu(h)'s transposed e4m3 copy (w2's gradient's operand), which the
// backward casts again from h at the same scale (the same bytes within a
// step), for rows x hidden bytes less memory and a pass over h more. Both
// biases defined; residual, where given, added by the second product as
// linear() adds it.
at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& residual = {},
                    bool keep_gelu = true);

// A residual block's LayerNorm and the fp8 products of its output as one
// function: LayerNorm(x) (fused_layer_norm.h's kernels: x bf16, weight and
// bias fp32, widths multiples of 64 up to 1024) is written only as the
// first product's e4m3 copies, never in bf16 (layer_norm_kernels.h's
// forward_e4m3), a pass over it less each way; backward, its kernel takes
// the products' gradient of LayerNorm(x) and adds the residual's.
// The same values as fused_layer_norm_residual and the products apart,
// bitwise.
//
// {linear_pair(LayerNorm(x), w1, b1, w2, b2), r}, r equal to x (the
// residual of fused_layer_norm_residual).
bool norm_linear_pair_applies(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                              const at::Tensor& w1, const at::Tensor& w2);
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_linear_pair(
    const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b, double eps,
    const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2);
// gelu_mlp(LayerNorm(x), w1, b1, w2, b2, x, keep_gelu): the MLP with x
// itself as the residual (w2's rows x's width).
bool norm_gelu_mlp_applies(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                           const at::Tensor& w1, const at::Tensor& w2);
at::Tensor norm_gelu_mlp(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                         double eps, const at::Tensor& w1, const at::Tensor& b1,
                         const at::Tensor& w2, const at::Tensor& b2, bool keep_gelu = true);

// Enters every tensor's amax since the last call into its history and
// remakes its scale, in one launch on the current stream; nothing when fp8
// is off or no Linear has run yet.
void update_scales();

// A Linear's scaling state, for tests and logs: rows input, weight, output
// gradient. amax (3) since the last update_scales(), history (3, history),
// scale (3); undefined tensors for a weight no fp8 linear has seen.
struct State {
  at::Tensor amax, history, scale;
};
State state_of(const at::Tensor& weight);

}  // namespace slipstream::aero::fp8
