// Volume points and their fields as a VTK XML UnstructuredGrid (.vtu),
// written without VTK: one vertex cell a point, every array Float32 (the
// cells' Int64 and UInt8) in a raw appended section, header_type UInt64,
// uncompressed. VTK's reader, ParaView and VtuStream (vtu_stream.h) read it.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {

// points (N, 3) and fields of N rows ((N) or (N, C)), any floating type,
// written as float32 through a temp file and a rename: the file appears
// whole or not at all. Throws naming the file and the field for a field of
// another row count or a name XML would need escaped.
void write_vtu(const std::string& path, const torch::Tensor& points,
               const std::vector<std::pair<std::string, torch::Tensor>>& fields);

}  // namespace slipstream::aero
