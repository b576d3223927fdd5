#include "core/distributed/process_group.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// c10d::Work, declared by the backends too, but needed without either of them.
#include <torch/csrc/distributed/c10d/Work.hpp>

#ifdef SLIPSTREAM_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef SLIPSTREAM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace slipstream {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::string(v);
}

int env_int(const char* name, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    TORCH_CHECK(!required, "distributed: environment variable ", name,
                " is required when WORLD_SIZE > 1");
    return fallback;
  }
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  TORCH_CHECK(end != nullptr && *end == '\0' && parsed >= 0 && parsed < (1L << 30),
              "distributed: environment variable ", name, "='", v,
              "' is not a non-negative integer");
  return static_cast<int>(parsed);
}

class C10dPending final : public PendingCollective {
 public:
  explicit C10dPending(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  void wait() override {
    if (work_) work_->wait();
    work_.reset();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

// Backends that have shutdown() (NCCL in LibTorch 2.x) are shut down
// explicitly, as destroy_process_group() does in Python.
template <class T, class = void>
struct HasShutdown : std::false_type {};
template <class T>
struct HasShutdown<T, std::void_t<decltype(std::declval<T&>().shutdown())>> : std::true_type {};

// Any c10d backend class with the usual collectives: ProcessGroupGloo and
// ProcessGroupNCCL derive from ProcessGroup in LibTorch 1.13 and from
// Backend in 2.x, with the same method signatures.
template <class Backend>
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<Backend> backend,
                   int rank, int world, std::string name)
      : store_(std::move(store)),
        backend_(std::move(backend)),
        rank_(rank),
        world_(world),
        name_(std::move(name)) {}

  ~C10dCommunicator() override {
    if constexpr (HasShutdown<Backend>::value) {
      try {
        backend_->shutdown();
      } catch (const std::exception&) {
        // Destructors never throw; a failed shutdown only leaks at exit.
      }
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend_name() const override { return name_; }

  void all_reduce_sum(at::Tensor& t) override { all_reduce(t, c10d::ReduceOp::SUM); }
  void all_reduce_max(at::Tensor& t) override { all_reduce(t, c10d::ReduceOp::MAX); }

  std::unique_ptr<PendingCollective> all_reduce_sum_async(at::Tensor& t) override {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<C10dPending>(backend_->allreduce(ts, opts));
  }

  void broadcast(at::Tensor& t, int root) override {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    backend_->broadcast(ts, opts)->wait();
  }

  void barrier() override { backend_->barrier()->wait(); }

 private:
  void all_reduce(at::Tensor& t, const c10d::ReduceOp& op) {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op;
    // On CUDA, wait() makes the current stream wait for the collective's
    // stream; the host does not block.
    backend_->allreduce(ts, opts)->wait();
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Backend> backend_;
  int rank_;
  int world_;
  std::string name_;
};

}  // namespace

DistributedEnv DistributedEnv::from_environment() {
  DistributedEnv env;
  env.world_size = env_int("WORLD_SIZE", 1, false);
  TORCH_CHECK(env.world_size >= 1, "distributed: WORLD_SIZE must be >= 1");
  const bool multi = env.world_size > 1;
  env.rank = env_int("RANK", 0, multi);
  env.local_rank = env_int("LOCAL_RANK", env.rank, false);
  TORCH_CHECK(env.rank < env.world_size, "distributed: RANK=", env.rank,
              " is not below WORLD_SIZE=", env.world_size);
  if (multi) {
    env.master_addr = env_or("MASTER_ADDR", "");
    TORCH_CHECK(!env.master_addr.empty(),
                "distributed: environment variable MASTER_ADDR is required when "
                "WORLD_SIZE > 1");
    env.master_port = env_int("MASTER_PORT", 0, true);
    TORCH_CHECK(env.master_port > 0 && env.master_port < 65536,
                "distributed: MASTER_PORT=", env.master_port, " is not a valid port");
  }
  return env;
}

bool has_gloo_backend() {
#ifdef SLIPSTREAM_WITH_GLOO
  return true;
#else
  return false;
#endif
}

bool has_nccl_backend() {
#ifdef SLIPSTREAM_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> init_process_group(const DistributedEnv& env, c10::Device device,
                                                 const ProcessGroupOptions& options) {
  if (env.world_size <= 1) return nullptr;
  c10d::TCPStoreOptions store_opts;
  store_opts.port = static_cast<uint16_t>(env.master_port);
  // Under torchrun the elastic agent already hosts the store on MASTER_PORT
  // and says so; every rank then joins it as a client.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  store_opts.isServer = env.rank == 0 && !use_agent_store;
  store_opts.numWorkers = env.world_size;
  store_opts.waitWorkers = true;
  store_opts.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "distributed: rank ", env.rank, " could not ",
                store_opts.isServer ? "host" : "reach", " the rendezvous at ", env.master_addr, ":",
                env.master_port, ": ", e.what());
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("slipstream", store);
  if (device.is_cuda()) {
#ifdef SLIPSTREAM_WITH_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = options.timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world_size, opts);
    return std::make_unique<C10dCommunicator<c10d::ProcessGroupNCCL>>(store, pg, env.rank,
                                                                      env.world_size, "nccl");
#else
    TORCH_CHECK(false, "distributed: this build has no NCCL backend for CUDA tensors");
#endif
  }
#ifdef SLIPSTREAM_WITH_GLOO
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, opts);
  return std::make_unique<C10dCommunicator<c10d::ProcessGroupGloo>>(store, pg, env.rank,
                                                                    env.world_size, "gloo");
#else
  TORCH_CHECK(false, "distributed: this build has no Gloo backend for CPU tensors");
#endif
}

}  // namespace slipstream
