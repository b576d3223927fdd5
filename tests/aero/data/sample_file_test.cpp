// Sample files laid out for sampling: a block of the stored rows is the
// rows of the file's permutation, a uniform random sample of the points;
// consecutive epochs read every row; a chunk changed after writing is
// caught when read, naming the file, the field and the row; files written
// before the layout still load.
#include "aero/data/sample_file.h"
#include "aero/data/dataset_source.h"
#include "aero/data/loader.h"
#include "core/io/safetensors.h"
#include "support/files.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

namespace slipstream::aero {
namespace {

using testing::error_message_of;

// n rows: points (i, 2i, -i), a pressure ramp i / n (sorted: a block of the
// source's order is anything but a random sample of it), U_inf, and one
// triangle per row (vertices i, i+1, i+2 of a strip).
Sample ramp_sample(int64_t n) {
  Sample s;
  s.id = "ramp";
  const auto i = torch::arange(n, torch::kFloat);
  s.point_data["points"] = torch::stack({i, 2 * i, -i}, 1);
  s.point_data["pressure"] = (i / n).unsqueeze(1);
  s.global_data["U_inf"] = torch::tensor({1.f, 0.f, 0.f});
  s.mesh["vertices"] = torch::zeros({n + 2, 3});
  s.mesh["offsets"] = torch::arange(0, 3 * (n + 1), 3, torch::kLong);
  const auto first = torch::arange(n, torch::kLong);
  s.mesh["connectivity"] = torch::stack({first, first + 1, first + 2}, 1).reshape({-1});
  return s;
}

at::Tensor rows_of(const std::vector<int64_t>& perm, const at::Tensor& rows) {
  auto p = torch::tensor(perm, torch::kLong);
  return p.index_select(0, rows);
}

TEST(SampleFileTest, RowPermutationIsAPermutationFixedByItsSeedOnEveryPlatform) {
  auto p = row_permutation(1000, 7);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(row_permutation(1000, 7), p);
  EXPECT_NE(row_permutation(1000, 8), p);
  // mt19937_64 is specified by the standard and the draw is ours: these
  // values hold with any compiler and library (a file written on one
  // machine is read the same on another).
  EXPECT_EQ(row_permutation(8, 1), (std::vector<int64_t>{4, 6, 3, 5, 1, 7, 2, 0}));
}

TEST(SampleFileTest, RowPlacesAreTheInversePermutation) {
  for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{1000}, int64_t{65537}}) {
    const auto perm = row_permutation(n, 11);
    const auto places = row_places(n, 11);
    ASSERT_EQ(places.size(), perm.size());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(places[perm[i]], i) << "n " << n << " row " << i;
  }
}

TEST(SampleFileTest, ABlockIsTheRowsOfThePermutationAndWrapsPastTheEnd) {
  testing::TempDir dir;
  const int64_t n = 1000;
  const Sample src = ramp_sample(n);
  SampleWriteOptions o;
  o.chunk_rows = 64;
  write_sample_file(dir.file("s.safetensors"), src, o);
  const SampleFile file(dir.file("s.safetensors"));
  ASSERT_TRUE(file.permuted());
  EXPECT_EQ(file.rows(), n);
  const auto perm = row_permutation(n, file.row_seed());

  const Sample block = file.read_block(990, 30);
  const auto want_rows =
      torch::cat({torch::arange(990, 1000, torch::kLong), torch::arange(0, 20, torch::kLong)});
  EXPECT_TRUE(torch::equal(block.rows, want_rows));
  const auto source_rows = rows_of(perm, want_rows);
  for (const char* name : {"points", "pressure"}) {
    EXPECT_TRUE(torch::equal(block.point(name), src.point(name).index_select(0, source_rows)))
        << name;
  }
  EXPECT_TRUE(block.mesh.empty());
  EXPECT_TRUE(torch::allclose(block.points_mean, src.point("points").to(torch::kDouble).mean(0)));
  EXPECT_TRUE(torch::equal(block.global("U_inf"), src.global("U_inf")));

  // The whole file: the permuted rows, each polygon still its row's cell.
  const Sample all = file.read_all();
  const auto every = rows_of(perm, torch::arange(n, torch::kLong));
  EXPECT_TRUE(torch::equal(all.point("pressure"), src.point("pressure").index_select(0, every)));
  const auto conn = all.mesh.at("connectivity").view({n, 3});
  EXPECT_TRUE(torch::equal(conn.select(1, 0), every));
  EXPECT_TRUE(torch::equal(all.mesh.at("offsets"), src.mesh.at("offsets")));
}

// A dataset of one ramp sample of n rows, written with chunks of 256.
struct OneFile {
  testing::TempDir dir;
  DatasetSplits splits;
  explicit OneFile(int64_t n, bool permute = true) {
    SampleWriteOptions o;
    o.chunk_rows = 256;
    o.permute = permute;
    write_sample_file(dir.file("a.safetensors"), ramp_sample(n), o);
    std::ofstream(dir.file("manifest.json"))
        << R"({"format": "slipstream-samples-v2", "train": ["a.safetensors"]})";
    splits = open_sample_directory(dir.path());
  }
};

TEST(SampleFileTest, ABlockIsAUniformSampleItsFieldMeansMatchTheWholeSample) {
  const int64_t n = 20000, k = 400;
  OneFile data(n);
  // The ramp's mean is 0.5 - 1/(2n) and its standard deviation 1/sqrt(12):
  // a uniform sample of k has a mean within 5 standard errors.
  const double mean = 0.5 - 0.5 / n;
  const double se = std::sqrt(1.0 / 12.0 / k * (1.0 - double(k) / n));
  double sum = 0;
  const int steps = 60;
  for (int step = 0; step < steps; ++step) {
    PointRequest r{k, "random", 0, /*sample_seed=*/1000u + step, /*epoch=*/step % 3};
    const Sample s = data.splits.train->get(0, r);
    ASSERT_EQ(s.num_points(), k);
    const double m = s.point("pressure").mean().item<double>();
    EXPECT_LT(std::abs(m - mean), 5 * se) << "step " << step;
    sum += m;
  }
  EXPECT_LT(std::abs(sum / steps - mean), 5 * se / std::sqrt(steps));
  // The same rows of the source's order are a run of the ramp: the check
  // above tells a permuted file from an unpermuted one.
  const auto run = ramp_sample(n).point("pressure").narrow(0, 7000, k);
  EXPECT_GT(std::abs(run.mean().item<double>() - mean), 5 * se);
}

TEST(SampleFileTest, ConsecutiveEpochsReadEveryRow) {
  const int64_t n = 1000, k = 300;  // ceil(n / k) = 4 epochs
  OneFile data(n);
  std::set<int64_t> seen;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    PointRequest r{k, "random", 0, /*sample_seed=*/42, epoch};
    const Sample s = data.splits.train->get(0, r);
    const auto rows = s.rows;
    for (int64_t i = 0; i < rows.numel(); ++i) seen.insert(rows[i].item<int64_t>());
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
}

// Overwrites one float of `field` at file row `row` in place.
void plant(const std::string& path, const std::string& field, int64_t row, float value) {
  const RandomAccessFile f(path);
  const auto entry = read_safetensors_index(f).at(field);
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t row_bytes = entry.nbytes / static_cast<uint64_t>(entry.shape[0]);
  io.seekp(static_cast<std::streamoff>(entry.offset + row * row_bytes));
  io.write(reinterpret_cast<const char*>(&value), sizeof(value));
}

TEST(SampleFileTest, AChunkChangedAfterWritingIsCaughtNamingTheFileFieldAndRow) {
  const int64_t n = 1000;
  OneFile data(n);
  const std::string path = data.dir.file("a.safetensors");
  plant(path, "pressure", 300, NAN);
  const SampleFile file(path);
  // A block away from the chunk [256, 512) reads fine: only what is read is checked.
  EXPECT_NO_THROW(file.read_block(600, 200));
  for (auto read : {std::function<void()>([&] { file.read_block(250, 100); }),
                    std::function<void()>([&] { file.read_all(); })}) {
    const auto msg = error_message_of(read);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("field 'pressure' rows [256, 512) changed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("row 300 is not finite"), std::string::npos) << msg;
  }
}

TEST(SampleFileTest, NonFiniteValuesAreFoundWhenWrittenAndRefusedForPointsAndInputs) {
  testing::TempDir dir;
  Sample s = ramp_sample(100);
  s.point_data["pressure"][17][0] = NAN;
  write_sample_file(dir.file("a.safetensors"), s);
  EXPECT_EQ(SampleFile(dir.file("a.safetensors")).nonfinite(), std::set<std::string>{"pressure"});
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["a.safetensors"]})";
  auto splits = open_sample_directory(dir.path());
  SampleCheck check;
  check.required.point_channels = {{"points", 3}, {"pressure", 1}};
  check.targets = {"pressure"};
  splits.train->set_check(check);
  const auto msg = error_message_of([&] { splits.train->check_headers(); });
  EXPECT_NE(msg.find(dir.file("a.safetensors")), std::string::npos) << msg;
  EXPECT_NE(msg.find("'pressure' holds non-finite values"), std::string::npos) << msg;
  check.allow_nonfinite_targets = true;  // a target the loss masks
  splits.train->set_check(check);
  EXPECT_NO_THROW(splits.train->check_headers());
  // A block holding the NaN row names it when the target must be finite.
  check.allow_nonfinite_targets = false;
  splits.train->set_check(check);
  // Named by its row in the file, where source row 17 went.
  const SampleFile file(dir.file("a.safetensors"));
  const auto perm = row_permutation(100, file.row_seed());
  const auto row = std::find(perm.begin(), perm.end(), 17) - perm.begin();
  const auto at_step = error_message_of([&] { splits.train->get(0); });
  EXPECT_NE(at_step.find("field 'pressure' row " + std::to_string(row) + " is not finite"),
            std::string::npos)
      << at_step;

  s.point_data["points"][3][2] = INFINITY;
  const auto refused = error_message_of([&] { write_sample_file(dir.file("b.safetensors"), s); });
  EXPECT_NE(refused.find(dir.file("b.safetensors")), std::string::npos) << refused;
  EXPECT_NE(refused.find("point 3 has non-finite coordinates"), std::string::npos) << refused;
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.safetensors")));
}

// Streams `s`'s point fields (float, (N, C)) in blocks of the given sizes.
void stream_write(const std::string& path, const Sample& s, const std::vector<int64_t>& blocks,
                  const SampleWriteOptions& o) {
  std::vector<std::pair<std::string, int64_t>> fields;
  for (const auto& [name, t] : s.point_data) fields.emplace_back(name, t.size(1));
  std::reverse(fields.begin(), fields.end());  // any order: the file's is by name
  SampleFileStreamWriter w(path, s.num_points(), fields, o);
  int64_t at = 0;
  for (int64_t b : blocks) {
    std::map<std::string, at::Tensor> block;
    for (const auto& [name, t] : s.point_data) block[name] = t.narrow(0, at, b);
    w.append(block);
    at += b;
  }
  w.commit(s.id, s.global_data);
}

// Rows streamed in blocks, through several bucket files, give the file
// write_sample_file writes from the whole sample, byte for byte.
TEST(SampleFileTest, AStreamedFileIsTheWholeWrittenFile) {
  testing::TempDir dir;
  Sample s = ramp_sample(1000);
  s.mesh.clear();  // a volume: no polygons
  s.point_data["velocity"] = torch::randn({1000, 3});
  s.point_data["pressure"][5][0] = NAN;  // a masked target: recorded, not refused
  SampleWriteOptions o;
  o.chunk_rows = 64;
  o.bucket_rows = 128;  // 8 buckets
  write_sample_file(dir.file("whole.safetensors"), s, o);
  o.row_seed = SampleFile(dir.file("whole.safetensors")).row_seed();
  stream_write(dir.file("streamed.safetensors"), s, {1, 300, 599, 100}, o);
  const std::string whole = testing::file_bytes(dir.file("whole.safetensors"));
  EXPECT_EQ(testing::file_bytes(dir.file("streamed.safetensors")), whole);
  const SampleFile file(dir.file("streamed.safetensors"));
  EXPECT_EQ(file.nonfinite(), std::set<std::string>{"pressure"});
  EXPECT_TRUE(torch::equal(
      file.read_block(900, 200).point("velocity"),
      SampleFile(dir.file("whole.safetensors")).read_block(900, 200).point("velocity")));
  // No bucket or temp file is left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2u);
}

TEST(SampleFileTest, AStreamedFileRefusesBadRowsAndLeavesNothingBehind) {
  testing::TempDir dir;
  Sample s = ramp_sample(300);
  s.mesh.clear();
  s.point_data["points"][200][1] = NAN;
  SampleWriteOptions o;
  o.chunk_rows = 16;
  o.bucket_rows = 32;
  const std::string path = dir.file("a.safetensors");
  auto msg = error_message_of([&] { stream_write(path, s, {150, 150}, o); });
  EXPECT_NE(msg.find(path + "' point 200 has non-finite coordinates"), std::string::npos) << msg;
  s.point_data["points"][200][1] = 0;
  msg = error_message_of([&] { stream_write(path, s, {150, 100}, o); });
  EXPECT_NE(msg.find("250 rows given of 300"), std::string::npos) << msg;
  msg = error_message_of([&] {
    SampleFileStreamWriter w(path, 300, {{"points", 3}, {"pressure", 1}}, o);
    w.append({{"points", torch::zeros({10, 3})}, {"pressure", torch::zeros({10, 2})}});
  });
  EXPECT_NE(msg.find("field 'pressure' block has shape [10, 2]; (10, 1) expected"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SampleFileTest, AFileWrittenBeforeTheLayoutIsReadWholeAndSubsampledByTheLoader) {
  testing::TempDir dir;
  SyntheticOptions so;
  so.points_per_sample = 500;
  const Sample src = make_synthetic_sample(0, so);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : src.point_data) tensors.emplace_back(name, t);
  for (const auto& [name, t] : src.global_data) tensors.emplace_back(name, t);
  write_safetensors(dir.file("old.safetensors"), tensors,
                    {{"format", "slipstream-samples-v1"}, {"id", "old"}});
  std::ofstream(dir.file("manifest.json"))
      << R"({"format": "slipstream-samples-v1", "train": ["old.safetensors"]})";
  auto splits = open_sample_directory(dir.path());
  EXPECT_FALSE(SampleFile(dir.file("old.safetensors")).permuted());
  LoaderOptions o;
  o.sampling_resolution = 100;
  o.inputs = testing::volume_inputs();
  PrefetchLoader loader(splits.train, {0}, o, 0);
  const Batch b = loader.next();
  ASSERT_EQ(b.target.size(1), 100);
  // Each row's target is its own point's (the loader's random gather).
  auto p = b.inputs.at("embedding")[0].narrow(1, 0, 3);
  for (int64_t i = 0; i < 5; ++i) {
    auto row = (src.point("points") - p[i]).abs().sum(1).argmin().item<int64_t>();
    EXPECT_TRUE(torch::equal(b.target[0][i].narrow(0, 0, 3), src.point("velocity")[row]));
  }
}

TEST(SampleFileTest, TheLoaderCentersABlockByTheWholeSamplesMean) {
  const int64_t n = 2000;
  OneFile data(n);
  LoaderOptions o;
  o.sampling_resolution = 50;
  o.transforms.center = true;
  FieldSpec pressure;
  pressure.name = "pressure";
  o.fields = FieldSchema({pressure});
  o.inputs = InputSpec({{"embedding", InputSource{{"points"}, ""}}});
  const Sample block = data.splits.train->get(0, PointRequest{50, "random", 0, 5, 0});
  const Batch b = make_host_batch(block, o, 1);
  const auto whole_mean = ramp_sample(n).point("points").mean(0, true);
  EXPECT_TRUE(torch::allclose(b.inputs.at("embedding")[0], block.point("points") - whole_mean));
}

}  // namespace
}  // namespace slipstream::aero
