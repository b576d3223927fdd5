// Real CFD data path: STL signed distances against the analytic sphere, the
// STL reader and .vtu writer (written without VTK) against VTK's own reader,
// VTK files with bad content, and the whole chain make-synthetic --format vtk ->
// prepare -> train -> infer, read back with VTK. Built where VTK is.
#include "aero/data/dataset.h"
#include "aero/geometry/stl_file.h"
#include "aero/geometry/triangle_mesh.h"
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#include "aero/vtk/vtu_stream.h"
#include "aero/vtk/vtu_writer.h"
#include "core/io/staged_directory.h"
#include "support/files.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <vtkCellData.h>
#include <vtkCellType.h>
#include <vtkFloatArray.h>
#include <vtkIdList.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPolyData.h>
#include <vtkSTLReader.h>
#include <vtkUnstructuredGrid.h>
#include <vtkXMLUnstructuredGridReader.h>
#include <vtkXMLUnstructuredGridWriter.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace slipstream::aero {
namespace {

namespace fs = std::filesystem;

using testing::error_message_of;

TEST(SignedDistanceTest, SphereStlMatchesTheAnalyticDistanceWithinTheChordError) {
  const double r = 1.0;
  const auto mesh = make_icosphere(r, {0.5, -0.25, 0.1}, 4);
  // Chord error: the largest gap between the sphere and the faces.
  double gap = 0;
  for (const auto& f : mesh.faces) {
    std::array<double, 3> c{0, 0, 0};
    for (int k = 0; k < 3; ++k)
      for (int d = 0; d < 3; ++d) c[d] += mesh.vertices[f[k]][d] / 3.0;
    const double dc =
        std::sqrt(std::pow(c[0] - 0.5, 2) + std::pow(c[1] + 0.25, 2) + std::pow(c[2] - 0.1, 2));
    gap = std::max(gap, r - dc);
  }
  ASSERT_GT(gap, 0.0);
  ASSERT_LT(gap, 0.01);
  torch::manual_seed(0);
  auto pts = torch::rand({4000, 3}, torch::kDouble) * 6 - 3;
  torch::Tensor sdf, normals;
  SignedDistance(mesh).query(pts, sdf, normals);
  auto offset = pts - torch::tensor({0.5, -0.25, 0.1}, torch::kDouble).view({1, 3});
  auto analytic = offset.norm(2, 1, true) - r;
  const double worst = (sdf.to(torch::kDouble) - analytic).abs().max().item<double>();
  EXPECT_LE(worst, gap + 1e-5) << "chord error " << gap;
  // Inside is negative; the normal is the distance's gradient: radial, outward.
  auto inside = analytic < -2 * gap;
  EXPECT_TRUE((sdf.index({inside}) < 0).all().item<bool>());
  auto far = (analytic.abs() > 0.2).squeeze(1);
  auto radial = offset.index({far}) / offset.index({far}).norm(2, 1, true);
  auto cosine = (normals.index({far}).to(torch::kDouble) * radial).sum(1);
  EXPECT_GT(cosine.min().item<double>(), 0.99);
}

TEST(SignedDistanceTest, OpenOrEmptyMeshesAreRejectedByName) {
  auto mesh = make_icosphere(1.0, {0, 0, 0}, 1);
  mesh.name = "car.stl";
  mesh.faces.pop_back();
  const auto msg = error_message_of([&] { SignedDistance{mesh}; });
  EXPECT_NE(msg.find("car.stl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("watertight"), std::string::npos) << msg;
  testing::TempDir dir;
  std::ofstream(dir.file("empty.stl")).close();
  EXPECT_NE(error_message_of([&] { read_stl(dir.file("empty.stl")); }).find("empty.stl"),
            std::string::npos);
}

// The same mesh as vtkSTLReader with merging: vertices in the same order,
// the same triangles, a degenerate one dropped by both; on the Ahmed body,
// a sphere written here, and an ASCII file.
TEST(StlFileTest, TheReaderGivesVtksMesh) {
  testing::TempDir dir;
  write_stl(dir.file("sphere.stl"), make_icosphere(0.5, {1.0, 2.0, -3.0}, 3));
  std::ofstream(dir.file("ascii.stl"))
      << "solid a\n facet normal 0 0 1\n  outer loop\n   vertex 0 0 0\n   vertex 1 0 0\n"
         "   vertex 0 1 0\n  endloop\n endfacet\n facet normal 0 0 1\n  outer loop\n"
         "   vertex 1 0 0\n   vertex 1 0 0\n   vertex 0 1 0\n  endloop\n endfacet\n"
         " facet normal 0 0 1\n  outer loop\n   vertex 1 0 0\n   vertex 1 1 0.5\n"
         "   vertex 0 1 0\n  endloop\n endfacet\nendsolid a\n";
  for (const auto& path : {testing::fixtures_dir() + "/ahmed/run_16/drivaer_16.stl",
                           dir.file("sphere.stl"), dir.file("ascii.stl")}) {
    const auto ours = read_stl(path);
    vtkNew<vtkSTLReader> reader;
    reader->SetFileName(path.c_str());
    reader->MergingOn();
    reader->Update();
    vtkPolyData* poly = reader->GetOutput();
    ASSERT_EQ(static_cast<int64_t>(ours.vertices.size()), poly->GetNumberOfPoints()) << path;
    for (vtkIdType i = 0; i < poly->GetNumberOfPoints(); ++i) {
      double p[3];
      poly->GetPoint(i, p);
      for (int d = 0; d < 3; ++d) ASSERT_EQ(ours.vertices[static_cast<size_t>(i)][d], p[d]) << path;
    }
    ASSERT_EQ(static_cast<int64_t>(ours.faces.size()), poly->GetNumberOfPolys()) << path;
    vtkNew<vtkIdList> ids;
    for (vtkIdType c = 0; c < poly->GetNumberOfPolys(); ++c) {
      poly->GetCellPoints(c, ids);
      ASSERT_EQ(ids->GetNumberOfIds(), 3) << path;
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(ours.faces[static_cast<size_t>(c)][static_cast<size_t>(k)], ids->GetId(k))
            << path << " triangle " << c;
      }
    }
  }
}

// The .vtu written without VTK: VTK's reader finds the points, one vertex
// cell each and the fields, bit for bit; VtuStream reads the same rows.
TEST(VtkIoTest, TheVtuWrittenWithoutVtkIsReadByVtkAndStreamed) {
  testing::TempDir dir;
  const int64_t n = 3001;
  torch::manual_seed(5);
  const auto points = torch::randn({n, 3});
  const auto p = torch::randn({n});
  const auto u = torch::randn({n, 3}, torch::kDouble);
  write_vtu(dir.file("a.vtu"), points, {{"pMeanTrim", p}, {"UMeanTrim", u}});
  const auto v = read_vtu(dir.file("a.vtu"), {"pMeanTrim", "UMeanTrim"});
  EXPECT_TRUE(torch::equal(v.points, points));
  EXPECT_TRUE(torch::equal(v.fields.at("pMeanTrim"), p.view({n, 1})));
  EXPECT_TRUE(torch::equal(v.fields.at("UMeanTrim"), u.to(torch::kFloat)));
  vtkNew<vtkXMLUnstructuredGridReader> reader;
  reader->SetFileName(dir.file("a.vtu").c_str());
  reader->Update();
  vtkUnstructuredGrid* g = reader->GetOutput();
  ASSERT_EQ(g->GetNumberOfCells(), n);
  for (const vtkIdType c : {vtkIdType{0}, vtkIdType{1234}, vtkIdType{n - 1}}) {
    EXPECT_EQ(g->GetCellType(c), VTK_VERTEX);
    vtkNew<vtkIdList> ids;
    g->GetCellPoints(c, ids);
    ASSERT_EQ(ids->GetNumberOfIds(), 1);
    EXPECT_EQ(ids->GetId(0), c);
  }
  const VtuStream stream({dir.file("a.vtu")});
  ASSERT_TRUE(stream.supported()) << stream.why_unsupported();
  EXPECT_EQ(stream.points(), n);
  const auto cursor = stream.cursor("UMeanTrim");
  const auto first = cursor->next(1000), rest = cursor->next(n - 1000);
  EXPECT_TRUE(torch::equal(torch::cat({first, rest}), u.to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(stream.cursor("points")->next(n), points));
  const auto bad = error_message_of([&] {
    write_vtu(dir.file("b.vtu"), points, {{"pMeanTrim", torch::zeros({n - 1})}});
  });
  EXPECT_NE(bad.find("b.vtu"), std::string::npos) << bad;
  EXPECT_NE(bad.find("pMeanTrim"), std::string::npos) << bad;
  EXPECT_FALSE(fs::exists(dir.file("b.vtu")));
}

TEST(VtkIoTest, CellDataMovesToPointsAndBadFilesNameTheFileAndField) {
  testing::TempDir dir;
  const int64_t n = 50;
  auto points = torch::rand({n, 3});
  auto p = torch::rand({n, 1});
  write_vtu(dir.file("a.vtu"), points, {{"pMeanTrim", p}});
  auto v = read_vtu(dir.file("a.vtu"), {"pMeanTrim"});
  EXPECT_TRUE(torch::allclose(v.points, points));
  EXPECT_TRUE(torch::allclose(v.fields["pMeanTrim"], p));

  // The same values as cell data on one vertex cell per point.
  {
    vtkNew<vtkXMLUnstructuredGridReader> reader;
    reader->SetFileName(dir.file("a.vtu").c_str());
    reader->Update();
    vtkUnstructuredGrid* g = reader->GetOutput();
    vtkDataArray* a = g->GetPointData()->GetArray("pMeanTrim");
    vtkNew<vtkFloatArray> cell;
    cell->DeepCopy(a);
    cell->SetName("pCell");
    g->GetCellData()->AddArray(cell);
    g->GetPointData()->RemoveArray("pMeanTrim");
    write_vtu(dir.file("unused.vtu"), points, {});  // exercise the writer's temp+rename again
    vtkNew<vtkXMLUnstructuredGridWriter> w;
    w->SetFileName(dir.file("cells.vtu").c_str());
    w->SetInputData(g);
    ASSERT_EQ(w->Write(), 1);
  }
  auto c = read_vtu(dir.file("cells.vtu"), {"pCell"});
  EXPECT_TRUE(torch::allclose(c.fields["pCell"], p));

  const auto missing = error_message_of([&] { read_vtu(dir.file("a.vtu"), {"UMeanTrim"}); });
  EXPECT_NE(missing.find("a.vtu"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'UMeanTrim'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("pMeanTrim"), std::string::npos) << missing;  // lists what it has

  fs::copy_file(dir.file("a.vtu"), dir.file("cut.vtu"));
  fs::resize_file(dir.file("cut.vtu"), fs::file_size(dir.file("cut.vtu")) / 3);
  const auto cut = error_message_of([&] { read_vtu(dir.file("cut.vtu"), {"pMeanTrim"}); });
  EXPECT_NE(cut.find("cut.vtu"), std::string::npos) << cut;
}

TEST(VtkIoTest, AFieldWithTheWrongNumberOfValuesIsAnError) {
  testing::TempDir dir;
  const int64_t n = 40;
  write_vtu(dir.file("a.vtu"), torch::rand({n, 3}), {{"pMeanTrim", torch::rand({n, 1})}});
  vtkNew<vtkXMLUnstructuredGridReader> reader;
  reader->SetFileName(dir.file("a.vtu").c_str());
  reader->Update();
  vtkUnstructuredGrid* g = reader->GetOutput();
  vtkNew<vtkFloatArray> short_array;
  short_array->SetName("nutMeanTrim");
  short_array->SetNumberOfTuples(n - 5);
  short_array->FillValue(1.0f);
  g->GetPointData()->AddArray(short_array);
  vtkNew<vtkXMLUnstructuredGridWriter> w;
  w->SetFileName(dir.file("mismatch.vtu").c_str());
  w->SetInputData(g);
  w->Write();
  const auto msg = error_message_of([&] { read_vtu(dir.file("mismatch.vtu"), {"nutMeanTrim"}); });
  EXPECT_NE(msg.find("mismatch.vtu"), std::string::npos) << msg;
}

TEST(RawRunTest, WrongComponentsAndMissingMetadataAreNamed) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 300;
  write_synthetic_vtk_runs(dir.path(), o, 1);
  const std::string run = dir.file("run_0000");
  const FieldSchema targets = default_volume_fields();
  // A scalar where a vector is needed.
  const auto msg = error_message_of([&] {
    read_raw_run(run, targets, {{"velocity", "pMeanTrim"}});
  });
  EXPECT_NE(msg.find("pMeanTrim"), std::string::npos) << msg;
  EXPECT_NE(msg.find("velocity"), std::string::npos) << msg;
  // The run reads back with DrivAerML's names, and carries its free stream.
  const Sample s = read_raw_run(run, targets, {});
  EXPECT_EQ(s.point("velocity").size(1), 3);
  EXPECT_TRUE(s.has_global("L_ref"));
  fs::remove(run + "/metadata.json");
  EXPECT_NE(error_message_of([&] { read_raw_run(run, targets, {}); }).find("metadata.json"),
            std::string::npos);
  // A DrivAerML run (its geo_ref_i.csv, no metadata.json): DrivAerML's free
  // stream, its lRef and aRef, and the CFD's own coefficients.
  std::ofstream(run + "/geo_ref_0.csv") << "lRef,aRef\n4.6,2.17\n";
  std::ofstream(run + "/force_mom_0.csv") << "Cd,Cl,Cs\n0.27,-0.05,0.001\n";
  const Sample d = read_raw_run(run, targets, {});
  EXPECT_FLOAT_EQ(d.global("U_inf")[0].item<float>(), 38.89f);
  EXPECT_DOUBLE_EQ(d.global_scalar("L_ref", 0.0), 4.6);
  EXPECT_DOUBLE_EQ(d.global_scalar("A_ref", 0.0), 2.17);
  EXPECT_DOUBLE_EQ(d.global_scalar("CD_cfd", 0.0), 0.27);
}

// DrivAerML ships big volumes as volume_i.vtu.00.part, .01.part, ...: the
// pieces read as the whole file would (no concatenated copy), and a gap or
// a mix of a .vtu and pieces is named.
TEST(RawRunTest, AVolumeInNumberedPiecesReadsAsTheWholeFile) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 2000;
  write_synthetic_vtk_runs(dir.path(), o, 1);
  const std::string run = dir.file("run_0000");
  const FieldSchema targets = default_volume_fields();
  const Sample whole = read_raw_run(run, targets, {});
  testing::split_into_parts(run + "/volume.vtu", 3);
  auto msg = error_message_of([&] { read_raw_run(run, targets, {}); });
  EXPECT_NE(msg.find("both a .vtu and pieces"), std::string::npos) << msg;
  fs::remove(run + "/volume.vtu");
  const Sample pieces = read_raw_run(run, targets, {});
  for (const char* name : {"points", "velocity", "pressure", "nut", "sdf"}) {
    EXPECT_TRUE(torch::equal(pieces.point(name), whole.point(name))) << name;
  }
  // `prepare --limit-points` on the DrivAerML-layout folder: a fixed subset
  // of the run's own points, each with its own values and SDF.
  PrepareOptions po;
  po.val_fraction = 0;
  po.limit_points = 500;
  const auto report = prepare_runs(dir.path(), dir.file("prepared"), po);
  EXPECT_EQ(report.points, 500);
  const Sample quick = read_sample_file(dir.file("prepared/run_0000.safetensors"));
  ASSERT_EQ(quick.num_points(), 500);
  // Distances from the differences (cdist's compute mode 2): the faster
  // |x|^2 + |y|^2 - 2xy form is not exactly 0 for equal points.
  const auto match =
      torch::cdist(quick.point("points"), whole.point("points"), 2.0, /*compute_mode=*/2).min(1);
  EXPECT_EQ(std::get<0>(match).max().item<float>(), 0.f);
  const auto rows = std::get<1>(match);
  for (const char* name : {"velocity", "pressure", "sdf"}) {
    EXPECT_TRUE(torch::allclose(quick.point(name), whole.point(name).index_select(0, rows)))
        << name;
  }
  fs::remove(run + "/volume.vtu.01.part");
  msg = error_message_of([&] { read_raw_run(run, targets, {}); });
  EXPECT_NE(msg.find("piece 1 of 'volume.vtu' is missing"), std::string::npos) << msg;
}

// prepare writes a staging directory and swaps it in whole: a prepare that
// fails leaves the dataset already in --out as it was, one holding the lock
// keeps a second out, and --out never replaces --in or foreign files.
TEST(RawRunTest, PrepareReplacesADatasetWholeOrLeavesItAsItWas) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 300;
  write_synthetic_vtk_runs(dir.file("raw"), o, 2);
  PrepareOptions po;
  po.val_fraction = 0;
  const std::string out = dir.file("prepared");
  const auto first = prepare_runs(dir.file("raw"), out, po);
  ASSERT_EQ(first.runs, 2);
  // Both streamed, each stage's time counted within the whole.
  EXPECT_EQ(first.streamed, 2);
  const auto& t = first.stream;
  EXPECT_GT(t.sdf, 0);
  EXPECT_GT(t.commit, 0);
  EXPECT_LE(t.setup + t.commit, t.wall);
  EXPECT_LE(t.sdf, t.wall);
  EXPECT_LE(t.wall, first.seconds);
  const std::string manifest = testing::file_bytes(out + "/manifest.json");
  const std::string sample = testing::file_bytes(out + "/run_0001.safetensors");
  // A third run that fails half-way (its STL is not watertight).
  write_synthetic_vtk_runs(dir.file("more"), o, 3);
  fs::rename(dir.file("more/run_0002"), dir.file("raw/run_0002"));
  std::ofstream(dir.file("raw/run_0002/body.stl"), std::ios::trunc) << "solid x\nendsolid x\n";
  EXPECT_THROW(prepare_runs(dir.file("raw"), out, po), c10::Error);
  EXPECT_EQ(testing::file_bytes(out + "/manifest.json"), manifest);
  EXPECT_EQ(testing::file_bytes(out + "/run_0001.safetensors"), sample);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find("prepared."), std::string::npos)
        << "left behind: " << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 3u);  // raw, more, prepared
  // A live process holding the lock keeps this one out, naming it.
  remove_tree(dir.file("raw/run_0002"));
  const pid_t holder = fork();
  if (holder == 0) {
    pause();
    _exit(0);
  }
  std::ofstream(out + ".lock") << holder << "\n";
  const auto msg = error_message_of([&] { prepare_runs(dir.file("raw"), out, po); });
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  EXPECT_NE(msg.find("is being written by process " + std::to_string(holder)), std::string::npos)
      << msg;
  // Its holder gone, the lock is taken over; the dataset is replaced.
  EXPECT_EQ(prepare_runs(dir.file("raw"), out, po).runs, 2);
  EXPECT_FALSE(fs::exists(out + ".lock"));
  // --out holding --in, or foreign files, is refused before any work.
  EXPECT_NE(error_message_of([&] {
              prepare_runs(dir.file("raw"), dir.path(), po);
            }).find("would replace it"),
            std::string::npos);
  fs::create_directories(dir.file("mine"));
  std::ofstream(dir.file("mine/notes.txt")) << "keep me\n";
  EXPECT_NE(error_message_of([&] {
              prepare_runs(dir.file("raw"), dir.file("mine"), po);
            }).find("not a dataset prepare wrote"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(dir.file("mine/notes.txt")));
  // --out inside --in is fine: it is not taken for a run.
  EXPECT_EQ(prepare_runs(dir.file("raw"), dir.file("raw/prepared"), po).runs, 2);
  EXPECT_EQ(prepare_runs(dir.file("raw"), dir.file("raw/prepared"), po).runs, 2);
}

int sh(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(VtkPipelineTest, MakeSyntheticPrepareTrainInferThenReadThePredictionBack) {
  testing::TempDir dir;
  const std::string bin = std::getenv("SLIPSTREAM_BIN");
  const std::string d = dir.path();
  const std::string cfg =
      " device=cpu model.n_layers=1 model.n_hidden=32 model.n_head=2 model.slice_num=8";
  ASSERT_EQ(sh(bin + " make-synthetic --format vtk --out " + d +
               "/raw dataset.num_train=3 "
               "dataset.num_val=1 dataset.points_per_sample=3000 > " +
               d + "/log 2>&1"),
            0);
  ASSERT_EQ(sh(bin + " prepare --in " + d + "/raw --out " + d + "/prepared >> " + d + "/log 2>&1"),
            0);
  ASSERT_EQ(sh(bin + " train dataset=prepared dataset.path=" + d +
               "/prepared training.num_epochs=1 "
               "run_id=r output_dir=" +
               d + "/runs dataset.sampling_resolution=1024" + cfg + " >> " + d + "/log 2>&1"),
            0);
  ASSERT_EQ(sh(bin + " infer --checkpoint " + d + "/runs/r/checkpoints --in " + d +
               "/raw/run_0003 --out " + d + "/pred.vtu --device cpu >> " + d + "/log 2>&1"),
            0)
      << d;
  // Again, over its own output (allowed), then onto the raw run it reads (refused, the
  // run untouched).
  ASSERT_EQ(sh(bin + " infer --checkpoint " + d + "/runs/r/checkpoints --in " + d +
               "/raw/run_0003 --out " + d + "/pred.vtu --device cpu >> " + d + "/log 2>&1"),
            0);
  const auto raw_size = fs::file_size(d + "/raw/run_0003/volume.vtu");
  EXPECT_NE(sh(bin + " infer --checkpoint " + d + "/runs/r/checkpoints --in " + d +
               "/raw/run_0003 --out " + d + "/raw/run_0003/volume.vtu --device cpu > " + d +
               "/onto 2>&1"),
            0);
  EXPECT_EQ(fs::file_size(d + "/raw/run_0003/volume.vtu"), raw_size);
  {
    std::ifstream in(d + "/onto");
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(said.find("would land on the input"), std::string::npos) << said;
  }
  const std::vector<std::string> names = {"velocity_pred", "velocity_true", "velocity_error",
                                          "pressure_pred", "nut_pred",      "nut_error"};
  vtkNew<vtkXMLUnstructuredGridReader> reader;
  reader->SetFileName((d + "/pred.vtu").c_str());
  reader->Update();
  vtkUnstructuredGrid* g = reader->GetOutput();
  ASSERT_EQ(g->GetNumberOfPoints(), 3000);
  for (const auto& name : names) {
    vtkDataArray* a = g->GetPointData()->GetArray(name.c_str());
    ASSERT_NE(a, nullptr) << name;
    EXPECT_EQ(a->GetNumberOfComponents(), name.rfind("velocity", 0) == 0 ? 3 : 1) << name;
  }
  // error = pred - true, and true is the run's own field.
  auto raw = read_vtu(d + "/raw/run_0003/volume.vtu", {"UMeanTrim"});
  auto out = read_vtu(d + "/pred.vtu", {"velocity_pred", "velocity_true", "velocity_error"});
  EXPECT_TRUE(torch::allclose(out.fields["velocity_true"], raw.fields["UMeanTrim"]));
  EXPECT_TRUE(torch::allclose(out.fields["velocity_error"],
                              out.fields["velocity_pred"] - out.fields["velocity_true"], 1e-5,
                              1e-6));
  std::ifstream metrics(d + "/pred.json");
  const auto j = nlohmann::json::parse(metrics);
  EXPECT_TRUE(j["metrics"].contains("velocity_l2"));
  EXPECT_EQ(j["points"], 3000);
  EXPECT_EQ(j["precision"], "fp32");
}

FieldSchema surface_fields() { return testing::surface_field_schema(); }

TEST(SurfaceRunTest, SyntheticRunReadsBackWithItsReferencesAndTheCfdCoefficients) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.kind = "surface";
  o.points_per_sample = 2000;
  write_synthetic_vtk_runs(dir.path(), o, 1);
  const std::string run = dir.file("run_0");
  ASSERT_TRUE(fs::exists(run + "/boundary_0.vtp"));
  std::vector<std::string> warnings;
  const Sample s = read_raw_surface_run(run, surface_fields(), {}, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  const Sample quick = read_raw_surface_run(run, surface_fields(), {}, nullptr, 100);
  EXPECT_EQ(quick.num_points(), 100);
  EXPECT_EQ(quick.mesh.at("offsets").size(0), 101);
  const Sample truth = make_synthetic_surface_sample(0, o);
  ASSERT_EQ(s.num_points(), truth.num_points());
  EXPECT_TRUE(torch::allclose(s.point("points"), truth.point("points"), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(s.point("normals"), truth.point("normals"), 1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(s.point("wss"), truth.point("wss")));
  // L_ref and A_ref come from geo_ref_0.csv, the CFD's Cd from force_mom_0.csv.
  EXPECT_NEAR(s.global_scalar("L_ref", 0), truth.global_scalar("L_ref", 1), 1e-12);
  EXPECT_NEAR(s.global_scalar("A_ref", 0), truth.global_scalar("A_ref", 1), 1e-12);
  ASSERT_TRUE(s.has_global("CD_cfd"));
  ASSERT_TRUE(s.has_global("CL_cfd"));

  // Inward normals are flipped back, with a warning naming the file.
  SurfaceData d = read_vtp(run + "/boundary_0.vtp", {"pMeanTrim", "wallShearStressMeanTrim"});
  flip_orientation(d.mesh);
  write_vtp(run + "/boundary_0.vtp", d.mesh,
            {{"pMeanTrim", d.cell_fields["pMeanTrim"]},
             {"wallShearStressMeanTrim", d.cell_fields["wallShearStressMeanTrim"]}});
  warnings.clear();
  const Sample flipped = read_raw_surface_run(run, surface_fields(), {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("boundary_0.vtp"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("inward"), std::string::npos) << warnings[0];
  EXPECT_TRUE(torch::allclose(flipped.point("normals"), s.point("normals"), 1e-5, 1e-5));

  // An open surface is reported; a missing field and a bad CSV are errors
  // naming the file.
  const int64_t keep = d.mesh.num_cells() - 40;
  SurfaceMesh open = d.mesh;
  open.offsets = d.mesh.offsets.narrow(0, 0, keep + 1).clone();
  write_vtp(
      run + "/boundary_0.vtp", open,
      {{"pMeanTrim", d.cell_fields["pMeanTrim"].narrow(0, 0, keep)},
       {"wallShearStressMeanTrim", d.cell_fields["wallShearStressMeanTrim"].narrow(0, 0, keep)}});
  warnings.clear();
  read_raw_surface_run(run, surface_fields(), {}, &warnings);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.back().find("not closed"), std::string::npos) << warnings.back();
  const auto missing = error_message_of([&] {
    read_raw_surface_run(run, surface_fields(), {{"wss", "tauWall"}});
  });
  EXPECT_NE(missing.find("boundary_0.vtp"), std::string::npos) << missing;
  EXPECT_NE(missing.find("tauWall"), std::string::npos) << missing;
  std::ofstream(run + "/geo_ref_0.csv") << "lRef,aRef\n5.0,abc\n";
  const auto bad = error_message_of([&] { read_raw_surface_run(run, surface_fields(), {}); });
  EXPECT_NE(bad.find("geo_ref_0.csv"), std::string::npos) << bad;
  EXPECT_NE(bad.find("aRef"), std::string::npos) << bad;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(SurfacePipelineTest, MakeSyntheticPrepareTrainInferASplitThenReadItBack) {
  testing::TempDir dir;
  const std::string bin = std::getenv("SLIPSTREAM_BIN");
  const std::string d = dir.path(), log = " >> " + d + "/log 2>&1";
  const std::string tiny =
      " device=cpu model.n_layers=1 model.n_hidden=32 model.n_head=2 model.slice_num=8";
  ASSERT_EQ(sh(bin + " make-synthetic --format vtk --out " + d +
               "/raw dataset=synthetic_surface dataset.num_train=4 dataset.num_val=2 "
               "dataset.points_per_sample=1200" +
               log),
            0)
      << d;
  // Surface runs prepared as volumes: the error says which dataset to pick.
  EXPECT_NE(
      sh(bin + " prepare --in " + d + "/raw --out " + d + "/as_volume > " + d + "/vol_err 2>&1"),
      0);
  {
    std::ifstream in(d + "/vol_err");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find("a surface: for a surface run add dataset=prepared_surface"),
              std::string::npos)
        << text;
  }
  ASSERT_EQ(sh(bin + " prepare --in " + d + "/raw --out " + d +
               "/prepared --val-fraction 0.34 dataset=prepared_surface" + log),
            0)
      << d;
  ASSERT_EQ(sh(bin + " train model=transolver_surface dataset=prepared_surface dataset.path=" + d +
               "/prepared dataset.sampling_resolution=512 training.num_epochs=1 run_id=r " +
               "output_dir=" + d + "/runs" + tiny + log),
            0)
      << d;
  // No test split in this manifest: the error lists the ones it has.
  EXPECT_NE(sh(bin + " infer --checkpoint " + d + "/runs/r/checkpoints --split test --out " + d +
               "/none --device cpu > " + d + "/err 2>&1"),
            0);
  std::ifstream err_in(d + "/err");
  const std::string err((std::istreambuf_iterator<char>(err_in)), {});
  EXPECT_NE(err.find("train, val"), std::string::npos) << err;
  ASSERT_EQ(sh(bin + " infer --checkpoint " + d + "/runs/r --split val --out " + d +
               "/infer --device cpu" + log),
            0)
      << d;

  // Every val sample as a .vtp with the polygons and pred / true / error.
  const auto records = read_jsonl(d + "/infer/metrics.jsonl");
  std::vector<nlohmann::json> steps;
  nlohmann::json summary, forces;
  for (const auto& r : records) {
    if (r["phase"] == "infer_step") steps.push_back(r);
    if (r["phase"] == "infer_summary") summary = r;
    if (r["phase"] == "infer_forces_summary") forces = r;
  }
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& step : steps) {
    const std::string file = step["file"];
    ASSERT_EQ(fs::path(file).extension(), ".vtp");
    const auto sd = read_vtp(file, {"pressure_pred", "pressure_true", "pressure_error", "wss_pred",
                                    "wss_true", "wss_error"});
    EXPECT_EQ(sd.mesh.num_cells(), step["points"].get<int64_t>());
    EXPECT_EQ(sd.cell_fields.at("wss_pred").size(1), 3);
    EXPECT_TRUE(torch::allclose(
        sd.cell_fields.at("pressure_error"),
        sd.cell_fields.at("pressure_pred") - sd.cell_fields.at("pressure_true"), 1e-5, 1e-6));
    EXPECT_EQ(step["chunks"], 1);  // the whole surface in one pass
    EXPECT_TRUE(step["metrics"].contains("wss_l2"));
    for (const char* which : {"pred", "true", "cfd"}) {
      EXPECT_TRUE(step["forces"][which].contains("CD")) << which << step.dump();
    }
    // The true fields' integral is the CFD's own coefficient (here exact).
    EXPECT_NEAR(step["forces"]["true"]["CD"].get<double>(),
                step["forces"]["cfd"]["CD"].get<double>(), 1e-3);
  }
  ASSERT_TRUE(summary.is_object());
  EXPECT_EQ(summary["samples"], 2);
  ASSERT_TRUE(forces.is_object());
  for (const char* c : {"CD", "CL", "CS", "CMR", "CMP", "CMY"}) {
    ASSERT_TRUE(forces["coefficients"].contains(c)) << c;
    for (const char* k : {"pred_mean", "true_mean", "mae", "r2"}) {
      EXPECT_TRUE(forces["coefficients"][c].contains(k)) << c << " " << k;
    }
  }
  EXPECT_TRUE(forces["integrated_vs_cfd"].contains("CD"));
  std::ifstream svg_in(d + "/infer/forces.svg");
  const std::string svg((std::istreambuf_iterator<char>(svg_in)), {});
  size_t points = 0;
  for (size_t at = svg.find("class=\"point\""); at != std::string::npos;
       at = svg.find("class=\"point\"", at + 1)) {
    ++points;
  }
  EXPECT_EQ(points, 4u);  // CD and CL of two samples
  EXPECT_NE(svg.find("class=\"identity\""), std::string::npos);
  EXPECT_NE(svg.find("R\u00b2"), std::string::npos);
}

}  // namespace
}  // namespace slipstream::aero
