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

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace slipstream {
namespace {

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
// The ranks' heartbeats and failure reports, through the rendezvous store
// on a connection of their own (the backends use the main one).
class RankHealth {
 public:
  RankHealth(const DistributedEnv& env, std::chrono::milliseconds timeout)
      : rank_(env.rank), world_(env.world_size) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env.master_port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = timeout;
    store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    beat();
    thread_ = std::thread([this] { loop(); });
  }
  ~RankHealth() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Collectives this rank has entered: a rank that hangs while alive has
  // entered fewer than the ranks waiting for it.
  void entered_collective() { progress_.fetch_add(1, std::memory_order_relaxed); }

  std::string diagnose(const std::string& what) {
    std::string report;
    std::vector<int> blamed;
    try {
      // An error of this rank's own (a bad sample, the run's lock) is the
      // cause, posted for the others to name: a peer that has not caught up
      // yet is healthy, not hung. A collective that failed says nothing of
      // its own: the peers are looked at.
      if (!is_communication_failure(what)) {
        set(key("failed", rank_), what);
        write_launch_report({rank_}, what);
        return {};
      }
      // A peer that reported its error, or went silent, is named at once; one
      // that looks behind only once it could have gone silent (a killed rank
      // beats for up to kStale more), since a dead rank is not a hung one.
      const auto deadline = std::chrono::steady_clock::now() + kStale + kBeat;
      bool last = false;
      do {
        last = std::chrono::steady_clock::now() >= deadline;
        report = culprits(blamed, /*name_behind=*/last);
        if (!report.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      } while (!last);
    } catch (const std::exception& e) {
      report = "distributed: rank " + std::to_string(rank_) +
               ": the rendezvous store is unreachable too (" + e.what() + ")";
    }
    write_launch_report(blamed, report.empty() ? what : report);
    return report;
  }

 private:
  static constexpr std::chrono::milliseconds kBeat{1000};
  static constexpr std::chrono::milliseconds kStale{3500};

  static std::string key(const char* what, int rank) {
    return std::string("slipstream_health/") + what + "/" + std::to_string(rank);
  }
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  void set(const std::string& k, const std::string& v) {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  }
  std::optional<std::string> get(const std::string& k) {
    std::lock_guard<std::mutex> lock(store_mutex_);
    if (!store_->check({k})) return std::nullopt;
    const auto v = store_->get(k);
    return std::string(v.begin(), v.end());
  }
  void beat() {
    set(key("heartbeat", rank_),
        std::to_string(now_ms()) + "," + std::to_string(progress_.load(std::memory_order_relaxed)));
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, kBeat, [this] { return stop_; })) {
      lock.unlock();
      try {
        beat();
      } catch (const std::exception&) {
        return;  // the store is gone: the failure shows elsewhere
      }
      lock.lock();
    }
  }
  // Under `slipstream launch` (SLIPSTREAM_LAUNCH_REPORTS): the ranks this
  // one blames, on the first line, then the report, for the launcher to name.
  void write_launch_report(const std::vector<int>& blamed, const std::string& report) const {
    const char* dir = std::getenv("SLIPSTREAM_LAUNCH_REPORTS");
    if (dir == nullptr) return;
    const std::string path = std::string(dir) + "/rank_" + std::to_string(rank_);
    if (std::FILE* f = std::fopen(path.c_str(), "w")) {
      for (size_t i = 0; i < blamed.size(); ++i) std::fprintf(f, "%s%d", i ? "," : "", blamed[i]);
      std::fprintf(f, "\n%s\n", report.c_str());
      std::fclose(f);
    }
  }

  // Whether `what` is a collective or the store failing (a peer gone, a
  // timeout) rather than an error of this rank's own.
  static bool is_communication_failure(const std::string& what) {
    std::string lower(what.size(), ' ');
    std::transform(what.begin(), what.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const char* sign : {"timed out", "timeout", "connection", "closed by peer", "broken pipe",
                             "gloo", "nccl", "socket", "c10d", "distbackenderror"}) {
      if (lower.find(sign) != std::string::npos) return true;
    }
    return false;
  }

  // The other ranks to blame: those that reported an error of their own
  // (they said what happened, even if they have exited since), else those
  // whose heartbeat is stale (died or stopped), else, with `name_behind`,
  // those alive but behind the others' progress (hung); empty when every
  // other rank looks healthy.
  std::string culprits(std::vector<int>& blamed, bool name_behind) {
    std::string failed, silent, behind;
    std::vector<int> failed_ranks, silent_ranks, behind_ranks;
    std::vector<std::pair<int, int64_t>> progress;
    int64_t most = progress_.load();
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const auto beat = get(key("heartbeat", r));
      int64_t ms = 0, step = -1;
      if (beat)
        std::sscanf(beat->c_str(), "%lld,%lld", reinterpret_cast<long long*>(&ms),
                    reinterpret_cast<long long*>(&step));
      const double age = beat ? static_cast<double>(now_ms() - ms) / 1000.0 : -1.0;
      if (auto f = get(key("failed", r))) {
        failed += "\n  rank " + std::to_string(r) + " failed: " + *f;
        failed_ranks.push_back(r);
        continue;
      }
      if (beat) {
        progress.emplace_back(r, step);
        most = std::max(most, step);
      }
      if (!beat || age * 1000.0 > static_cast<double>(kStale.count())) {
        char line[160];
        std::snprintf(
            line, sizeof(line), "\n  rank %d stopped responding (%s): it died or hung", r,
            beat ? ("its last heartbeat is " + std::to_string(age).substr(0, 5) + " s old").c_str()
                 : "it never sent a heartbeat");
        silent += line;
        silent_ranks.push_back(r);
      }
    }
    for (const auto& [r, step] : progress) {
      if (step < most &&
          std::find(silent_ranks.begin(), silent_ranks.end(), r) == silent_ranks.end()) {
        behind += "\n  rank " + std::to_string(r) + " is alive but stopped after " +
                  std::to_string(step) + " collectives while others entered " +
                  std::to_string(most) + ": it hung";
        behind_ranks.push_back(r);
      }
    }
    const std::string head = "distributed: rank " + std::to_string(rank_) + " sees:";
    if (!failed.empty()) return blamed = failed_ranks, head + failed;
    if (!silent.empty()) return blamed = silent_ranks, head + silent;
    if (name_behind && !behind.empty()) return blamed = behind_ranks, head + behind;
    return {};
  }

  int rank_, world_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::mutex store_mutex_, mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> progress_{0};
  std::thread thread_;
};

template <class Backend>
class C10dCommunicator final : public Communicator {
 public:
  // Makes the backend over a store, for a rank of a world (the first one
  // and every subgroup's).
  using Factory = std::function<c10::intrusive_ptr<Backend>(const c10::intrusive_ptr<c10d::Store>&,
                                                            int rank, int world)>;

  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, Factory factory, int rank, int world,
                   std::string name, std::unique_ptr<RankHealth> health,
                   const std::string& prefix = "slipstream")
      : store_(std::move(store)),
        factory_(std::move(factory)),
        backend_(factory_(c10::make_intrusive<c10d::PrefixStore>(prefix, store_), rank, world)),
        rank_(rank),
        world_(world),
        name_(std::move(name)),
        prefix_(prefix),
        health_(std::move(health)) {}

  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks) override {
    TORCH_CHECK(!ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
                    std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
                    ranks.front() >= 0 && ranks.back() < world_,
                "distributed: a subgroup needs distinct increasing ranks of 0..", world_ - 1);
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    TORCH_CHECK(it != ranks.end(), "distributed: rank ", rank_,
                " asked for a subgroup it is not in");
    std::string prefix = prefix_ + "/group";
    for (int r : ranks) prefix += "_" + std::to_string(r);
    return std::make_unique<C10dCommunicator<Backend>>(
        store_, factory_, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
        name_, nullptr, prefix);
  }

  std::string diagnose_failure(const std::string& what) override {
    return health_ ? health_->diagnose(what) : std::string();
  }

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
    entered();
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<C10dPending>(backend_->allreduce(ts, opts));
  }

  void broadcast(at::Tensor& t, int root) override {
    entered();
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    backend_->broadcast(ts, opts)->wait();
  }

  void barrier() override {
    entered();
    backend_->barrier()->wait();
  }

 private:
  void entered() {
    if (health_) health_->entered_collective();
  }
  void all_reduce(at::Tensor& t, const c10d::ReduceOp& op) {
    entered();
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op;
    // On CUDA, wait() makes the current stream wait for the collective's
    // stream; the host does not block.
    backend_->allreduce(ts, opts)->wait();
  }

  c10::intrusive_ptr<c10d::Store> store_;  // the rendezvous, unprefixed
  Factory factory_;
  c10::intrusive_ptr<Backend> backend_;
  int rank_;
  int world_;
  std::string name_;
  std::string prefix_;  // this group's keys in the store
  std::unique_ptr<RankHealth> health_;
};

}  // namespace

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
  store_opts.waitWorkers = false;  // the join keys below name a rank that is missing
  store_opts.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "distributed: rank ", env.rank, " could not ",
                store_opts.isServer ? "host" : "reach", " the rendezvous at ", env.master_addr, ":",
                env.master_port, ": ", e.what());
  }
  // Every rank announces itself, then waits for the others: a rank that
  // never comes is named, after one timeout.
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const auto join_key = [](int r) { return "slipstream_join/" + std::to_string(r); };
  std::vector<std::string> joins;
  joins.reserve(static_cast<size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) joins.push_back(join_key(r));
  try {
    store->set(join_key(env.rank), std::vector<uint8_t>{1});
    store->wait(joins, options.timeout);
  } catch (const std::exception& e) {
    std::string missing;
    try {
      for (int r = 0; r < env.world_size; ++r) {
        if (!store->check({join_key(r)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    } catch (const std::exception&) {
      missing = "?";
    }
    TORCH_CHECK(false, "distributed: rank(s) ", missing, " of ", env.world_size,
                " did not join the rendezvous at ", where, " within ",
                std::chrono::duration<double>(options.timeout).count(), " s (this is rank ",
                env.rank, "; each rank needs the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE)");
  }
  auto health = std::make_unique<RankHealth>(env, options.timeout);
  const auto timeout = options.timeout;
  if (device.is_cuda()) {
#ifdef SLIPSTREAM_WITH_NCCL
    auto nccl = [timeout](const c10::intrusive_ptr<c10d::Store>& s, int rank, int world) {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, world, opts);
    };
    return std::make_unique<C10dCommunicator<c10d::ProcessGroupNCCL>>(
        store, nccl, env.rank, env.world_size, "nccl", std::move(health));
#else
    TORCH_CHECK(false, "distributed: this build has no NCCL backend for CUDA tensors");
#endif
  }
#ifdef SLIPSTREAM_WITH_GLOO
  const std::string host = env.master_addr;
  auto gloo = [timeout, host](const c10::intrusive_ptr<c10d::Store>& s, int rank, int world) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(s, rank, world, opts);
  };
  return std::make_unique<C10dCommunicator<c10d::ProcessGroupGloo>>(
      store, gloo, env.rank, env.world_size, "gloo", std::move(health));
#else
  TORCH_CHECK(false, "distributed: this build has no Gloo backend for CPU tensors");
#endif
}

}  // namespace slipstream
