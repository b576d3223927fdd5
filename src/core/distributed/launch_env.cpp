#include "core/distributed/launch_env.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <sstream>

namespace slipstream {
namespace {

using Getter = std::function<const char*(const char*)>;

// The variables of one environment, with the checks every launcher shares.
class Variables {
 public:
  explicit Variables(const Getter& get) : get_(get) {}

  bool has(const char* name) const {
    const char* v = get_(name);
    return v != nullptr && *v != '\0';
  }
  std::string text(const char* name) const { return has(name) ? std::string(get_(name)) : ""; }

  // A non-negative integer; `fallback` when unset.
  int number(const char* name, int fallback) const {
    if (!has(name)) return fallback;
    const char* v = get_(name);
    char* end = nullptr;
    const long parsed = std::strtol(v, &end, 10);
    TORCH_CHECK(end != nullptr && *end == '\0' && parsed >= 0 && parsed < (1L << 30),
                "distributed: environment variable ", name, "='", v,
                "' is not a non-negative integer");
    return static_cast<int>(parsed);
  }
  int required(const char* name, const std::string& why) const {
    TORCH_CHECK(has(name), "distributed: environment variable ", name, " is required ", why);
    return number(name, 0);
  }
  // The first of `names` that is set, or "".
  const char* first_of(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      if (has(n)) return n;
    }
    return "";
  }

 private:
  const Getter& get_;
};

void check_port(const DistributedEnv& env, const char* from) {
  TORCH_CHECK(env.master_port > 0 && env.master_port < 65536, "distributed: ", from, "=",
              env.master_port, " is not a valid port");
}

void check_layout(const DistributedEnv& env, const char* rank_var, const char* world_var) {
  TORCH_CHECK(env.world_size >= 1, "distributed: ", world_var, " must be >= 1");
  TORCH_CHECK(env.rank < env.world_size, "distributed: ", rank_var, "=", env.rank, " is not below ",
              world_var, "=", env.world_size);
  if (env.local_world_size > 0) {
    TORCH_CHECK(env.local_rank < env.local_world_size, "distributed: local rank ", env.local_rank,
                " is not below the ", env.local_world_size, " ranks on this node (", env.launcher,
                ")");
  }
  if (env.num_nodes > 0 && env.node_rank >= 0) {
    TORCH_CHECK(env.node_rank < env.num_nodes, "distributed: node rank ", env.node_rank,
                " is not below the ", env.num_nodes, " nodes (", env.launcher, ")");
  }
}

DistributedEnv from_torchrun(const Variables& v) {
  DistributedEnv env;
  env.launcher = v.has("SLIPSTREAM_LAUNCH_REPORTS") ? "slipstream launch"
                 : v.has("TORCHELASTIC_RUN_ID")     ? "torchrun"
                                                    : "environment";
  env.world_size = v.number("WORLD_SIZE", 1);
  const bool multi = env.world_size > 1;
  env.rank = multi ? v.required("RANK", "when WORLD_SIZE > 1") : v.number("RANK", 0);
  env.local_rank = v.number("LOCAL_RANK", env.rank);
  env.local_world_size = v.number("LOCAL_WORLD_SIZE", multi ? -1 : 1);
  env.node_rank = v.number("GROUP_RANK", multi ? -1 : 0);
  env.num_nodes = v.number("GROUP_WORLD_SIZE", -1);
  if (env.num_nodes < 0 && env.local_world_size > 0 && env.world_size % env.local_world_size == 0) {
    env.num_nodes = env.world_size / env.local_world_size;
  }
  check_layout(env, "RANK", "WORLD_SIZE");
  if (multi) {
    env.master_addr = v.text("MASTER_ADDR");
    TORCH_CHECK(!env.master_addr.empty(),
                "distributed: environment variable MASTER_ADDR is required when WORLD_SIZE > 1");
    env.master_from = "MASTER_ADDR";
    env.master_port = v.required("MASTER_PORT", "when WORLD_SIZE > 1");
    check_port(env, "MASTER_PORT");
  }
  return env;
}

// "4(x2),3" -> {4, 4, 3}; empty on anything else.
std::vector<int> tasks_per_node(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || n < 0) return {};
    long repeat = 1;
    if (*end == '(') {
      if (end[1] != 'x') return {};
      char* close = nullptr;
      repeat = std::strtol(end + 2, &close, 10);
      if (close == end + 2 || *close != ')' || close[1] != '\0' || repeat < 1 || repeat > 65536)
        return {};
    } else if (*end != '\0') {
      return {};
    }
    for (long i = 0; i < repeat; ++i) out.push_back(static_cast<int>(n));
  }
  return out;
}

DistributedEnv from_slurm(const Variables& v) {
  DistributedEnv env;
  env.launcher = "slurm";
  const bool srun = v.has("SLURM_STEP_NUM_TASKS");
  const char* world_var =
      srun ? "SLURM_STEP_NUM_TASKS" : v.first_of({"SLURM_NTASKS", "SLURM_NPROCS"});
  env.world_size = v.number(world_var, 1);
  env.rank = v.number("SLURM_PROCID", 0);
  if (!srun && env.world_size > 1) {
    TORCH_CHECK(false,
                "distributed: this looks like a SLURM job script that ran slipstream "
                "directly (",
                world_var, "=", env.world_size,
                " but no SLURM_STEP_NUM_TASKS: not "
                "started by srun), so only one of its ",
                env.world_size,
                " tasks would run. Start one rank per task with srun: `srun slipstream train "
                "...` (with #SBATCH --ntasks-per-node=<GPUs per node> --gpus-per-task=1), or "
                "start the ranks yourself with `slipstream launch --nproc <GPUs> -- train ...` "
                "under #SBATCH --ntasks-per-node=1; for a single process ask for --ntasks=1");
  }
  env.local_rank = v.number("SLURM_LOCALID", 0);
  env.node_rank = v.number("SLURM_NODEID", 0);
  env.num_nodes =
      v.number(v.first_of({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}), -1);
  const auto per_node =
      tasks_per_node(v.text(v.first_of({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})));
  env.local_world_size = env.node_rank < static_cast<int>(per_node.size())
                             ? per_node[static_cast<size_t>(env.node_rank)]
                             : -1;
  check_layout(env, "SLURM_PROCID", world_var);
  if (env.world_size <= 1) return env;
  if (v.has("MASTER_ADDR")) {
    env.master_addr = v.text("MASTER_ADDR");
    env.master_from = "MASTER_ADDR";
  } else if (const char* list =
                 v.first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
             *list != '\0') {
    const auto hosts = expand_slurm_nodelist(v.text(list));
    env.master_addr = hosts.front();
    env.master_from = std::string("first host of ") + list;
  } else if (v.has("SLURM_LAUNCH_NODE_IPADDR")) {
    env.master_addr = v.text("SLURM_LAUNCH_NODE_IPADDR");
    env.master_from = "SLURM_LAUNCH_NODE_IPADDR";
  }
  TORCH_CHECK(!env.master_addr.empty(), "distributed: SLURM gives ", world_var, "=", env.world_size,
              " but no node list (SLURM_JOB_NODELIST) or "
              "SLURM_LAUNCH_NODE_IPADDR to find rank 0's host: set MASTER_ADDR");
  if (v.has("MASTER_PORT")) {
    env.master_port = v.number("MASTER_PORT", 0);
    check_port(env, "MASTER_PORT");
  } else {
    const char* job = v.first_of({"SLURM_JOB_ID", "SLURM_JOBID"});
    env.master_port = *job != '\0' ? slurm_default_port(v.number(job, 0)) : 29500;
  }
  return env;
}

DistributedEnv from_openmpi(const Variables& v) {
  DistributedEnv env;
  env.launcher = "openmpi";
  env.world_size = v.number("OMPI_COMM_WORLD_SIZE", 1);
  env.rank = v.required("OMPI_COMM_WORLD_RANK", "with OMPI_COMM_WORLD_SIZE");
  env.local_rank = v.number("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  env.local_world_size = v.number("OMPI_COMM_WORLD_LOCAL_SIZE", -1);
  env.node_rank = -1;
  env.num_nodes = -1;
  if (env.local_world_size > 0 && env.world_size % env.local_world_size == 0) {
    env.num_nodes = env.world_size / env.local_world_size;
  }
  check_layout(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  if (env.world_size <= 1) return env;
  env.master_addr = v.text("MASTER_ADDR");
  TORCH_CHECK(!env.master_addr.empty(),
              "distributed: started by mpirun (OMPI_COMM_WORLD_SIZE=", env.world_size,
              ") without MASTER_ADDR; mpirun gives no rendezvous address: pass "
              "rank 0's host, e.g. `mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 "
              "slipstream train ...`");
  env.master_from = "MASTER_ADDR";
  env.master_port = v.number("MASTER_PORT", 29500);
  check_port(env, "MASTER_PORT");
  return env;
}

// "01-04" -> {"01", "02", "03", "04"}; "7" -> {"7"}.
std::vector<std::string> expand_range(const std::string& item, const std::string& list) {
  const auto dash = item.find('-');
  const std::string lo = item.substr(0, dash);
  const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  TORCH_CHECK(digits(lo) && digits(hi), "distributed: SLURM node list '", list, "': '", item,
              "' is not a number or a range a-b");
  const long a = std::stol(lo), b = std::stol(hi);
  TORCH_CHECK(a <= b, "distributed: SLURM node list '", list, "': range ", item, " is empty");
  std::vector<std::string> out;
  for (long i = a; i <= b; ++i) {
    std::string s = std::to_string(i);
    if (s.size() < lo.size()) s.insert(0, lo.size() - s.size(), '0');
    out.push_back(s);
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, size_t limit) {
  std::vector<std::string> hosts;
  // One host expression at a time: text and [ranges] groups, multiplied out.
  std::vector<std::string> expr{""};
  auto finish = [&] {
    TORCH_CHECK(!(expr.size() == 1 && expr[0].empty()), "distributed: SLURM node list '", list,
                "' has an empty host");
    hosts.insert(hosts.end(), expr.begin(), expr.end());
    expr = {""};
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') {
      finish();
    } else if (c == '[') {
      const size_t close = list.find(']', i);
      TORCH_CHECK(close != std::string::npos, "distributed: SLURM node list '", list,
                  "' has an unclosed '['");
      std::vector<std::string> values;
      std::stringstream ss(list.substr(i + 1, close - i - 1));
      std::string item;
      while (std::getline(ss, item, ',')) {
        for (auto& s : expand_range(item, list)) values.push_back(std::move(s));
      }
      TORCH_CHECK(!values.empty(), "distributed: SLURM node list '", list, "' has an empty []");
      TORCH_CHECK(expr.size() * values.size() + hosts.size() <= limit,
                  "distributed: SLURM node list '", list, "' names more than ", limit, " hosts");
      std::vector<std::string> next;
      next.reserve(expr.size() * values.size());
      for (const auto& e : expr) {
        for (const auto& val : values) next.push_back(e + val);
      }
      expr = std::move(next);
      i = close;
    } else {
      TORCH_CHECK(c != ']' && static_cast<unsigned char>(c) > ' ', "distributed: SLURM node list '",
                  list, "' has an unexpected '", c, "'");
      for (auto& e : expr) e.push_back(c);
    }
  }
  finish();
  return hosts;
}

int slurm_default_port(long long job_id) { return 20000 + static_cast<int>(job_id % 10000); }

DistributedEnv DistributedEnv::from_variables(const Getter& get) {
  const Variables v(get);
  if (v.has("WORLD_SIZE") || v.has("RANK")) return from_torchrun(v);
  if (v.has("SLURM_PROCID") &&
      *v.first_of({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}) != '\0') {
    return from_slurm(v);
  }
  if (v.has("OMPI_COMM_WORLD_SIZE")) return from_openmpi(v);
  return {};
}

DistributedEnv DistributedEnv::from_environment() {
  return from_variables([](const char* name) { return std::getenv(name); });
}

std::string DistributedEnv::describe() const {
  if (launcher == "none") return "one process (no launcher variables)";
  std::ostringstream s;
  s << launcher << ": rank " << rank << " of " << world_size;
  std::string node;
  if (node_rank >= 0 && num_nodes > 0) {
    node = "node " + std::to_string(node_rank) + " of " + std::to_string(num_nodes);
  } else if (num_nodes > 0) {
    node = std::to_string(num_nodes) + " nodes";
  }
  std::string local = "local rank " + std::to_string(local_rank);
  if (local_world_size > 0) local += " of " + std::to_string(local_world_size);
  s << " (" << (node.empty() ? "" : node + ", ") << local << ")";
  if (!master_addr.empty()) {
    s << ", rendezvous at " << master_addr << ":" << master_port << " (" << master_from << ")";
  }
  return s.str();
}

}  // namespace slipstream
