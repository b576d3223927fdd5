#include "aero/data/sample_file.h"

#include "core/io/atomic_file.h"
#include "core/io/crc32c.h"
#include "core/process/parallel.h"
#include "core/process/pipeline.h"
#include "core/text/join.h"

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
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

uint64_t seed_of_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string mean_of(double x, double y, double z) {
  char text[128];
  std::snprintf(text, sizeof(text), "%.17g,%.17g,%.17g", x, y, z);
  return text;
}

std::map<std::string, std::string> file_metadata(const std::string& id, const std::string& globals,
                                                 int64_t n, const SampleWriteOptions& o,
                                                 uint64_t seed, const std::string& mean,
                                                 const std::string& nonfinite) {
  std::map<std::string, std::string> meta{{"id", id},
                                          {"format", kFormat},
                                          {"globals", globals},
                                          {"rows", std::to_string(n)},
                                          {"chunk_rows", std::to_string(o.chunk_rows)},
                                          {"points_mean", mean},
                                          {"nonfinite", nonfinite}};
  if (o.permute) {
    meta["row_order"] = "permuted";
    meta["row_seed"] = std::to_string(seed);
  } else {
    meta["row_order"] = "source";
  }
  return meta;
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

namespace {
template <typename Index>
std::vector<Index> shuffled(int64_t n, uint64_t seed) {
  std::vector<Index> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), Index{0});
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // a multiple of bound
    uint64_t x = rng();
    while (x >= limit) x = rng();
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(x % bound)]);
  }
  return p;
}
}  // namespace

std::vector<int64_t> row_permutation(int64_t n, uint64_t seed) {
  return shuffled<int64_t>(n, seed);
}

std::vector<uint32_t> row_places(int64_t n, uint64_t seed) {
  TORCH_CHECK(n >= 0 && n < (int64_t{1} << 31), "row_places: ", n, " rows (below 2^31)");
  auto p = shuffled<uint32_t>(n, seed);
  // Inverted in place, cycle by cycle; the top bit marks a place written.
  constexpr uint32_t kMark = 1u << 31;
  for (uint32_t i = 0; i < static_cast<uint32_t>(n); ++i) {
    if ((p[i] & kMark) != 0) continue;
    uint32_t prev = i, cur = p[i];
    while (cur != i) {  // file row prev holds source row cur
      const uint32_t next = p[cur];
      p[cur] = prev | kMark;
      prev = cur;
      cur = next;
    }
    p[i] = prev | kMark;
  }
  for (auto& v : p) v &= ~kMark;
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
  const std::string mean_text =
      mean_of(mean[0].item<double>(), mean[1].item<double>(), mean[2].item<double>());

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
  write_safetensors(path, tensors,
                    file_metadata(s.id, globals, n, o, seed, mean_text, join(nonfinite, ",")));
}

// --- SampleFileStreamWriter ----------------------------------------------

SampleFileStreamWriter::SampleFileStreamWriter(std::string path, int64_t rows,
                                               std::vector<std::pair<std::string, int64_t>> fields,
                                               const SampleWriteOptions& options)
    : path_(std::move(path)), rows_(rows), fields_(std::move(fields)), options_(options) {
  TORCH_CHECK(options_.permute, "write sample: a streamed sample file is always permuted");
  TORCH_CHECK(options_.chunk_rows > 0, "write sample: chunk_rows must be positive");
  TORCH_CHECK(rows_ > 0 && rows_ < (int64_t{1} << 31), "write sample: '", path_, "': ", rows_,
              " rows (1 to 2^31 - 1 can be streamed)");
  // The file's order, as write_sample_file's: by name.
  std::sort(fields_.begin(), fields_.end());
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (fields_[f].first == "points") points_field_ = static_cast<int64_t>(f);
  }
  TORCH_CHECK(points_field_ >= 0 && fields_[static_cast<size_t>(points_field_)].second == 3,
              "write sample: '", path_, "': a 'points' field of 3 channels is required");
  for (const auto& [name, channels] : fields_) {
    TORCH_CHECK(channels > 0, "write sample: '", path_, "' field '", name, "' has no channels");
    row_bytes_ += static_cast<size_t>(channels) * sizeof(float);
  }
  seed_ = options_.row_seed != 0 ? options_.row_seed : seed_of_name(path_);
  place_ = row_places(rows_, seed_);
  // Buckets of whole chunks, about 512k rows each (the commit holds a few
  // at a time: ~30 MB each for a volume's 13 floats a row).
  bucket_rows_ =
      options_.bucket_rows > 0
          ? options_.bucket_rows
          : std::max<int64_t>(1, (int64_t{1} << 19) / options_.chunk_rows) * options_.chunk_rows;
  TORCH_CHECK(bucket_rows_ % options_.chunk_rows == 0, "write sample: bucket_rows (", bucket_rows_,
              ") must be a multiple of chunk_rows (", options_.chunk_rows, ")");
  const int64_t buckets = (rows_ + bucket_rows_ - 1) / bucket_rows_;
  const std::string stem = path_ + ".tmp." + std::to_string(getpid()) + ".bucket";
  for (int64_t b = 0; b < buckets; ++b) {
    bucket_paths_.push_back(stem + std::to_string(b));
    std::FILE* f = std::fopen(bucket_paths_.back().c_str(), "w+b");
    TORCH_CHECK(f != nullptr, "write sample: cannot create '", bucket_paths_.back(),
                "': ", std::strerror(errno));
    buckets_.push_back(f);
  }
  record_.resize(sizeof(uint32_t) + row_bytes_);
}

SampleFileStreamWriter::~SampleFileStreamWriter() { close_buckets(); }

void SampleFileStreamWriter::close_buckets() {
  for (std::FILE* f : buckets_) {
    if (f != nullptr) std::fclose(f);
  }
  buckets_.clear();
  for (const auto& p : bucket_paths_) std::remove(p.c_str());
  bucket_paths_.clear();
}

void SampleFileStreamWriter::append(const std::map<std::string, at::Tensor>& block) {
  TORCH_CHECK(!buckets_.empty(), "write sample: '", path_, "' appended to after commit");
  TORCH_CHECK(block.size() == fields_.size(), "write sample: '", path_, "': a block of ",
              block.size(), " fields; ", fields_.size(), " expected");
  std::vector<at::Tensor> columns;
  int64_t n = -1;
  for (const auto& [name, channels] : fields_) {
    const auto it = block.find(name);
    TORCH_CHECK(it != block.end(), "write sample: '", path_, "': the block has no '", name, "'");
    auto t = it->second.to(torch::kFloat).contiguous();
    if (n < 0) n = t.size(0);
    TORCH_CHECK(t.dim() == 2 && t.size(0) == n && t.size(1) == channels, "write sample: '", path_,
                "' field '", name, "' block has shape ", t.sizes(), "; (", n, ", ", channels,
                ") expected");
    const int64_t bad = first_nonfinite_row(t);
    if (bad >= 0) {
      TORCH_CHECK(name != "points", "write sample: '", path_, "' point ", written_ + bad,
                  " has non-finite coordinates");
      nonfinite_.insert(name);
    }
    columns.push_back(t);
  }
  TORCH_CHECK(written_ + n <= rows_, "write sample: '", path_, "': more than ", rows_, " rows");
  const auto sums = columns[static_cast<size_t>(points_field_)].to(torch::kDouble).sum(0);
  for (int d = 0; d < 3; ++d) sum_[d] += sums[d].item<double>();
  std::vector<const unsigned char*> src;
  std::vector<size_t> width;
  for (size_t f = 0; f < columns.size(); ++f) {
    src.push_back(static_cast<const unsigned char*>(columns[f].data_ptr()));
    width.push_back(static_cast<size_t>(fields_[f].second) * sizeof(float));
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t place = place_[static_cast<size_t>(written_ + i)];
    const uint32_t local = static_cast<uint32_t>(place % bucket_rows_);
    unsigned char* out = record_.data();
    std::memcpy(out, &local, sizeof(local));
    out += sizeof(local);
    for (size_t f = 0; f < src.size(); ++f) {
      std::memcpy(out, src[f] + static_cast<size_t>(i) * width[f], width[f]);
      out += width[f];
    }
    std::FILE* bucket = buckets_[place / bucket_rows_];
    TORCH_CHECK(std::fwrite(record_.data(), 1, record_.size(), bucket) == record_.size(),
                "write sample: writing '", bucket_paths_[place / bucket_rows_],
                "' failed: ", std::strerror(errno));
  }
  written_ += n;
}

void SampleFileStreamWriter::commit(const std::string& id,
                                    const std::map<std::string, at::Tensor>& globals) {
  TORCH_CHECK(!buckets_.empty(), "write sample: '", path_, "' committed twice");
  TORCH_CHECK(written_ == rows_, "write sample: '", path_, "': ", written_, " rows given of ",
              rows_);
  place_ = {};  // the permutation is in the buckets now
  const int64_t chunks = (rows_ + options_.chunk_rows - 1) / options_.chunk_rows;
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, channels] : fields_)
    specs.push_back({name, torch::kFloat, {rows_, channels}});
  std::string global_names;
  for (const auto& [name, t] : globals) {
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
    global_names += (global_names.empty() ? "" : ",") + name;
  }
  for (const auto& [name, channels] : fields_) {
    specs.push_back({kChecksumPrefix + name, torch::kInt, {chunks}});
  }
  const auto n = static_cast<double>(rows_);
  const auto meta =
      file_metadata(id, global_names, rows_, options_, seed_,
                    mean_of(sum_[0] / n, sum_[1] / n, sum_[2] / n), join(nonfinite_, ","));
  std::vector<uint64_t> offsets;
  const std::string head = safetensors_header(specs, meta, &offsets);
  AtomicFileWriter out(path_);
  out.write(head.data(), head.size());
  std::vector<at::Tensor> crcs;
  for (size_t f = 0; f < fields_.size(); ++f) crcs.push_back(torch::empty({chunks}, torch::kInt));
  // Reading bucket b + 1, ordering and checksumming bucket b and writing
  // bucket b - 1 overlap (core/process/pipeline.h).
  struct Bucket {
    int64_t first = 0, count = 0;
    std::vector<unsigned char> records;
    std::vector<std::vector<unsigned char>> rows;  // each field's, in file order
  };
  // Buffers of tens of MB, handed from bucket to bucket: fresh ones cost a
  // page fault every 4 KB (a third of the commit's time, measured). Each
  // request takes the smallest kept buffer that holds it; a few are kept.
  std::mutex pool_mutex;
  std::vector<std::vector<unsigned char>> pool;
  const auto take = [&](size_t bytes) {
    std::vector<unsigned char> v;
    {
      const std::lock_guard<std::mutex> lock(pool_mutex);
      auto best = pool.end();
      for (auto it = pool.begin(); it != pool.end(); ++it) {
        if (it->size() >= bytes && (best == pool.end() || it->size() < best->size())) best = it;
      }
      if (best != pool.end()) {
        v = std::move(*best);
        pool.erase(best);
      }
    }
    if (v.size() < bytes) v.resize(bytes);
    return v;
  };
  const auto give = [&](std::vector<unsigned char>& v) {
    const std::lock_guard<std::mutex> lock(pool_mutex);
    if (pool.size() < 2 * (fields_.size() + 1)) pool.push_back(std::move(v));
    v = {};
  };
  run_pipeline<Bucket>(
      static_cast<int64_t>(buckets_.size()), 1,
      [&](int64_t b) {
        Bucket k;
        k.first = b * bucket_rows_;
        k.count = std::min(bucket_rows_, rows_ - k.first);
        std::FILE* f = buckets_[static_cast<size_t>(b)];
        const size_t bytes = static_cast<size_t>(k.count) * record_.size();
        k.records = take(bytes);
        TORCH_CHECK(std::fflush(f) == 0 && std::fseek(f, 0, SEEK_SET) == 0 &&
                        std::fread(k.records.data(), 1, bytes, f) == bytes,
                    "write sample: reading back '", bucket_paths_[static_cast<size_t>(b)],
                    "' failed: ", std::strerror(errno));
        std::fclose(f);
        buckets_[static_cast<size_t>(b)] = nullptr;
        std::remove(bucket_paths_[static_cast<size_t>(b)].c_str());
        return k;
      },
      [&](int64_t b, Bucket& k) {
        k.rows.resize(fields_.size());
        for (size_t i = 0; i < fields_.size(); ++i) {
          k.rows[i] = take(static_cast<size_t>(k.count * fields_[i].second) * sizeof(float));
        }
        // Rows to their places on every core (the places are a permutation:
        // no two rows write the same bytes), then each chunk's checksum.
        parallel_ranges(k.count, 1 << 15, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const unsigned char* rec = k.records.data() + static_cast<size_t>(r) * record_.size();
            uint32_t local = 0;
            std::memcpy(&local, rec, sizeof(local));
            TORCH_CHECK(local < k.count, "write sample: '", bucket_paths_[static_cast<size_t>(b)],
                        "' is damaged");
            rec += sizeof(local);
            for (size_t i = 0; i < fields_.size(); ++i) {
              const size_t w = static_cast<size_t>(fields_[i].second) * sizeof(float);
              std::memcpy(k.rows[i].data() + local * w, rec, w);
              rec += w;
            }
          }
        });
        give(k.records);
        const int64_t bucket_chunks = (k.count + options_.chunk_rows - 1) / options_.chunk_rows;
        const auto n_fields = static_cast<int64_t>(fields_.size());
        parallel_ranges(n_fields * bucket_chunks, 1, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const auto i = static_cast<size_t>(t / bucket_chunks);
            const int64_t r0 = (t % bucket_chunks) * options_.chunk_rows;
            const int64_t r1 = std::min(k.count, r0 + options_.chunk_rows);
            const size_t w = static_cast<size_t>(fields_[i].second) * sizeof(float);
            crcs[i].data_ptr<int32_t>()[(k.first + r0) / options_.chunk_rows] =
                static_cast<int32_t>(crc32c(k.rows[i].data() + static_cast<size_t>(r0) * w,
                                            static_cast<size_t>(r1 - r0) * w));
          }
        });
      },
      [&](int64_t, Bucket& k) {
        for (size_t i = 0; i < fields_.size(); ++i) {
          const size_t w = static_cast<size_t>(fields_[i].second) * sizeof(float);
          out.write_at(offsets[i] + static_cast<uint64_t>(k.first) * w, k.rows[i].data(),
                       static_cast<size_t>(k.count) * w);
          give(k.rows[i]);
        }
      });
  size_t next = fields_.size();
  for (const auto& [name, t] : globals) {
    const auto c = t.contiguous();
    out.write_at(offsets[next++], c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  }
  for (const auto& crc : crcs) {
    out.write_at(offsets[next++], crc.data_ptr(), static_cast<size_t>(crc.numel()) * 4);
  }
  out.commit();
  close_buckets();
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

std::optional<uint32_t> SampleFile::fingerprint() const {
  if (checksums_.empty()) return std::nullopt;
  uint32_t crc = 0;
  const auto add = [&crc](const void* data, size_t size) { crc = crc32c(data, size, crc); };
  const auto add_text = [&add](const std::string& text) { add(text.data(), text.size() + 1); };
  for (const auto& [key, value] : index_.metadata) {
    add_text(key);
    add_text(value);
  }
  for (const auto& e : index_.entries) {
    add_text(e.name);
    const auto dtype = static_cast<int64_t>(e.dtype);
    add(&dtype, sizeof dtype);
    add(e.shape.data(), e.shape.size() * sizeof(int64_t));
    add(&e.offset, sizeof e.offset);
    add(&e.nbytes, sizeof e.nbytes);
    const bool global = globals_.count(e.name) > 0;
    if (global || starts_with(e.name, kChecksumPrefix)) {
      const at::Tensor t = read_entry(e).contiguous();
      add(t.data_ptr(), e.nbytes);
    }
  }
  return crc;
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
