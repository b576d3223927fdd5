#include "aero/vtk/vtu_writer.h"

#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

namespace slipstream::aero {

namespace {

struct AppendedArray {
  std::string element, type, name;
  int64_t components = 1;
  uint64_t bytes = 0;  // without the 8-byte size in front
};

// The cells: vertex i is point i (connectivity i, offset i + 1, type 1 =
// VTK_VERTEX), made and written a block at a time.
void write_vertex_cells(AtomicFileWriter& out, int64_t n) {
  constexpr int64_t kBlock = 1 << 20;
  std::vector<int64_t> ids;
  for (int pass = 0; pass < 2; ++pass) {  // connectivity, then offsets
    const uint64_t size = static_cast<uint64_t>(n) * 8;
    out.write(&size, 8);
    for (int64_t first = 0; first < n; first += kBlock) {
      const int64_t count = std::min(kBlock, n - first);
      ids.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = first + i + pass;
      out.write(ids.data(), ids.size() * 8);
    }
  }
  const auto size = static_cast<uint64_t>(n);
  out.write(&size, 8);
  const std::vector<uint8_t> types(static_cast<size_t>(std::min(kBlock, n)), 1);
  for (int64_t first = 0; first < n; first += kBlock) {
    out.write(types.data(), static_cast<size_t>(std::min(kBlock, n - first)));
  }
}

}  // namespace

void write_vtu(const std::string& path, const torch::Tensor& points_in,
               const std::vector<std::pair<std::string, torch::Tensor>>& fields) {
  TORCH_CHECK(points_in.dim() == 2 && points_in.size(1) == 3, "vtu: writing '", path,
              "': points must be (N, 3), not ", points_in.sizes());
  const int64_t n = points_in.size(0);
  std::vector<torch::Tensor> data;
  std::vector<AppendedArray> arrays;
  for (const auto& [name, t] : fields) {
    TORCH_CHECK(t.dim() >= 1 && t.size(0) == n, "vtu: writing '", path, "': field '", name,
                "' has ", t.dim() >= 1 ? t.size(0) : 0, " rows for ", n, " points");
    TORCH_CHECK(!name.empty() && name.find_first_of("<>&\"'") == std::string::npos,
                "vtu: writing '", path, "': field name '", name,
                "' is empty or needs XML escaping");
    const auto f = t.reshape({n, -1}).to(torch::kFloat).contiguous();
    arrays.push_back(
        {"PointData", "Float32", name, f.size(1), static_cast<uint64_t>(f.numel()) * 4});
    data.push_back(f);
  }
  const auto points = points_in.to(torch::kFloat).contiguous();
  arrays.push_back({"Points", "Float32", "Points", 3, static_cast<uint64_t>(n) * 12});
  data.push_back(points);
  const auto cells = static_cast<uint64_t>(n);
  arrays.push_back({"Cells", "Int64", "connectivity", 1, cells * 8});
  arrays.push_back({"Cells", "Int64", "offsets", 1, cells * 8});
  arrays.push_back({"Cells", "UInt8", "types", 1, cells});

  std::ostringstream xml;
  xml << "<?xml version=\"1.0\"?>\n"
      << "<VTKFile type=\"UnstructuredGrid\" version=\"1.0\" byte_order=\"LittleEndian\" "
         "header_type=\"UInt64\">\n"
      << "  <UnstructuredGrid>\n"
      << "    <Piece NumberOfPoints=\"" << n << "\" NumberOfCells=\"" << n << "\">\n";
  uint64_t offset = 0;
  for (const char* element : {"PointData", "Points", "Cells"}) {
    xml << "      <" << element << ">\n";
    for (const auto& a : arrays) {
      if (a.element != element) continue;
      xml << "        <DataArray type=\"" << a.type << "\" Name=\"" << a.name
          << "\" NumberOfComponents=\"" << a.components << "\" format=\"appended\" offset=\""
          << offset << "\"/>\n";
      offset += 8 + a.bytes;
    }
    xml << "      </" << element << ">\n";
  }
  xml << "    </Piece>\n  </UnstructuredGrid>\n  <AppendedData encoding=\"raw\">\n   _";
  AtomicFileWriter out(path);
  const std::string head = xml.str();
  out.write(head.data(), head.size());
  // The arrays in the order of their offsets: point data, points, cells.
  for (size_t i = 0; i < data.size(); ++i) {
    const uint64_t size = arrays[i].bytes;
    out.write(&size, 8);
    out.write(data[i].data_ptr(), size);
  }
  write_vertex_cells(out, n);
  const std::string tail = "\n  </AppendedData>\n</VTKFile>\n";
  out.write(tail.data(), tail.size());
  out.commit();
}

}  // namespace slipstream::aero
