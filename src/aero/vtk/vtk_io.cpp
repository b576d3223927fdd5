#include "aero/vtk/vtk_io.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <vtkCallbackCommand.h>
#include <vtkCellArray.h>
#include <vtkCellData.h>
#include <vtkCellDataToPointData.h>
#include <vtkCommand.h>
#include <vtkDataArray.h>
#include <vtkErrorCode.h>
#include <vtkFloatArray.h>
#include <vtkIdTypeArray.h>
#include <vtkNew.h>
#include <vtkObjectFactory.h>
#include <vtkPointData.h>
#include <vtkPointDataToCellData.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkSmartPointer.h>
#include <vtkUnstructuredGrid.h>
#include <vtkXMLPolyDataReader.h>
#include <vtkXMLPolyDataWriter.h>
#include <vtkXMLReader.h>
#include <vtkXMLUnstructuredGridReader.h>

#include "core/io/concatenated_files.h"
#include "core/io/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace slipstream::aero {

namespace fs = std::filesystem;

torch::Tensor tensor_of(vtkDataArray* a, const std::string& where) {
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

namespace {

std::string array_names(vtkDataSet* data) {
  std::string have;
  for (int i = 0; i < data->GetPointData()->GetNumberOfArrays(); ++i) {
    have += std::string(have.empty() ? "" : ", ") + data->GetPointData()->GetArrayName(i);
  }
  for (int i = 0; i < data->GetCellData()->GetNumberOfArrays(); ++i) {
    have +=
        std::string(have.empty() ? "" : ", ") + data->GetCellData()->GetArrayName(i) + " (cell)";
  }
  return have.empty() ? "no fields" : have;
}

vtkNew<vtkFloatArray> to_array(const std::string& name, const torch::Tensor& t_in, int64_t rows) {
  auto t = t_in.to(torch::kFloat).reshape({rows, -1}).contiguous();
  vtkNew<vtkFloatArray> a;
  a->SetName(name.c_str());
  a->SetNumberOfComponents(static_cast<int>(t.size(1)));
  a->SetNumberOfTuples(rows);
  std::memcpy(a->GetPointer(0), t.data_ptr<float>(), sizeof(float) * t.numel());
  return a;
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    TORCH_CHECK(false, "vtk: cannot rename '", tmp, "' to '", path, "'");
  }
}

// Runs `writer` into `tmp`, then renames it over `path`. VTK reports a
// failed write (a full disk) through GetErrorCode() while Write() can still
// return 1, so both are checked; the bytes are flushed to the disk before
// the rename, and a failed temp file is removed.
template <typename Writer>
void write_into_place(Writer* writer, const std::string& tmp, const std::string& path,
                      const char* what) {
  const int ok = writer->Write();
  const unsigned long code = writer->GetErrorCode();
  bool synced = false;
  if (ok == 1 && code == 0) {
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    synced = fd >= 0 && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
  }
  if (!synced) {
    std::error_code ec;
    fs::remove(tmp, ec);
    TORCH_CHECK(false, what, ": writing '", path, "' failed: ",
                code == vtkErrorCode::OutOfDiskSpaceError ? "No space left on device"
                : code != 0 ? vtkErrorCode::GetStringFromErrorCode(code)
                            : "the writer reported an error",
                "; nothing was written under that name");
  }
  rename_into_place(tmp, path);
}

}  // namespace

namespace {
VolumeMesh volume_of(vtkXMLUnstructuredGridReader* reader, const std::string& path,
                     const std::vector<std::string>& field_names) {
  vtkUnstructuredGrid* grid = reader->GetOutput();
  TORCH_CHECK(reader->GetErrorCode() == 0 && grid != nullptr && grid->GetNumberOfPoints() > 0,
              "vtk: '", path, "' could not be read as a .vtu volume (truncated or not VTK XML?)");
  VolumeMesh out;
  out.points = tensor_of(grid->GetPoints()->GetData(), "vtk: '" + path + "' points");
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
    TORCH_CHECK(a != nullptr, "vtk: '", path, "' has no field '", name,
                "' (it has: ", array_names(grid), ")");
    auto t = tensor_of(a, "vtk: '" + path + "' field '" + name + "'");
    TORCH_CHECK(t.size(0) == out.points.size(0), "vtk: '", path, "' field '", name, "' has ",
                t.size(0), " values for ", out.points.size(0), " points");
    out.fields[name] = t;
  }
  return out;
}

// Draws a ProgressBar from a VTK algorithm's progress events while it runs
// (the reads of a 50 GB volume take minutes).
class ReadProgress {
 public:
  ReadProgress(vtkAlgorithm* algorithm, const std::string& what) : bar_("reading " + what) {
    callback_->SetClientData(&bar_);
    callback_->SetCallback([](vtkObject* caller, unsigned long, void* bar, void*) {
      static_cast<ProgressBar*>(bar)->update(static_cast<vtkAlgorithm*>(caller)->GetProgress());
    });
    algorithm->AddObserver(vtkCommand::ProgressEvent, callback_);
  }

 private:
  ProgressBar bar_;
  vtkNew<vtkCallbackCommand> callback_;
};

// VTK's .vtu reader on a stream of ours: the reader opens its "file" once
// for the header and again for the data, so each open hands it the stream
// (rewound) and each close only lets go of it.
class StreamUnstructuredGridReader : public vtkXMLUnstructuredGridReader {
 public:
  static StreamUnstructuredGridReader* New();
  vtkTypeMacro(StreamUnstructuredGridReader, vtkXMLUnstructuredGridReader);
  void UseStream(std::istream* stream) { stream_ = stream; }

 protected:
  int OpenVTKFile() override {
    if (stream_ == nullptr) return vtkXMLUnstructuredGridReader::OpenVTKFile();
    stream_->clear();
    stream_->seekg(0);
    this->Stream = stream_;
    return 1;
  }
  void CloseVTKFile() override {
    if (stream_ == nullptr) return vtkXMLUnstructuredGridReader::CloseVTKFile();
    this->Stream = nullptr;
  }

 private:
  std::istream* stream_ = nullptr;
};
vtkStandardNewMacro(StreamUnstructuredGridReader);
}  // namespace

VolumeMesh read_vtu(const std::vector<std::string>& pieces,
                    const std::vector<std::string>& field_names) {
  TORCH_CHECK(!pieces.empty(), "vtk: no .vtu pieces given");
  if (pieces.size() == 1) return read_vtu(pieces.front(), field_names);
  for (const auto& p : pieces) {
    TORCH_CHECK(fs::is_regular_file(p), "vtk: '", p, "' does not exist");
  }
  const std::string what = pieces.front() + " (+" + std::to_string(pieces.size() - 1) + " pieces)";
  ConcatenatedFilesStream stream(pieces);
  vtkNew<StreamUnstructuredGridReader> reader;
  reader->SetFileName(pieces.front().c_str());  // named in VTK's own messages
  reader->UseStream(&stream);
  {
    ReadProgress progress(reader, what);
    reader->Update();
  }
  return volume_of(reader, what, field_names);
}

namespace {

// Reads the non-empty file `path` with an XML reader, its progress shown.
void read_xml(vtkXMLReader* reader, const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "vtk: '", path, "' does not exist");
  TORCH_CHECK(fs::file_size(path) > 0, "vtk: '", path, "' is empty");
  reader->SetFileName(path.c_str());
  ReadProgress progress(reader, path);
  reader->Update();
}

}  // namespace

VolumeMesh read_vtu(const std::string& path, const std::vector<std::string>& field_names) {
  vtkNew<vtkXMLUnstructuredGridReader> reader;
  read_xml(reader, path);
  return volume_of(reader, path, field_names);
}

SurfaceData read_vtp(const std::string& path, const std::vector<std::string>& field_names) {
  vtkNew<vtkXMLPolyDataReader> reader;
  read_xml(reader, path);
  vtkPolyData* poly = reader->GetOutput();
  TORCH_CHECK(reader->GetErrorCode() == 0 && poly != nullptr && poly->GetNumberOfPolys() > 0,
              "vtk: '", path,
              "' could not be read as a .vtp surface with polygons (truncated or not VTK XML?)");
  return surface_of(poly, path, field_names);
}

SurfaceData surface_of(vtkPolyData* poly, const std::string& what,
                       const std::vector<std::string>& field_names) {
  TORCH_CHECK(poly != nullptr && poly->GetNumberOfPolys() > 0, "vtk: '", what,
              "' holds no polygons");
  TORCH_CHECK(poly->GetNumberOfStrips() == 0, "vtk: '", what,
              "' holds triangle strips; convert them to polygons (vtkTriangleFilter)");
  SurfaceData out;
  out.mesh.name = what;
  const vtkIdType nv = poly->GetNumberOfPoints();
  out.mesh.vertices = torch::empty({nv, 3}, torch::kDouble);
  auto* v = out.mesh.vertices.data_ptr<double>();
  for (vtkIdType i = 0; i < nv; ++i) poly->GetPoint(i, v + 3 * i);
  vtkCellArray* polys = poly->GetPolys();
  const vtkIdType nc = polys->GetNumberOfCells();
  out.mesh.offsets = torch::empty({nc + 1}, torch::kLong);
  out.mesh.connectivity = torch::empty({polys->GetNumberOfConnectivityIds()}, torch::kLong);
  auto* off = out.mesh.offsets.data_ptr<int64_t>();
  auto* conn = out.mesh.connectivity.data_ptr<int64_t>();
  for (vtkIdType c = 0; c <= nc; ++c) off[c] = polys->GetOffsetsArray()->GetComponent(c, 0);
  for (vtkIdType k = 0; k < polys->GetNumberOfConnectivityIds(); ++k) {
    conn[k] = static_cast<int64_t>(polys->GetConnectivityArray()->GetComponent(k, 0));
  }
  // Cell data of a vtkPolyData runs over verts, lines, polys, strips in that
  // order; a surface of polygons only has polys.
  const vtkIdType skipped = poly->GetNumberOfVerts() + poly->GetNumberOfLines();
  vtkSmartPointer<vtkPolyData> moved;
  for (const auto& name : field_names) {
    vtkDataArray* a = poly->GetCellData()->GetArray(name.c_str());
    if (a == nullptr && poly->GetPointData()->GetArray(name.c_str()) != nullptr) {
      if (!moved) {
        vtkNew<vtkPointDataToCellData> p2c;
        p2c->SetInputData(poly);
        p2c->Update();
        moved = vtkPolyData::SafeDownCast(p2c->GetOutput());
      }
      a = moved->GetCellData()->GetArray(name.c_str());
    }
    TORCH_CHECK(a != nullptr, "vtk: '", what, "' has no field '", name,
                "' (it has: ", array_names(poly), ")");
    auto t = tensor_of(a, "vtk: '" + what + "' field '" + name + "'");
    TORCH_CHECK(t.size(0) == skipped + nc, "vtk: '", what, "' field '", name, "' has ", t.size(0),
                " values for ", nc, " polygons");
    out.cell_fields[name] = t.narrow(0, skipped, nc).contiguous();
  }
  return out;
}

void write_vtp(const std::string& path, const SurfaceMesh& mesh,
               const std::vector<std::pair<std::string, torch::Tensor>>& cell_fields) {
  const auto vertices = mesh.vertices.to(torch::kDouble).contiguous();
  const auto offsets = mesh.offsets.to(torch::kLong).contiguous();
  const auto connectivity = mesh.connectivity.to(torch::kLong).contiguous();
  const int64_t nc = mesh.num_cells();
  vtkNew<vtkPoints> pts;
  pts->SetDataTypeToFloat();
  pts->SetNumberOfPoints(vertices.size(0));
  const double* vp = vertices.data_ptr<double>();
  for (int64_t i = 0; i < vertices.size(0); ++i) pts->SetPoint(i, vp + 3 * i);
  vtkNew<vtkIdTypeArray> off, conn;
  off->SetNumberOfValues(nc + 1);
  const int64_t* op = offsets.data_ptr<int64_t>();
  for (int64_t c = 0; c <= nc; ++c) off->SetValue(c, op[c]);
  conn->SetNumberOfValues(connectivity.numel());
  const int64_t* cp = connectivity.data_ptr<int64_t>();
  for (int64_t k = 0; k < connectivity.numel(); ++k) conn->SetValue(k, cp[k]);
  vtkNew<vtkCellArray> polys;
  polys->SetData(off, conn);
  vtkNew<vtkPolyData> poly;
  poly->SetPoints(pts);
  poly->SetPolys(polys);
  for (const auto& [name, t] : cell_fields) {
    TORCH_CHECK(t.size(0) == nc, "vtk: field '", name, "' for '", path, "' has ", t.size(0),
                " rows for ", nc, " cells");
    poly->GetCellData()->AddArray(to_array(name, t, nc));
  }
  const std::string tmp = path + ".tmp.vtp";
  vtkNew<vtkXMLPolyDataWriter> writer;
  writer->SetFileName(tmp.c_str());
  writer->SetInputData(poly);
  writer->SetDataModeToAppended();
  writer->EncodeAppendedDataOff();
  write_into_place(writer.GetPointer(), tmp, path, "vtk");
}

}  // namespace slipstream::aero
