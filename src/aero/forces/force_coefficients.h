// Force and moment coefficients of a vehicle's surface, as aerodynamicists
// read them. Per cell c with outward unit normal n_c, area A_c and centroid
// x_c (physical units), the traction coefficient on the body is
//   t_c = -Cp_c n_c - Cf_c   when the shear field is the wall's stress on the
//                            fluid (OpenFOAM's wallShearStress, DrivAerML's
//                            wallShearStressMeanTrim: it points against the
//                            near-wall flow), the default;
//   t_c = -Cp_c n_c + Cf_c   when it is the fluid's stress on the wall,
// and
//   C_F = sum_c t_c A_c / A_ref,   C_M = sum_c (x_c - x_ref) x t_c A_c / (A_ref L_ref).
// (PhysicsNeMo's recipe forces.py adds DrivAerML's field with +, which puts
// its drag low by about twice the friction share.)
// Axes: drag d along U_inf; lift l = `up` made orthogonal to d (when `up`
// is parallel to d, the world axis least aligned with d takes its place);
// side s = l x d. Then
//   CD = C_F.d, CL = C_F.l, CS = C_F.s, CMR = C_M.d, CMP = C_M.s, CMY = C_M.l.
// Everything is computed in fp64.
#pragma once

#include <torch/types.h>

#include <array>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

using Vec3 = std::array<double, 3>;

// CD, CL, CS, CMR, CMP, CMY: the order every report uses.
const std::vector<std::string>& coefficient_names();

struct AxisFrame {
  Vec3 drag, lift, side;
};
AxisFrame axis_frame(const Vec3& flow_direction, const Vec3& up_direction);

// What a dataset's wall-shear field means (the config's dataset.shear_stress).
enum class ShearConvention { kWallOnFluid, kFluidOnWall };
// "wall_on_fluid" | "fluid_on_wall"; anything else throws naming the choices.
ShearConvention parse_shear_convention(const std::string& value);
std::string to_string(ShearConvention convention);

struct ForceOptions {
  double reference_area = 1.0;    // A_ref, physical units
  double reference_length = 1.0;  // L_ref for the moments
  Vec3 moment_center{0.0, 0.0, 0.0};
  Vec3 up_direction{0.0, 0.0, 1.0};
  ShearConvention shear = ShearConvention::kWallOnFluid;
};

// centroids (C, 3), normals (C, 3), areas (C) or (C, 1), cp (C) or (C, 1),
// cf (C, 3) the shear field over q_inf in `options.shear`'s convention; `flow` is U_inf (its
// direction is the drag axis).
std::map<std::string, double> force_coefficients(const torch::Tensor& centroids,
                                                 const torch::Tensor& normals,
                                                 const torch::Tensor& areas,
                                                 const torch::Tensor& cp, const torch::Tensor& cf,
                                                 const Vec3& flow, const ForceOptions& options);

// Over a split: per coefficient the mean predicted and true values, the mean
// absolute error, and R^2 = 1 - sum (pred - true)^2 / sum (true - mean true)^2
// (NaN with fewer than two samples or a truth whose standard deviation over
// the split is below kConstantTruth, e.g. the lift of symmetric bodies). A
// coefficient is summarised only where every map has it.
inline constexpr double kConstantTruth = 1e-6;
struct CoefficientSummary {
  double pred_mean = 0, true_mean = 0, mae = 0, r2 = 0;
  int64_t samples = 0;
};
std::map<std::string, CoefficientSummary> summarize_coefficients(
    const std::vector<std::map<std::string, double>>& pred,
    const std::vector<std::map<std::string, double>>& truth);

}  // namespace slipstream::aero
