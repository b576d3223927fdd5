#include "aero/data/sample_file.h"

#include "core/io/crc32c.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>

namespace slipstream::aero {

namespace {
constexpr const char* kFormatV1 = "slipstream-samples-v1";
constexpr const char* kFormat = kSampleFormat;
constexpr const char* kMeshPrefix = "mesh/";
constexpr const char* kChecksumPrefix = "checksum/";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Files written before globals were listed in their metadata hold these.
const std::set<std::string>& known_globals() {
  static const std::set<std::string> names{"U_inf", "rho_inf", "p_inf", "L_ref", "A_ref", "nu"};
  return names;
}

std::set<std::string> split_names(const std::string& list) {
  std::set<std::string> out;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    if (!name.empty()) out.insert(name);
  }
  return out;
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

uint64_t seed_of_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// A point field as the loader uses it: (N, C) float.
at::Tensor as_rows(const at::Tensor& t) {
  auto x = t.to(torch::kFloat);
  return x.dim() == 1 ? x.unsqueeze(1) : x.reshape({x.size(0), -1});
}

// The first row of `t` (N, ...) holding a non-finite value, or -1.
int64_t first_nonfinite_row(const at::Tensor& t) {
  if (!t.is_floating_point() || t.numel() == 0) return -1;
  const auto bad = (~torch::isfinite(t.reshape({t.size(0), -1}))).any(1).nonzero();
  return bad.numel() ? bad[0][0].item<int64_t>() : -1;
}

// The polygons in the order `perm` (polygon i of the result is perm[i]).
void permute_polygons(std::map<std::string, at::Tensor>& mesh, const std::vector<int64_t>& perm,
                      const std::string& path) {
  const auto offsets = mesh.at("offsets").to(torch::kLong).contiguous();
  const auto conn = mesh.at("connectivity").to(torch::kLong).contiguous();
  const int64_t cells = offsets.size(0) - 1;
  TORCH_CHECK(cells == static_cast<int64_t>(perm.size()), "write sample: '", path, "' has ",
              perm.size(), " rows but its mesh ", cells, " polygons: they must be the same cells");
  const int64_t* o = offsets.data_ptr<int64_t>();
  const int64_t* c = conn.data_ptr<int64_t>();
  auto new_offsets = torch::empty_like(offsets);
  auto new_conn = torch::empty_like(conn);
  int64_t* no = new_offsets.data_ptr<int64_t>();
  int64_t* nc = new_conn.data_ptr<int64_t>();
  no[0] = 0;
  for (int64_t i = 0; i < cells; ++i) {
    const int64_t p = perm[i], len = o[p + 1] - o[p];
    std::memcpy(nc + no[i], c + o[p], static_cast<size_t>(len) * sizeof(int64_t));
    no[i + 1] = no[i] + len;
  }
  mesh["offsets"] = new_offsets.to(mesh.at("offsets").scalar_type());
  mesh["connectivity"] = new_conn.to(mesh.at("connectivity").scalar_type());
}

int64_t parse_int(const std::map<std::string, std::string>& meta, const std::string& key,
                  const std::string& path) {
  auto it = meta.find(key);
  TORCH_CHECK(it != meta.end(), "dataset: sample file '", path, "' has no '", key,
              "' in its metadata");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    TORCH_CHECK(false, "dataset: sample file '", path, "' metadata '", key, "' is not a number: '",
                it->second, "'");
  }
}
}  // namespace

bool is_sample_format(const std::string& format) {
  return format == kFormat || format == kFormatV1;
}

std::vector<int64_t> row_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), int64_t{0});
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // a multiple of bound
    uint64_t x = rng();
    while (x >= limit) x = rng();
    std::swap(p[i], p[x % bound]);
  }
  return p;
}

void write_sample_file(const std::string& path, const Sample& s, const SampleWriteOptions& o) {
  TORCH_CHECK(o.chunk_rows > 0, "write sample: chunk_rows must be positive");
  TORCH_CHECK(s.has_point("points"), "write sample: '", path, "' holds no 'points'");
  const int64_t n = s.num_points();
  std::set<std::string> nonfinite;
  for (const auto& [name, t] : s.point_data) {
    TORCH_CHECK(t.defined() && t.dim() >= 1 && t.size(0) == n, "write sample: '", path,
                "' point field '", name, "' has shape ",
                t.defined() ? t.sizes() : at::IntArrayRef{}, ": one row per point (", n,
                ") expected");
    const int64_t bad = first_nonfinite_row(t);
    if (bad < 0) continue;
    TORCH_CHECK(name != "points", "write sample: '", path, "' point ", bad,
                " has non-finite coordinates");
    nonfinite.insert(name);
  }
  const uint64_t seed = o.row_seed != 0 ? o.row_seed : seed_of_name(path);
  std::vector<int64_t> perm;
  at::Tensor index;
  if (o.permute) {
    perm = row_permutation(n, seed);
    index = torch::from_blob(perm.data(), {n}, torch::kLong);
  }
  const auto mean = s.point("points").to(torch::kDouble).mean(0);
  char mean_text[128];
  std::snprintf(mean_text, sizeof(mean_text), "%.17g,%.17g,%.17g", mean[0].item<double>(),
                mean[1].item<double>(), mean[2].item<double>());

  std::vector<std::pair<std::string, at::Tensor>> tensors, checksums;
  const int64_t chunks = (n + o.chunk_rows - 1) / o.chunk_rows;
  for (const auto& [name, t] : s.point_data) {
    auto rows = (o.permute ? t.index_select(0, index) : t).contiguous();
    const size_t row_bytes = static_cast<size_t>(rows.numel() / std::max<int64_t>(n, 1)) *
                             static_cast<size_t>(rows.element_size());
    auto crc = torch::empty({chunks}, torch::kInt);
    const auto* bytes = static_cast<const unsigned char*>(rows.data_ptr());
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * o.chunk_rows, r1 = std::min(n, r0 + o.chunk_rows);
      const uint32_t v = crc32c(bytes + r0 * row_bytes, (r1 - r0) * row_bytes);
      crc[c] = static_cast<int32_t>(v);
    }
    tensors.emplace_back(name, rows);
    checksums.emplace_back(kChecksumPrefix + name, crc);
  }
  std::string globals;
  for (const auto& [name, t] : s.global_data) {
    tensors.emplace_back(name, t);
    globals += (globals.empty() ? "" : ",") + name;
  }
  auto mesh = s.mesh;
  if (o.permute && mesh.count("offsets") && mesh.count("connectivity")) {
    permute_polygons(mesh, perm, path);
  }
  for (const auto& [name, t] : mesh) tensors.emplace_back(kMeshPrefix + name, t);
  tensors.insert(tensors.end(), checksums.begin(), checksums.end());
  std::map<std::string, std::string> meta{{"id", s.id},
                                          {"format", kFormat},
                                          {"globals", globals},
                                          {"rows", std::to_string(n)},
                                          {"chunk_rows", std::to_string(o.chunk_rows)},
                                          {"points_mean", mean_text},
                                          {"nonfinite", join(nonfinite)}};
  if (o.permute) {
    meta["row_order"] = "permuted";
    meta["row_seed"] = std::to_string(seed);
  } else {
    meta["row_order"] = "source";
  }
  write_safetensors(path, tensors, meta);
}

SampleFile::SampleFile(std::string path) : file_(std::move(path)) {
  index_ = read_safetensors_index(file_);
  const auto& meta = index_.metadata;
  auto format = meta.find("format");
  TORCH_CHECK(format == meta.end() || is_sample_format(format->second), "dataset: '", this->path(),
              "' is a '", format->second, "' file, not a Slipstream sample (", kFormat, ")");
  auto g = meta.find("globals");
  globals_ = g == meta.end() ? known_globals() : split_names(g->second);
  const SafetensorsEntry* points = index_.find("points");
  TORCH_CHECK(points != nullptr, "dataset: sample file '", this->path(), "' holds no 'points'");
  TORCH_CHECK(points->shape.size() == 2 && points->shape[1] == 3, "dataset: sample file '",
              this->path(), "' points must be (N, 3), not ", c10::IntArrayRef(points->shape));
  rows_ = points->shape[0];
  for (const auto& e : index_.entries) {
    if (!is_point_field(e.name)) continue;
    TORCH_CHECK(!e.shape.empty() && e.shape[0] == rows_, "dataset: sample file '", this->path(),
                "' point field '", e.name, "' has shape ", c10::IntArrayRef(e.shape),
                ": one row per point (", rows_, ") expected");
  }
  auto order = meta.find("row_order");
  if (order == meta.end()) return;  // v1
  permuted_ = order->second == "permuted";
  if (permuted_) row_seed_ = std::stoull(meta.at("row_seed"));
  chunk_rows_ = parse_int(meta, "chunk_rows", this->path());
  TORCH_CHECK(chunk_rows_ > 0 && parse_int(meta, "rows", this->path()) == rows_,
              "dataset: sample file '", this->path(), "' has inconsistent rows/chunk_rows");
  auto nf = meta.find("nonfinite");
  if (nf != meta.end()) nonfinite_ = split_names(nf->second);
  auto pm = meta.find("points_mean");
  if (pm != meta.end()) {
    std::vector<double> v;
    std::stringstream ss(pm->second);
    for (std::string x; std::getline(ss, x, ',');) v.push_back(std::strtod(x.c_str(), nullptr));
    TORCH_CHECK(v.size() == 3, "dataset: sample file '", this->path(), "' points_mean '",
                pm->second, "' is not three numbers");
    points_mean_ = torch::tensor(v, torch::kDouble);
  }
  const int64_t chunks = (rows_ + chunk_rows_ - 1) / chunk_rows_;
  for (const auto& e : index_.entries) {
    if (!is_point_field(e.name)) continue;
    const SafetensorsEntry* c = index_.find(kChecksumPrefix + e.name);
    TORCH_CHECK(
        c != nullptr && c->dtype == torch::kInt && c->shape.size() == 1 && c->shape[0] == chunks,
        "dataset: sample file '", this->path(), "' has no checksums for field '", e.name, "' (",
        chunks, " chunks expected)");
    checksums_[e.name] = read_entry(*c);
  }
}

bool SampleFile::is_point_field(const std::string& name) const {
  return !starts_with(name, kMeshPrefix) && !starts_with(name, kChecksumPrefix) &&
         !globals_.count(name);
}

SampleLayout SampleFile::layout() const {
  SampleLayout out;
  for (const auto& e : index_.entries) {
    if (starts_with(e.name, kMeshPrefix) || starts_with(e.name, kChecksumPrefix)) continue;
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    if (globals_.count(e.name)) {
      out.global_sizes[e.name] = numel;
    } else {
      out.point_channels[e.name] = e.shape.size() == 2 ? e.shape[1] : 1;
    }
  }
  return out;
}

at::Tensor SampleFile::read_entry(const SafetensorsEntry& e) const {
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  file_.read(e.offset, e.nbytes, t.data_ptr());
  return t;
}

void SampleFile::verify(const SafetensorsEntry& e, const at::Tensor& rows,
                        int64_t first_row) const {
  auto it = checksums_.find(e.name);
  if (it == checksums_.end()) return;  // v1
  const auto* want = it->second.data_ptr<int32_t>();
  const size_t row_bytes = rows_ > 0 ? e.nbytes / static_cast<size_t>(rows_) : 0;
  const auto* bytes = static_cast<const unsigned char*>(rows.data_ptr());
  const int64_t count = rows.size(0);
  for (int64_t r = 0; r < count; r += chunk_rows_) {
    const int64_t chunk = (first_row + r) / chunk_rows_;
    const int64_t len = std::min(chunk_rows_, count - r);
    const auto got = static_cast<int32_t>(crc32c(bytes + r * row_bytes, len * row_bytes));
    if (got == want[chunk]) continue;
    const int64_t bad = first_nonfinite_row(rows.narrow(0, r, len));
    TORCH_CHECK(false, "dataset: sample file '", path(), "' field '", e.name, "' rows [",
                first_row + r, ", ", first_row + r + len,
                ") changed after the file was written (checksum mismatch)",
                bad >= 0 ? "; row " + std::to_string(first_row + r + bad) + " is not finite" : "",
                ". Re-run prepare for this sample");
  }
}

at::Tensor SampleFile::read_rows(const SafetensorsEntry& e, int64_t a, int64_t b) const {
  const int64_t r0 = a / chunk_rows_ * chunk_rows_;
  const int64_t r1 = std::min(rows_, (b + chunk_rows_ - 1) / chunk_rows_ * chunk_rows_);
  std::vector<int64_t> shape = e.shape;
  shape[0] = r1 - r0;
  auto buf = torch::empty(shape, torch::TensorOptions().dtype(e.dtype));
  const uint64_t row_bytes = e.nbytes / static_cast<uint64_t>(rows_);
  file_.read(e.offset + static_cast<uint64_t>(r0) * row_bytes,
             static_cast<size_t>(r1 - r0) * row_bytes, buf.data_ptr());
  verify(e, buf, r0);
  return buf.narrow(0, a - r0, b - a);
}

Sample SampleFile::read_all() const {
  // Mapped, not copied: the tensors view the file's pages.
  const SafetensorsFile mapped = read_safetensors(path());
  Sample s;
  s.id = path();
  for (const auto& e : index_.entries) {
    if (starts_with(e.name, kChecksumPrefix)) continue;
    const at::Tensor& t = mapped.at(e.name);
    if (starts_with(e.name, kMeshPrefix)) {
      s.mesh[e.name.substr(std::strlen(kMeshPrefix))] = t;
    } else if (globals_.count(e.name)) {
      s.global_data[e.name] =
          e.name == "U_inf" ? t.to(torch::kFloat).reshape({-1}) : t.reshape({-1});
    } else {
      verify(e, t, 0);
      s.point_data[e.name] = as_rows(t);
    }
  }
  if (points_mean_.defined()) s.points_mean = points_mean_;
  return s;
}

Sample SampleFile::read_block(int64_t begin, int64_t count) const {
  TORCH_CHECK(permuted_, "dataset: '", path(),
              "' holds its rows in the source's order: a block of it is not a random sample");
  TORCH_CHECK(count > 0 && count <= rows_ && begin >= 0 && begin < rows_, "dataset: block [", begin,
              ", +", count, ") of '", path(), "' (", rows_, " rows)");
  const int64_t first = std::min(count, rows_ - begin);
  Sample s;
  s.id = path();
  s.rows = torch::cat({torch::arange(begin, begin + first, torch::kLong),
                       torch::arange(0, count - first, torch::kLong)});
  s.points_mean = points_mean_;
  for (const auto& e : index_.entries) {
    if (starts_with(e.name, kMeshPrefix) || starts_with(e.name, kChecksumPrefix)) continue;
    if (globals_.count(e.name)) {
      auto t = read_entry(e);
      s.global_data[e.name] =
          e.name == "U_inf" ? t.to(torch::kFloat).reshape({-1}) : t.reshape({-1});
      continue;
    }
    auto t = read_rows(e, begin, begin + first);
    if (first < count) t = torch::cat({t, read_rows(e, 0, count - first)});
    s.point_data[e.name] = as_rows(t).contiguous();
  }
  return s;
}

Sample read_sample_file(const std::string& path) { return SampleFile(path).read_all(); }

SampleLayout read_sample_layout(const std::string& path) { return SampleFile(path).layout(); }

}  // namespace slipstream::aero
