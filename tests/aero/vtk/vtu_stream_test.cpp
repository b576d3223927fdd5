// Volumes streamed a block at a time: every layout VTK's own writer makes
// of appended raw data (no compression, zlib, LZ4, LZMA; 32- and 64-bit
// headers; float32 and float64 arrays) reads, block by block, exactly what
// VTK's reader reads whole; the layouts it cannot stream say why; and a run
// prepared by streaming is the file the whole read writes, byte for byte,
// in one .vtu or in pieces, with --limit-points too.
#include "aero/vtk/vtu_stream.h"
#include "aero/data/sample_file.h"
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#include "support/files.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <vtkCellData.h>
#include <vtkCellType.h>
#include <vtkDoubleArray.h>
#include <vtkFloatArray.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPoints.h>
#include <vtkUnstructuredGrid.h>
#include <vtkXMLUnstructuredGridWriter.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace slipstream::aero {
namespace {

namespace fs = std::filesystem;
using testing::error_message_of;

constexpr int64_t kPoints = 1000;

// A grid of kPoints vertices with a float32 scalar "p" and a float64 vector "U".
vtkNew<vtkUnstructuredGrid> grid(bool double_points) {
  vtkNew<vtkUnstructuredGrid> g;
  vtkNew<vtkPoints> pts;
  if (double_points) pts->SetDataTypeToDouble();
  pts->SetNumberOfPoints(kPoints);
  vtkNew<vtkFloatArray> p;
  p->SetName("p");
  p->SetNumberOfTuples(kPoints);
  vtkNew<vtkDoubleArray> u;
  u->SetName("U");
  u->SetNumberOfComponents(3);
  u->SetNumberOfTuples(kPoints);
  for (vtkIdType i = 0; i < kPoints; ++i) {
    pts->SetPoint(i, 0.001 * i, std::sin(0.01 * i), -0.5 * i);
    p->SetValue(i, static_cast<float>(i) / 7.f);
    u->SetTuple3(i, 1.0 / (i + 1), 2.0 * i, -1e-3 * i);
  }
  g->SetPoints(pts);
  g->Allocate(kPoints);
  for (vtkIdType i = 0; i < kPoints; ++i) g->InsertNextCell(VTK_VERTEX, 1, &i);
  g->GetPointData()->AddArray(p);
  g->GetPointData()->AddArray(u);
  return g;
}

struct Layout {
  const char* compressor;  // none, zlib, lz4, lzma
  bool header64, double_points;
};

std::string write(const std::string& path, const Layout& l) {
  vtkNew<vtkXMLUnstructuredGridWriter> w;
  w->SetFileName(path.c_str());
  auto g = grid(l.double_points);
  w->SetInputData(g);
  w->SetDataModeToAppended();
  w->EncodeAppendedDataOff();
  const std::string c = l.compressor;
  if (c == "none") w->SetCompressorTypeToNone();
  if (c == "zlib") w->SetCompressorTypeToZLib();
  if (c == "lz4") w->SetCompressorTypeToLZ4();
  if (c == "lzma") w->SetCompressorTypeToLZMA();
  w->SetBlockSize(512);  // many compressed blocks, cut mid-row
  if (l.header64)
    w->SetHeaderTypeToUInt64();
  else
    w->SetHeaderTypeToUInt32();
  EXPECT_EQ(w->Write(), 1);
  return path;
}

TEST(VtuStreamTest, EveryAppendedRawLayoutStreamsWhatVtkReadsWhole) {
  testing::TempDir dir;
  for (const Layout& l :
       {Layout{"none", false, false}, Layout{"none", true, true}, Layout{"zlib", false, false},
        Layout{"zlib", true, true}, Layout{"lz4", true, false}, Layout{"lzma", false, true}}) {
    const std::string who = std::string(l.compressor) + (l.header64 ? ", UInt64" : ", UInt32") +
                            (l.double_points ? ", float64 points" : ", float32 points");
    const auto path = write(dir.file("g.vtu"), l);
    const VolumeMesh whole = read_vtu(path, {"p", "U"});
    const VtuStream stream({path});
    ASSERT_TRUE(stream.supported()) << who << ": " << stream.why_unsupported();
    EXPECT_EQ(stream.points(), kPoints) << who;
    EXPECT_EQ(stream.components("U"), 3) << who;
    for (const auto& [name, want] :
         {std::pair{"points", whole.points}, std::pair{"p", whole.fields.at("p")},
          std::pair{"U", whole.fields.at("U")}}) {
      auto cursor = stream.cursor(name);
      std::vector<torch::Tensor> parts;
      for (int64_t n : {1, 333, 600, 66}) parts.push_back(cursor->next(n));
      EXPECT_TRUE(torch::equal(torch::cat(parts), want.reshape({kPoints, -1})))
          << who << " " << name;
      EXPECT_THROW(cursor->next(1), c10::Error) << who << ": past the last row";
    }
  }
}

TEST(VtuStreamTest, LayoutsThatCannotStreamSayWhy) {
  testing::TempDir dir;
  const auto why = [&](const std::function<void(vtkXMLUnstructuredGridWriter*)>& set) {
    vtkNew<vtkXMLUnstructuredGridWriter> w;
    w->SetFileName(dir.file("g.vtu").c_str());
    auto g = grid(false);
    w->SetInputData(g);
    set(w);
    w->Write();
    return VtuStream({dir.file("g.vtu")}).why_unsupported();
  };
  EXPECT_NE(why([](auto* w) { w->SetDataModeToAscii(); }).find("not in a raw appended section"),
            std::string::npos);
  EXPECT_NE(why([](auto* w) {
              w->SetDataModeToAppended();
              w->EncodeAppendedDataOn();
            }).find("base64"),
            std::string::npos);
  EXPECT_NE(why([](auto* w) { w->SetDataModeToBinary(); }).find("not in a raw appended section"),
            std::string::npos);
}

// The file prepare writes by streaming is the file of the whole read.
TEST(VtuStreamTest, AStreamedRunIsTheWholeReadsFileInOneVtuOrInPieces) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 3000;
  write_synthetic_vtk_runs(dir.path(), o, 1);
  const std::string run = dir.file("run_0000");
  const FieldSchema targets = default_volume_fields();
  for (const int64_t limit : {int64_t{0}, int64_t{700}}) {
    write_sample_file(dir.file("whole.safetensors"), read_raw_run(run, targets, {}, limit),
                      {true, 42});
    std::string why;
    SampleWriteOptions so;
    so.row_seed = 42;
    // Blocks of 512 source rows: every block boundary and the limit's subset crossed.
    ASSERT_EQ(
        stream_raw_run(run, dir.file("streamed.safetensors"), targets, {}, limit, &why, 512, so),
        limit > 0 ? limit : 3000)
        << why;
    EXPECT_EQ(testing::file_bytes(dir.file("streamed.safetensors")),
              testing::file_bytes(dir.file("whole.safetensors")))
        << "limit " << limit;
  }
  // In pieces, as DrivAerML ships big volumes.
  testing::split_into_parts(run + "/volume.vtu", 3);
  fs::remove(run + "/volume.vtu");
  std::string why;
  SampleWriteOptions so;
  so.row_seed = 42;
  ASSERT_EQ(stream_raw_run(run, dir.file("pieces.safetensors"), targets, {}, 700, &why, 512, so),
            700)
      << why;
  EXPECT_EQ(testing::file_bytes(dir.file("pieces.safetensors")),
            testing::file_bytes(dir.file("whole.safetensors")));
}

// A target stored as cell data is moved to the points by VTK's reader:
// that run is read whole, with prepare's warning.
TEST(VtuStreamTest, ACellDataTargetIsReadWholeWithAWarning) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 200;
  write_synthetic_vtk_runs(dir.path(), o, 1);
  const std::string run = dir.file("run_0000");
  const VolumeMesh v = read_vtu(run + "/volume.vtu", {"UMeanTrim", "pMeanTrim", "nutMeanTrim"});
  // The same volume with the pressure as cell data (one vertex cell a point).
  vtkNew<vtkUnstructuredGrid> g;
  vtkNew<vtkPoints> pts;
  pts->SetNumberOfPoints(v.points.size(0));
  for (int64_t i = 0; i < v.points.size(0); ++i) {
    pts->SetPoint(i, v.points[i][0].item<float>(), v.points[i][1].item<float>(),
                  v.points[i][2].item<float>());
  }
  g->SetPoints(pts);
  g->Allocate(v.points.size(0));
  for (vtkIdType i = 0; i < v.points.size(0); ++i) g->InsertNextCell(VTK_VERTEX, 1, &i);
  for (const auto& [name, t] : v.fields) {
    vtkNew<vtkFloatArray> a;
    a->SetName(name.c_str());
    a->SetNumberOfComponents(static_cast<int>(t.size(1)));
    a->SetNumberOfTuples(t.size(0));
    std::memcpy(a->GetPointer(0), t.contiguous().data_ptr<float>(), t.numel() * sizeof(float));
    if (name == "pMeanTrim")
      g->GetCellData()->AddArray(a);
    else
      g->GetPointData()->AddArray(a);
  }
  vtkNew<vtkXMLUnstructuredGridWriter> w;
  w->SetFileName((run + "/volume.vtu").c_str());
  w->SetInputData(g);
  w->SetDataModeToAppended();
  w->EncodeAppendedDataOff();
  ASSERT_EQ(w->Write(), 1);
  std::string why;
  EXPECT_EQ(stream_raw_run(run, dir.file("a.safetensors"), default_volume_fields(), {}, 0, &why),
            -1);
  EXPECT_NE(why.find("'pMeanTrim' is cell data"), std::string::npos) << why;
  PrepareOptions po;
  po.val_fraction = 0;
  const auto report = prepare_runs(dir.path(), dir.file("prepared"), po);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("is read whole"), std::string::npos) << report.warnings[0];
  EXPECT_EQ(report.points, 200);
}

}  // namespace
}  // namespace slipstream::aero
