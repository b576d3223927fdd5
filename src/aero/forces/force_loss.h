// The force coefficients as a training loss (`loss.forces`).
//
// On a surface sample the coefficients are linear in the model's outputs.
// For the kept cells i (area a_i, outward normal n_i), the model-space
// outputs y (N, C) and each field's map to physical units
// x = alpha_c * y + beta_c (normalisation and non-dimensionalisation, both
// affine), with q the free stream's dynamic pressure,
//   C_k = f * sum_i [ -(p_i - p_inf) (n_i . e_k) -/+ tau_i . e_k ] a_i / (q A_ref)
//       = sum_i sum_c W[i, c, k] y[i, c] + const,
// where e_k is the coefficient's axis (drag along U_inf, lift, side:
// axis_frame), -/+ the shear field's convention (force_coefficients.h) and
// f = the sample's cells / the kept cells, so that a subsample estimates the
// whole surface's coefficient. The constant cancels between prediction and
// truth, so the error of coefficient k for one sample is
//   dC_k = sum_i sum_c W[i, c, k] (y_pred[i, c] - y_true[i, c]),
// and the loss adds weight * mean over samples of sum_k (dC_k / scale)^2.
// W is built on the host with the batch; the term is a handful of device
// operations with no host synchronisation.
#pragma once

#include "aero/fields/field_schema.h"
#include "aero/forces/force_coefficients.h"

#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

// The targets forces are integrated from: the scalar whose nondim is
// pressure (Cp) and the vector whose nondim is stress (Cf); -1 when absent.
struct ForceFields {
  int pressure = -1, wss = -1;
  bool available() const { return pressure >= 0 && wss >= 0; }
};
ForceFields force_fields(const FieldSchema& fields);

struct ForceLossOptions {
  double weight = 0.0;  // 0: off
  double scale = 0.01;  // an error of `scale` in one coefficient costs `weight`
  std::vector<std::string> coefficients{"CD", "CL"};  // of CD, CL, CS
  bool enabled() const { return weight > 0; }
};
// Throws naming the key (loss.forces.weight, .scale, .coefficients) when a
// value is out of range, a coefficient is not CD, CL or CS, or one repeats.
void check_force_loss(const ForceLossOptions& options);

// What a batch's weights need besides the sample: the coefficients, the
// shear field's convention, the lift axis and A_ref (null: the sample's).
struct ForceLossFrame {
  std::vector<std::string> coefficients{"CD", "CL"};
  ShearConvention shear = ShearConvention::kWallOnFluid;
  Vec3 up_direction{0.0, 0.0, 1.0};
  std::optional<double> reference_area;
};

// W (N, C, K) fp32 for N kept cells. normals (N, 3), areas (N) or (N, 1);
// `flow` U_inf (the drag axis); `a_ref` > 0; `fraction` = the sample's cells
// over the kept ones. Throws when the schema has no pressure (nondim
// pressure) and wall shear (nondim stress) fields. (Every field's map to
// physical units is affine: FieldSchema::to_physical.)
torch::Tensor force_loss_weights(const torch::Tensor& normals, const torch::Tensor& areas,
                                 const FieldSchema& fields, const FreeStream& free_stream,
                                 const Vec3& flow, double a_ref, double fraction,
                                 const ForceLossFrame& frame);

}  // namespace slipstream::aero
