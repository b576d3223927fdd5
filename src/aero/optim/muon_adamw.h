// The recipe's optimizer: Muon for 2-D weight matrices, AdamW for the rest.
//
// Muon (as torch.optim.Muon): momentum buffer b <- mu*b + (1-mu)*g; the
// update is g.lerp(b, mu) (Nesterov) or b, orthogonalised by 5 Newton-Schulz
// steps in bf16 with coefficients (3.4445, -4.775, 2.0315) after dividing by
// max(||u||_F, eps); p <- p*(1 - lr*wd) - lr_adj*update with
// lr_adj = lr * 0.2 * sqrt(max(rows, cols)) ("match_rms_adamw": the update's
// RMS matches AdamW's). AdamW as torch.optim.AdamW (decoupled weight decay,
// bias-corrected moments).
//
// Newton-Schulz runs once per group of same-shape matrices (bmm over the
// stack). Everything runs on the parameters' device without host syncs. The state
// round-trips through named tensors for checkpoints.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double ns_a = 3.4445, ns_b = -4.775, ns_c = 2.0315;
  double eps = 1e-7;
  std::string adjust_lr = "match_rms_adamw";  // or "original": sqrt(max(1, rows/cols))
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // On CUDA, where LibTorch has it (PyTorch >= 2.1), the whole AdamW update
  // in one multi-tensor kernel (ATen's _fused_adamw_, as torch.optim.AdamW's
  // fused=True): one launch instead of nine foreach passes, and each tensor
  // read once. false, or elsewhere: the foreach passes. The two agree to
  // fp32 round-off.
  bool fused = true;
};

// Whether MuonAdamW's AdamW update on tensors like `param` takes the fused
// kernel (AdamWOptions::fused).
bool fused_adamw_applies(const torch::Tensor& param);

struct OptimizerOptions {
  std::string name = "muon";  // "muon" (Muon + AdamW) or "adamw" (AdamW only)
  double lr = 1e-3;
  double weight_decay = 1e-4;
  MuonOptions muon;
  AdamWOptions adamw;
};

// One Muon step on a matrix `param` with gradient `grad` and momentum buffer
// `buffer` (updated in place). Exposed for the reference test.
void muon_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& buffer, double lr,
                 double weight_decay, const MuonOptions& options);

// The orthogonalisation alone, of one matrix (r, c) or of a stack (k, r, c),
// each matrix on its own (batched matrix products).
torch::Tensor newton_schulz_orthogonalize(const torch::Tensor& update, const MuonOptions& options);

class MuonAdamW {
 public:
  MuonAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
            OptimizerOptions options);
  // Parameters without a gradient are left as they are (no weight decay
  // either), as torch.optim does.
  void step();
  // Drops every gradient (PyTorch's set_to_none), rather than zeroing it.
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  int64_t steps_taken() const { return steps_; }
  // Parameters that Muon updates, and those AdamW updates.
  size_t muon_parameter_count() const { return muon_.size(); }
  size_t adamw_parameter_count() const { return adam_.size(); }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const;
  void load_state_tensors(const std::map<std::string, torch::Tensor>& state);

 private:
  struct MuonSlot {
    std::string name;
    torch::Tensor param, buffer;
  };
  struct AdamSlot {
    std::string name;
    torch::Tensor param, exp_avg, exp_avg_sq;
  };
  OptimizerOptions options_;
  double lr_;
  int64_t steps_ = 0;
  std::vector<MuonSlot> muon_;
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> muon_groups_;  // by shape
  std::vector<AdamSlot> adam_;
  torch::Tensor fused_step_;  // the step count as the fused kernel reads it (fp32, on the device)
};

}  // namespace slipstream::aero
