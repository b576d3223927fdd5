// The prefetch loader on a GPU, run by scripts/gpu_check.sh; skipped where no
// GPU is present: a batch's tensors stay what they were while the step's
// kernels still read them, also once the host has dropped the batch and the
// loader's thread copies the next samples on its own stream (each tensor's
// memory is recorded on the stream that uses it).
#include "aero/data/dataset.h"
#include "aero/data/loader.h"
#include "core/device/device.h"
#include "support/cuda_skip.h"
#include "support/recipe_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

namespace slipstream::aero {
namespace {

// Every tensor of a batch, inputs and the others (target, weights, force
// weights) alike.
std::vector<torch::Tensor> tensors_of(const Batch& b) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : b.inputs) out.push_back(t);
  for (const auto& [name, t] : b.others()) {
    if (t->defined()) out.push_back(*t);
  }
  return out;
}

TEST(PrefetchCudaTest, ABatchStaysWhatItWasWhileTheStepStillReadsIt_CUDA) {
  SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  SyntheticOptions so;
  so.kind = "surface";
  so.points_per_sample = 20000;
  const int samples = 6;
  auto dataset = std::make_shared<SyntheticDataset>(so, 0, samples);
  LoaderOptions o;
  o.device = cuda;
  o.inputs = InputSpec({{"embedding", {{"points", "normals"}, ""}}});
  o.fields = testing::surface_field_schema();
  o.weight_field = "area";
  o.force_loss = ForceLossFrame{};
  o.sampling_resolution = 0;  // every cell: each sample's tensors have one size
  o.prefetch = 1;
  o.num_workers = 1;
  std::vector<size_t> order(samples);
  std::iota(order.begin(), order.end(), size_t{0});
  PrefetchLoader loader(dataset, order, o, 1);
  const auto busy = torch::randn({4096, 4096}, cuda) / 64.0;
  Batch batch = loader.next();
  for (int i = 0; i + 1 < samples; ++i) {
    std::vector<torch::Tensor> expected, late;
    for (const auto& t : tensors_of(batch)) expected.push_back(t.cpu());
    // The step's kernels: ~100 ms of work, then a read of every tensor.
    auto x = busy;
    for (int k = 0; k < 40; ++k) x = torch::tanh(x.matmul(busy));
    for (const auto& t : tensors_of(batch)) late.push_back(t.clone());
    // The host lets go of the batch and takes the next; the loader's thread
    // meanwhile copies the sample after it onto the device.
    batch = loader.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    synchronize_device(cuda);
    ASSERT_EQ(late.size(), expected.size());
    for (size_t k = 0; k < late.size(); ++k) {
      EXPECT_TRUE(torch::equal(late[k].cpu(), expected[k]))
          << "batch " << i << ", tensor " << k << " of " << late.size()
          << " changed while the step still read it";
    }
  }
}

}  // namespace
}  // namespace slipstream::aero
