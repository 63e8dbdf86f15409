#include "chorus/fabric.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "chorus/collections.h"
#include "chorus/core/tcp_store.h"
#include "chorus/lightning.h"
#include "objects.h"
#include "structured.h"

namespace chorus {

using detail::concat;

namespace {

// Note [Fabric::launch]: what launch() started, kept until the process exits.
struct Children {
  std::unique_ptr<TcpStoreServer> store;
  std::vector<pid_t> pids;
};
Children& children() {
  static Children c;
  return c;
}

// At exit of the parent: wait for the ranks it started; a failed one makes the exit code 1.
void wait_for_children() {
  bool failed = false;
  for (size_t i = 0; i < children().pids.size(); ++i) {
    int status = 0;
    if (waitpid(children().pids[i], &status, 0) < 0) continue;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    failed = true;
    if (WIFSIGNALED(status))
      std::fprintf(stderr, "[chorus] rank %zu (pid %d) was killed by %s\n", i + 1, children().pids[i],
                   strsignal(WTERMSIG(status)));
    else
      std::fprintf(stderr, "[chorus] rank %zu (pid %d) exited with code %d\n", i + 1, children().pids[i],
                   WEXITSTATUS(status));
  }
  children().store.reset();
  if (failed) {
    std::fflush(nullptr);
    _exit(1);
  }
}

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t at = 0;
  while (at < all.size()) {
    size_t end = all.find('\0', at);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(at, end - at));
    at = end + 1;
  }
  return args;
}

// Starts local ranks 1..n-1 as copies of this program; returns rank 0's environment.
Environment spawn_local_ranks(int n) {
  auto& kids = children();
  kids.store = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const int port = kids.store->port();
  const std::string run_id = concat("fabric-", getpid());
  auto set_env = [&](int rank) {
    const std::string r = std::to_string(rank), w = std::to_string(n), p = std::to_string(port);
    for (auto [k, v] : {std::pair{"RANK", r}, {"LOCAL_RANK", r}, {"WORLD_SIZE", w}, {"LOCAL_WORLD_SIZE", w},
                        {"GROUP_RANK", std::string("0")}, {"NODE_RANK", std::string("0")},
                        {"MASTER_ADDR", std::string("127.0.0.1")}, {"MASTER_PORT", p},
                        {"CHORUS_LAUNCHER", std::string("chorusrun")}, {"CHORUS_STORE_ADDR", std::string("127.0.0.1")},
                        {"CHORUS_STORE_PORT", p}, {"CHORUS_RUN_ID", run_id}})
      setenv(k, v.c_str(), 1);
  };
  const auto args = own_arguments();
  const pid_t parent = getpid();
  std::fflush(nullptr);
  for (int rank = 1; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw Error(concat("Fabric::launch: fork failed: ", std::strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      set_env(rank);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "[chorus] Fabric::launch: cannot start rank %d: %s\n", rank, std::strerror(errno));
      _exit(127);
    }
    kids.pids.push_back(pid);
  }
  std::atexit(wait_for_children);
  set_env(0);
  return Environment::detect();
}

}  // namespace

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {
  if (options_.accelerator != "cpu" && options_.accelerator != "auto")
    throw InvalidArgument(concat("Fabric: accelerator '", options_.accelerator,
                                 "' is not available: this build of chorus drives CPUs (use \"cpu\")"));
  if (options_.strategy != "ddp" && options_.strategy != "auto")
    throw InvalidArgument(concat("Fabric: strategy '", options_.strategy, "' is not supported (use \"ddp\")"));
  if (options_.devices < 1) throw InvalidArgument(concat("Fabric: devices must be >= 1, not ", options_.devices));
  if (options_.num_nodes < 1) throw InvalidArgument(concat("Fabric: num_nodes must be >= 1, not ", options_.num_nodes));
  env_ = Environment::detect();
}

void Fabric::launch() {
  if (!is_initialized()) {
    if (env_.launcher == Launcher::Single && options_.devices > 1) {
      if (options_.num_nodes > 1)
        throw InvalidArgument("Fabric::launch: num_nodes > 1 needs a launcher on every node (chorusrun, srun, mpirun)");
      env_ = spawn_local_ranks(options_.devices);
    }
    init_process_group(env_, InitOptions{options_.backend, options_.timeout});
  }
  env_ = environment();
}

ProcessGroup& Fabric::world() const { return *default_group(); }

int Fabric::global_rank() const { return is_initialized() ? world().rank() : env_.rank; }
int Fabric::local_rank() const { return env_.local_rank; }
int Fabric::node_rank() const { return env_.node_rank; }
int Fabric::world_size() const { return is_initialized() ? world().size() : env_.world_size; }

void Fabric::barrier(const std::string& name) {
  try {
    world().barrier();
  } catch (const TimeoutError& e) {
    if (name.empty()) throw;
    throw TimeoutError(concat("barrier '", name, "': ", e.what()), e.missing_ranks(), e.operation());
  }
}

at::Tensor Fabric::broadcast(const at::Tensor& t, int src) {
  return detail::broadcast_value(world(), src, [&] { return c10::IValue(t); }, "Fabric::broadcast").toTensor();
}

c10::IValue Fabric::broadcast(const c10::IValue& obj, int src) {
  return detail::broadcast_value(world(), src, [&] { return obj; }, "Fabric::broadcast");
}

at::Tensor Fabric::all_gather(const at::Tensor& t, std::shared_ptr<ProcessGroup> group, bool sync_grads) {
  if (sync_grads) return all_gather_with_grad(t, group);
  return group_or_default(group).all_gather(t);
}

c10::IValue Fabric::all_gather(const c10::IValue& data, std::shared_ptr<ProcessGroup> group, bool sync_grads) {
  if (data.isTensor()) return all_gather(data.toTensor(), group, sync_grads);
  if (sync_grads)
    return recursively_apply([&](const at::Tensor& t) -> c10::IValue { return all_gather_with_grad(t, group); }, data);
  return detail::all_gather_collection(group_or_default(group), data, "Fabric::all_gather");
}

at::Tensor Fabric::all_reduce(const at::Tensor& t, std::shared_ptr<ProcessGroup> group, ReduceOp op) {
  at::Tensor out = t.clone(at::MemoryFormat::Contiguous);
  group_or_default(group).all_reduce_(out, op);
  return out;
}

at::Tensor Fabric::all_reduce(const at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op) {
  return all_reduce(t, std::move(group), parse_reduce_op(op));
}

c10::IValue Fabric::all_reduce(const c10::IValue& data, std::shared_ptr<ProcessGroup> group, ReduceOp op) {
  if (data.isTensor()) return all_reduce(data.toTensor(), group, op);
  return detail::all_reduce_collection(group_or_default(group), data, op, "Fabric::all_reduce");
}

c10::IValue Fabric::all_reduce(const c10::IValue& data, std::shared_ptr<ProcessGroup> group, std::string_view op) {
  return all_reduce(data, std::move(group), parse_reduce_op(op));
}

at::Tensor Fabric::to_device(const at::Tensor& t) const { return t.to(device()); }
c10::IValue Fabric::to_device(const c10::IValue& data) const { return send_to_device(data, device()); }

ProcessGroup& Fabric::node_group() {
  if (node_) return *node_;
  ProcessGroup& w = world();
  int64_t mine = env_.node_rank;
  std::vector<int64_t> nodes(size_t(w.size()));
  w.communicator().all_gather(&mine, nodes.data(), 1, DataType::Int64);
  for (int64_t node : std::set<int64_t>(nodes.begin(), nodes.end())) {
    std::vector<int> ranks;
    for (int r = 0; r < w.size(); ++r)
      if (nodes[size_t(r)] == node) ranks.push_back(r);
    if (auto g = w.split(ranks)) node_ = g;
  }
  return *node_;
}

void Fabric::rank_zero_first(const std::function<void()>& fn, bool local) {
  ProcessGroup& g = local ? node_group() : world();
  detail::leaders_first(g, g.rank() == 0, fn, local ? "rank_zero_first(local)" : "rank_zero_first");
}

}  // namespace chorus
