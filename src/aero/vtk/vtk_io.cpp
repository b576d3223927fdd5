#include "aero/vtk/vtk_io.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <vtkCellArray.h>
#include <vtkCellData.h>
#include <vtkCellDataToPointData.h>
#include <vtkDataArray.h>
#include <vtkFloatArray.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkSTLReader.h>
#include <vtkSTLWriter.h>
#include <vtkSmartPointer.h>
#include <vtkUnstructuredGrid.h>
#include <vtkXMLUnstructuredGridReader.h>
#include <vtkXMLUnstructuredGridWriter.h>

#include <filesystem>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

torch::Tensor to_tensor(vtkDataArray* a, const std::string& where) {
  const int64_t n = a->GetNumberOfTuples();
  const int c = a->GetNumberOfComponents();
  auto t = torch::empty({n, c}, torch::kFloat);
  float* out = t.data_ptr<float>();
  std::vector<double> tuple(c);
  for (int64_t i = 0; i < n; ++i) {
    a->GetTuple(i, tuple.data());
    for (int k = 0; k < c; ++k) out[i * c + k] = static_cast<float>(tuple[k]);
  }
  TORCH_CHECK(n > 0, where, " is empty");
  return t;
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    TORCH_CHECK(false, "vtk: cannot rename '", tmp, "' to '", path, "'");
  }
}

}  // namespace

VolumeMesh read_vtu(const std::string& path, const std::vector<std::string>& field_names) {
  TORCH_CHECK(fs::is_regular_file(path), "vtk: '", path, "' does not exist");
  TORCH_CHECK(fs::file_size(path) > 0, "vtk: '", path, "' is empty");
  vtkNew<vtkXMLUnstructuredGridReader> reader;
  reader->SetFileName(path.c_str());
  reader->Update();
  vtkUnstructuredGrid* grid = reader->GetOutput();
  TORCH_CHECK(reader->GetErrorCode() == 0 && grid != nullptr && grid->GetNumberOfPoints() > 0,
              "vtk: '", path, "' could not be read as a .vtu volume (truncated or not VTK XML?)");
  VolumeMesh out;
  out.points = to_tensor(grid->GetPoints()->GetData(), "vtk: '" + path + "' points");
  vtkSmartPointer<vtkUnstructuredGrid> moved;
  for (const auto& name : field_names) {
    vtkDataArray* a = grid->GetPointData()->GetArray(name.c_str());
    if (a == nullptr && grid->GetCellData()->GetArray(name.c_str()) != nullptr) {
      if (!moved) {
        vtkNew<vtkCellDataToPointData> c2p;
        c2p->SetInputData(grid);
        c2p->PassCellDataOff();
        c2p->Update();
        moved = vtkUnstructuredGrid::SafeDownCast(c2p->GetOutput());
      }
      a = moved->GetPointData()->GetArray(name.c_str());
    }
    if (a == nullptr) {
      std::string have;
      for (int i = 0; i < grid->GetPointData()->GetNumberOfArrays(); ++i) {
        have += std::string(have.empty() ? "" : ", ") + grid->GetPointData()->GetArrayName(i);
      }
      for (int i = 0; i < grid->GetCellData()->GetNumberOfArrays(); ++i) {
        have += std::string(have.empty() ? "" : ", ") + grid->GetCellData()->GetArrayName(i) +
                " (cell)";
      }
      TORCH_CHECK(false, "vtk: '", path, "' has no field '", name, "' (it has: ", have, ")");
    }
    auto t = to_tensor(a, "vtk: '" + path + "' field '" + name + "'");
    TORCH_CHECK(t.size(0) == out.points.size(0), "vtk: '", path, "' field '", name, "' has ",
                t.size(0), " values for ", out.points.size(0), " points");
    out.fields[name] = t;
  }
  return out;
}

void write_vtu(const std::string& path, const torch::Tensor& points_in,
               const std::vector<std::pair<std::string, torch::Tensor>>& fields) {
  const auto points = points_in.to(torch::kFloat).contiguous();
  const int64_t n = points.size(0);
  vtkNew<vtkUnstructuredGrid> grid;
  vtkNew<vtkPoints> pts;
  pts->SetDataTypeToFloat();
  pts->SetNumberOfPoints(n);
  const float* pp = points.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) pts->SetPoint(i, pp[3 * i], pp[3 * i + 1], pp[3 * i + 2]);
  grid->SetPoints(pts);
  vtkNew<vtkCellArray> cells;
  for (vtkIdType i = 0; i < n; ++i) cells->InsertNextCell(1, &i);
  grid->SetCells(VTK_VERTEX, cells);
  for (const auto& [name, t_in] : fields) {
    auto t = t_in.to(torch::kFloat).reshape({n, -1}).contiguous();
    vtkNew<vtkFloatArray> a;
    a->SetName(name.c_str());
    a->SetNumberOfComponents(static_cast<int>(t.size(1)));
    a->SetNumberOfTuples(n);
    std::memcpy(a->GetPointer(0), t.data_ptr<float>(), sizeof(float) * t.numel());
    grid->GetPointData()->AddArray(a);
  }
  const std::string tmp = path + ".tmp.vtu";
  vtkNew<vtkXMLUnstructuredGridWriter> writer;
  writer->SetFileName(tmp.c_str());
  writer->SetInputData(grid);
  writer->SetDataModeToAppended();
  writer->EncodeAppendedDataOff();
  TORCH_CHECK(writer->Write() == 1, "vtk: writing '", tmp, "' failed");
  rename_into_place(tmp, path);
}

TriangleMesh read_stl(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "stl: '", path, "' does not exist");
  TORCH_CHECK(fs::file_size(path) > 0, "stl: '", path, "' is empty");
  vtkNew<vtkSTLReader> reader;
  reader->SetFileName(path.c_str());
  reader->MergingOn();
  reader->Update();
  vtkPolyData* poly = reader->GetOutput();
  TORCH_CHECK(reader->GetErrorCode() == 0 && poly != nullptr && poly->GetNumberOfPolys() > 0,
              "stl: '", path, "' has no triangles (empty, truncated or not STL?)");
  TriangleMesh mesh;
  mesh.name = path;
  for (vtkIdType i = 0; i < poly->GetNumberOfPoints(); ++i) {
    double p[3];
    poly->GetPoint(i, p);
    mesh.vertices.push_back({p[0], p[1], p[2]});
  }
  vtkCellArray* polys = poly->GetPolys();
  polys->InitTraversal();
  vtkNew<vtkIdList> ids;
  while (polys->GetNextCell(ids)) {
    TORCH_CHECK(ids->GetNumberOfIds() == 3, "stl: '", path, "' has a non-triangle face");
    mesh.faces.push_back({ids->GetId(0), ids->GetId(1), ids->GetId(2)});
  }
  return mesh;
}

void write_stl(const std::string& path, const TriangleMesh& mesh) {
  vtkNew<vtkPolyData> poly;
  vtkNew<vtkPoints> pts;
  for (const auto& v : mesh.vertices) pts->InsertNextPoint(v[0], v[1], v[2]);
  vtkNew<vtkCellArray> tris;
  for (const auto& f : mesh.faces) {
    vtkIdType ids[3] = {f[0], f[1], f[2]};
    tris->InsertNextCell(3, ids);
  }
  poly->SetPoints(pts);
  poly->SetPolys(tris);
  const std::string tmp = path + ".tmp.stl";
  vtkNew<vtkSTLWriter> writer;
  writer->SetFileName(tmp.c_str());
  writer->SetInputData(poly);
  writer->SetFileTypeToBinary();
  TORCH_CHECK(writer->Write() == 1, "stl: writing '", tmp, "' failed");
  rename_into_place(tmp, path);
}

}  // namespace slipstream::aero
