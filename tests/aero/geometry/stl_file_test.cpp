// STL files without VTK: binary written and read back (corners as float32,
// shared corners merged), ASCII read, degenerate triangles dropped, the
// Ahmed fixture's body closed, and damaged files refused naming the file.
// (tests/aero/vtk/vtk_pipeline_test.cpp checks the reader against VTK's.)
#include "aero/geometry/stl_file.h"
#include "aero/geometry/triangle_mesh.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace slipstream::aero {
namespace {

using testing::error_message_of;

TEST(StlFileTest, ABinaryRoundTripKeepsTheTrianglesAndMergesSharedCorners) {
  testing::TempDir dir;
  const auto sphere = make_icosphere(0.7, {0.1, -0.2, 0.3}, 3);
  write_stl(dir.file("s.stl"), sphere);
  EXPECT_EQ(std::filesystem::file_size(dir.file("s.stl")), 84 + 50 * sphere.faces.size());
  const auto back = read_stl(dir.file("s.stl"));
  EXPECT_EQ(back.name, dir.file("s.stl"));
  ASSERT_EQ(back.faces.size(), sphere.faces.size());
  // Each corner shared by several triangles is one vertex again, so the
  // mesh is closed, and every corner is the original rounded to float32.
  ASSERT_EQ(back.vertices.size(), sphere.vertices.size());
  check_watertight(back);
  for (size_t f = 0; f < sphere.faces.size(); ++f) {
    for (size_t k = 0; k < 3; ++k) {
      const auto& a = sphere.vertices[static_cast<size_t>(sphere.faces[f][k])];
      const auto& b = back.vertices[static_cast<size_t>(back.faces[f][k])];
      for (size_t d = 0; d < 3; ++d) ASSERT_EQ(b[d], static_cast<double>(static_cast<float>(a[d])));
    }
  }
}

TEST(StlFileTest, AsciiIsReadAndADegenerateTriangleIsDropped) {
  testing::TempDir dir;
  std::ofstream(dir.file("t.stl")) << "solid two\n"
                                      " facet normal 0 0 1\n  outer loop\n"
                                      "   vertex 0 0 0\n   vertex 1 0 0\n   vertex 0 1 0\n"
                                      "  endloop\n endfacet\n"
                                      " facet normal 0 0 1\n  outer loop\n"
                                      "   vertex 1 0 0\n   vertex 1 1 0\n   vertex 0 1.0 0\n"
                                      "  endloop\n endfacet\n"
                                      " facet normal 0 0 0\n  outer loop\n"
                                      "   vertex 1 0 0\n   vertex 1e0 0 -0\n   vertex 1 1 0\n"
                                      "  endloop\n endfacet\n"
                                      "endsolid two\n";
  const auto m = read_stl(dir.file("t.stl"));
  ASSERT_EQ(m.vertices.size(), 4u);  // (0,1,0) written twice, (1,0,-0) is (1,0,0)
  ASSERT_EQ(m.faces.size(), 2u);     // the third has two equal corners
  EXPECT_EQ(m.faces[0], (std::array<int64_t, 3>{0, 1, 2}));
  EXPECT_EQ(m.faces[1], (std::array<int64_t, 3>{1, 3, 2}));
}

TEST(StlFileTest, TheAhmedBodyIsClosedAndDamagedFilesNameTheFile) {
  const std::string body = testing::fixtures_dir() + "/ahmed/run_16/drivaer_16.stl";
  const auto m = read_stl(body);
  EXPECT_GT(m.faces.size(), 1000u);
  check_watertight(m);

  testing::TempDir dir;
  std::ofstream(dir.file("empty.stl")).close();
  const auto empty = error_message_of([&] { read_stl(dir.file("empty.stl")); });
  EXPECT_NE(empty.find("empty.stl"), std::string::npos) << empty;
  std::filesystem::copy_file(body, dir.file("cut.stl"));
  std::filesystem::resize_file(dir.file("cut.stl"), std::filesystem::file_size(body) - 7);
  const auto cut = error_message_of([&] { read_stl(dir.file("cut.stl")); });
  EXPECT_NE(cut.find("cut.stl"), std::string::npos) << cut;
  EXPECT_NE(cut.find("truncated"), std::string::npos) << cut;
  std::ofstream(dir.file("open.stl")) << "solid x\n facet normal 0 0 1\n  outer loop\n"
                                         "   vertex 0 0 0\n   vertex 1 0 0\n";
  const auto open = error_message_of([&] { read_stl(dir.file("open.stl")); });
  EXPECT_NE(open.find("open.stl"), std::string::npos) << open;
  EXPECT_FALSE(std::filesystem::exists(dir.file("missing.stl")));
  const auto missing = error_message_of([&] { read_stl(dir.file("missing.stl")); });
  EXPECT_NE(missing.find("missing.stl"), std::string::npos) << missing;
}

}  // namespace
}  // namespace slipstream::aero
