// OpenFOAM cases as their users hold them (tests/fixtures/openfoam/cube: a
// case OpenFOAM wrote, reconstructed and decomposed into two processors),
// read through VTK's reader: the same sample either way, the body patch's
// fields integrating to the solver's own forceCoeffs, and errors that list
// what the case has.
#include "aero/vtk/openfoam_case.h"
#include "aero/infer/inference.h"
#include "support/process.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>

namespace slipstream::aero {
namespace {

std::string cube() { return testing::fixtures_dir() + "/openfoam/cube"; }

FieldSchema surface_fields() { return testing::surface_field_schema(); }

Sample read(const std::string& kind, const std::string& case_type,
            const FieldSchema& fields = surface_fields()) {
  OpenFoamOptions o;
  o.patches = {"body"};
  o.case_type = case_type;
  return read_openfoam_case(cube(), kind, fields, {}, o);
}

// The rows of `s` ordered by their points (rounded to 1e-6 m, x then y then
// z): a decomposed case lists its cells processor by processor.
Sample sorted(const Sample& s) {
  const auto key = (s.point("points").to(torch::kDouble) * 1e6).round().to(torch::kLong);
  auto order = torch::arange(key.size(0), torch::kLong);
  for (int64_t axis = 2; axis >= 0; --axis) {
    const auto k = key.select(1, axis).index_select(0, order);
    order = order.index_select(0, std::get<1>(k.sort(/*stable=*/true, 0, false)));
  }
  Sample out = s;
  for (auto& [name, t] : out.point_data) t = t.index_select(0, order);
  return out;
}

void expect_same_rows(const Sample& a_in, const Sample& b_in) {
  const Sample a = sorted(a_in), b = sorted(b_in);
  ASSERT_EQ(a.num_points(), b.num_points());
  for (const auto& [name, t] : a.point_data) {
    ASSERT_TRUE(b.has_point(name)) << name;
    EXPECT_TRUE(torch::allclose(t, b.point(name), 1e-5, 1e-6)) << name;
  }
}

TEST(OpenFoamCaseTest, ReconstructedAndDecomposedGiveTheSameSurfaceAndVolume) {
  const Sample whole = read("surface", "auto"), split = read("surface", "decomposed");
  EXPECT_NE(whole.id.find("@12"), std::string::npos) << whole.id;  // the latest time
  EXPECT_GT(whole.num_points(), 100);
  expect_same_rows(whole, split);
  // The cube's six faces: areas sum to about 6 x 0.4^2 (snapped to 5 cm
  // cells, its edges are cut: 0.895) and the normals point out.
  EXPECT_NEAR(whole.point("area").sum().item<double>(), 0.96, 0.1);
  const auto outward = (whole.point("normals") * whole.point("points")).sum(1);
  EXPECT_TRUE((outward > 0).all().item<bool>());

  FieldSpec u, p, nut;
  u.name = "velocity";
  u.type = FieldType::kVector;
  p.name = "pressure";
  nut.name = "nut";
  const FieldSchema volume_fields({u, p, nut});
  const Sample cells = read("volume", "reconstructed", volume_fields);
  const Sample cells_split = read("volume", "decomposed", volume_fields);
  EXPECT_GT(cells.num_points(), 1000);
  expect_same_rows(cells, cells_split);
  // The SDF to the cube: positive in the fluid, its normal a unit vector.
  EXPECT_TRUE((cells.point("sdf") > 0).all().item<bool>());
  EXPECT_NEAR(cells.point("sdf_normals").norm(2, 1).mean().item<double>(), 1.0, 1e-4);
}

TEST(OpenFoamCaseTest, TheBodysFieldsIntegrateToOpenFoamsOwnCoefficients) {
  for (const char* type : {"reconstructed", "decomposed"}) {
    const Sample s = read("surface", type);
    // References from the forceCoeffs function object: magUInf 10 along x,
    // lRef 0.4, Aref 0.16.
    EXPECT_NEAR(s.global("U_inf")[0].item<double>(), 10.0, 1e-9);
    EXPECT_NEAR(s.global_scalar("A_ref", 0), 0.16, 1e-12);
    EXPECT_NEAR(s.global_scalar("L_ref", 0), 0.4, 1e-12);
    ASSERT_TRUE(s.has_global("CD_cfd")) << type;
    const double cd = s.global_scalar("CD_cfd", NAN), cl = s.global_scalar("CL_cfd", NAN);
    ForceSettings settings;
    settings.shear = ShearConvention::kWallOnFluid;
    const auto truth = torch::cat({s.point("pressure"), s.point("wss")}, 1);
    const auto f = surface_forces(s, truth, surface_fields(), settings);
    EXPECT_NEAR(f.at("CD"), cd, 0.005 * cd) << type;
    EXPECT_NEAR(f.at("CL"), cl, 0.01 * std::abs(cd)) << type;
  }
}

TEST(OpenFoamCaseTest, MissingPatchesFieldsAndTimesAreErrorsListingWhatTheCaseHas) {
  OpenFoamOptions o;
  o.patches = {"car*"};
  auto msg = testing::error_message_of(
      [&] { read_openfoam_case(cube(), "surface", surface_fields(), {}, o); });
  EXPECT_NE(msg.find("car*"), std::string::npos) << msg;
  EXPECT_NE(msg.find("body"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inlet"), std::string::npos) << msg;
  o.patches = {};
  msg = testing::error_message_of(
      [&] { read_openfoam_case(cube(), "surface", surface_fields(), {}, o); });
  EXPECT_NE(msg.find("--patch"), std::string::npos) << msg;
  o.patches = {"body"};
  msg = testing::error_message_of([&] {
    read_openfoam_case(cube(), "surface", surface_fields(), {{"wss", "tauWall"}}, o);
  });
  EXPECT_NE(msg.find("tauWall"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wallShearStress"), std::string::npos) << msg;
  o.time = "500";
  msg = testing::error_message_of(
      [&] { read_openfoam_case(cube(), "surface", surface_fields(), {}, o); });
  EXPECT_NE(msg.find("500"), std::string::npos) << msg;
  EXPECT_NE(msg.find("12"), std::string::npos) << msg;
  o.time = "12";
  EXPECT_EQ(read_openfoam_case(cube(), "surface", surface_fields(), {}, o).num_points(),
            read("surface", "auto").num_points());
}

TEST(OpenFoamCaseTest, PrepareReadsACaseDirectoryAsARun) {
  testing::TempDir dir;
  const auto e = testing::run_slipstream(
      {"prepare", "--format", "openfoam", "--in", cube(), "--patch", "body", "--out",
       dir.file("prepared"), "--val-fraction", "0", "dataset=prepared_surface"},
      std::chrono::seconds(120));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto manifest = nlohmann::json::parse(std::ifstream(dir.file("prepared/manifest.json")));
  EXPECT_EQ(manifest["train"], nlohmann::json::array({"cube.safetensors"}));
}

}  // namespace
}  // namespace slipstream::aero
