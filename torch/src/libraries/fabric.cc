#include "chorus/fabric.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "chorus/accelerate.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/supervisor.h"
#include "chorus/core/tcp_store.h"
#include "chorus/lightning.h"
#include "parallel/collections/collective.h"
#include "parallel/objects/collective.h"

namespace chorus {

using detail::concat;

namespace {

// Note [Fabric::launch]: the ranks launch() started, supervised from a thread of rank 0 until
// the process exits. A child that fails is named on stderr and the other children are stopped;
// rank 0's pending or next collective then raises PeerFailure. At exit rank 0 waits for its
// children, and exits with code 1 if any of them failed.
struct Children {
  std::unique_ptr<TcpStoreServer> store;
  std::unique_ptr<Supervisor> supervisor;
  std::thread watcher;
  std::optional<WorkerExit> failure;
};
Children& children() {
  static Children c;
  return c;
}

void wait_for_children() {
  auto& kids = children();
  if (kids.watcher.joinable()) kids.watcher.join();
  kids.supervisor.reset();
  kids.store.reset();
  if (kids.failure) {
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
  auto env_of = [&, run_id = concat("fabric-", getpid())](int rank) {
    return launcher_environment(single_node(rank, n, kids.store->port(), run_id));
  };
  auto args = own_arguments();
  args.at(0) = "/proc/self/exe";  // the same binary, wherever it was started from
  std::vector<WorkerSpec> specs;
  for (int rank = 1; rank < n; ++rank) specs.push_back({rank, args, env_of(rank)});
  SupervisorOptions options;
  options.capture_output = false;
  options.name = "Fabric::launch";
  kids.supervisor = std::make_unique<Supervisor>(options);
  kids.supervisor->start(specs);
  kids.watcher = std::thread([&kids] {
    kids.failure = kids.supervisor->wait();
    if (!kids.failure) return;
    const std::string what = kids.supervisor->describe_failures();
    std::fprintf(stderr, "[chorus] Fabric::launch: %s; stopped the other ranks\n", what.c_str());
    try {  // rank 0 may still be meeting the others: tell it
      TcpStore client("127.0.0.1", kids.store->port(), std::chrono::seconds(5));
      abort_rendezvous(client, kids.failure->rank, what);
    } catch (const std::exception&) {
    }
  });
  std::atexit(wait_for_children);
  for (const auto& [k, v] : env_of(0)) setenv(k.c_str(), v.c_str(), 1);
  return Environment::detect();
}

}  // namespace

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {
  if (options_.accelerator != "cpu" && options_.accelerator != "auto")
    throw InvalidArgument(concat("Fabric: accelerator '", options_.accelerator,
                                 "' is not available: this build of chorus drives CPUs (use \"cpu\")"));
  if (options_.strategy != "ddp" && options_.strategy != "auto" && options_.strategy != "fsdp")
    throw InvalidArgument(
        concat("Fabric: strategy '", options_.strategy, "' is not supported (use \"ddp\" or \"fsdp\")"));
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
  return detail::broadcast_value(
             world(), src, [&] { return c10::IValue(t); }, "Fabric::broadcast")
      .toTensor();
}

c10::IValue Fabric::broadcast(const c10::IValue& obj, int src) {
  return detail::broadcast_value(
      world(), src, [&] { return obj; }, "Fabric::broadcast");
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

bool Fabric::set_up(const std::shared_ptr<torch::nn::Module>& module) const {
  for (auto& w : wrapped_)
    if (w->module_ptr() == module) return true;
  for (auto& w : sharded_)
    if (w->module_ptr() == module) return true;
  return false;
}

DistributedDataParallel& Fabric::setup(std::shared_ptr<torch::nn::Module> module, DDPOptions options) {
  if (!is_initialized()) throw InvalidArgument("Fabric::setup: call fabric.launch() first");
  if (options_.strategy == "fsdp")
    throw InvalidArgument(
        "Fabric::setup: under strategy \"fsdp\" call fabric.setup_module(module): it returns the "
        "ShardedDataParallel, whose parameters() the optimizer takes");
  if (set_up(module))
    throw InvalidArgument("Fabric::setup: this module is already set up; use the wrapper it returned");
  wrapped_.push_back(std::make_unique<DistributedDataParallel>(std::move(module), std::move(options)));
  return *wrapped_.back();
}

DistributedDataParallel& Fabric::setup(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer&,
                                       DDPOptions options) {
  return setup(std::move(module), std::move(options));
}

NoSyncGuard Fabric::no_backward_sync(DistributedDataParallel& module, bool enabled) {
  for (auto& w : wrapped_)
    if (w.get() == &module) return NoSyncGuard(enabled ? &module : nullptr);
  throw InvalidArgument(
      "Fabric::no_backward_sync: this module was not set up by this Fabric: call fabric.setup(module) first");
}

ShardedDataParallel& Fabric::setup_module(std::shared_ptr<torch::nn::Module> module, ShardedOptions options) {
  if (!is_initialized()) throw InvalidArgument("Fabric::setup_module: call fabric.launch() first");
  if (!module) throw InvalidArgument("Fabric::setup_module: the module is null");
  if (set_up(module))
    throw InvalidArgument("Fabric::setup_module: this module is already set up; use the object it returned");
  if (options_.strategy != "fsdp") options.strategy = ShardingStrategy::NoShard;
  sharded_.push_back(std::make_unique<ShardedDataParallel>(std::move(module), std::move(options)));
  return *sharded_.back();
}

NoSyncGuard Fabric::no_backward_sync(ShardedDataParallel& module, bool enabled) {
  for (auto& w : sharded_)
    if (w.get() == &module) return NoSyncGuard(enabled ? &module : nullptr);
  throw InvalidArgument(
      "Fabric::no_backward_sync: this module was not set up by this Fabric: call fabric.setup_module(module) first");
}

NoSyncGuard Fabric::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  for (auto& w : wrapped_)
    if (&w->module() == &module) return NoSyncGuard(enabled ? w.get() : nullptr);
  for (auto& w : sharded_)
    if (&w->module() == &module) return NoSyncGuard(enabled ? w.get() : static_cast<ShardedDataParallel*>(nullptr));
  throw InvalidArgument(
      "Fabric::no_backward_sync: this module was not set up by this Fabric: call fabric.setup(module) first");
}

void Fabric::save(const std::string& path, const CheckpointState& state, CheckpointFormat format) {
  save_checkpoint(path, state, SaveOptions{format, nullptr});
}

c10::impl::GenericDict Fabric::load(const std::string& path, const CheckpointState& state, bool strict) {
  return load_checkpoint(path, state, LoadOptions{strict, nullptr});
}

}  // namespace chorus
