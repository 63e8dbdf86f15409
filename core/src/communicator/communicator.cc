// The Communicator's public surface: each call is described once as a Call and takes the one path
// in run(). The jobs behind it live beside this file: arguments.cc validates, ordering.cc orders,
// hierarchy.cc runs all_reduce across hosts, backend_table.cc picks the backend (docs/tour.md).
#include "chorus/core/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "backend.h"
#include "call_compare.h"
#include "chorus/core/environment.h"
#include "chorus/core/error.h"
#include "chorus/core/prefix_store.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/settings.h"
#include "communicator/arguments.h"
#include "communicator/call_lock.h"
#include "communicator/hierarchy.h"
#include "communicator/ordering.h"
#include "shm/waiter.h"

namespace chorus {
namespace {

std::string host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + " " + boot;
}

// This process's rank in its whole job, as its launcher gave it (-1: none given).
int job_rank() {
  try {
    const Environment env = Environment::detect();
    return env.launcher == Launcher::Single ? -1 : env.rank;
  } catch (const Error&) {
    return -1;
  }
}

std::vector<uint64_t> counts_of(const std::vector<size_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommunicatorOptions options) {
  if (!store) throw InvalidArgument("Communicator::create: the store is null");
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(detail::concat("Communicator::create: rank ", rank, " is not in [0, ", size, ")"));
  if (settings().timeout) options.timeout = *settings().timeout;
  options.shm = options.shm.or_else(settings().shm);
  options.cross = options.cross.or_else(settings().cross);
  const bool automatic = options.backend == "auto" && settings().backend == "auto";
  auto comm = std::shared_ptr<Communicator>(new Communicator(std::move(store), rank, size, std::move(options)));
  if (automatic && comm->host_count() > 1)
    comm->hierarchy_ = Hierarchy::build(*comm, comm->hosts_, comm->backend_->name());
  return comm;
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, CommunicatorOptions options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      order_(std::make_unique<CallOrder>(size)),
      call_lock_(std::make_unique<CallLock>()) {
  // Every rank creates its communicators in the same order, so a per-rank counter names this
  // group's keys identically everywhere and a re-created group never sees stale keys.
  const int64_t generation = store->add(detail::concat("chorus/", options_.name, "/created_by/", rank), 1);
  store_ = std::make_shared<PrefixStore>(detail::concat("chorus/", options_.name, "/", generation), store);

  const std::string backend = options_.backend == "auto" ? settings().backend : options_.backend;
  check_backend_name(backend, options_.name);
  const auto deadline = Clock::now() + options_.timeout;
  std::string elsewhere;  // the ranks on other hosts
  bool place = false;     // Note [Ranks placed, not bound]: whether this rank moves onto its share of the CPUs
  int sharing = 0;        // ranks on this kernel
  int before_me = 0;      // of them before this one
  if (size_ > 1) {
    // Each rank publishes its host (name and boot id: which ranks share memory), its rank in the
    // job, so that messages about a peer of a subgroup say which process of the job it is, and the
    // CPUs it may run on (Note [Ranks sharing the cores]).
    const std::string me = host_identity(), my_cpus = shm::usable_cpu_list();
    store_->set(detail::concat("host/", rank_), detail::concat(me, "\n", job_rank(), "\n", my_cpus));
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(detail::concat("host/", r));
    // Wait in slices, listening between them for a launcher that gave up on the job.
    for (;;) {
      try {
        store_->wait(keys, std::min<std::chrono::milliseconds>(std::chrono::seconds(1), options_.timeout));
        break;
      } catch (const StoreError&) {
        if (auto aborted = rendezvous_aborted(*store))
          throw PeerFailure(detail::concat("group '", options_.name, "': rank ", rank_,
                                           " stopped waiting for the others to join: ", aborted->second),
                            aborted->first);
        if (Clock::now() < deadline) continue;
      }
      std::vector<int> absent;
      for (int r = 0; r < size_; ++r)
        if (!store_->check({keys[size_t(r)]})) absent.push_back(r);
      throw TimeoutError(
          detail::concat("group '", options_.name, "': rank ", rank_, " waited ", options_.timeout.count(),
                         " ms for ranks ", list_ranks(absent), " to join; did every rank create the group?"),
          absent, "init");
    }
    const std::string boot = me.substr(me.find(' ') + 1);
    std::set<int> shared_cpus;  // the CPUs the ranks on this kernel may use between them
    bool one_mask = true;       // whether they all may use the same CPUs
    for (int r = 0; r < size_; ++r) {
      const std::string value = store_->get(keys[size_t(r)]);
      std::string other = value.substr(0, value.find('\n'));
      const std::string host = other.substr(0, other.find(' '));
      int global = -1;
      try {
        global = std::stoi(value.substr(value.find('\n') + 1));
      } catch (const std::exception&) {
      }
      if (other != me) elsewhere += detail::concat(elsewhere.empty() ? "" : ", ", r, " (", host, ")");
      rank_names_.push_back(global >= 0 && !(global == r && options_.name == "world")
                                ? detail::concat("rank ", r, " (global rank ", global, " on ", host, ")")
                                : detail::concat("rank ", r, " (on ", host, ")"));
      // Note [Ranks sharing the cores]: hosts on this machine's kernel (same boot id) share its cores.
      if (!boot.empty() && other.substr(other.find(' ') + 1) == boot) {
        ++sharing;
        if (r < rank_) ++before_me;
        const size_t cpus_at = value.find('\n', value.find('\n') + 1);
        one_mask = one_mask && cpus_at != std::string::npos && value.substr(cpus_at + 1) == my_cpus;
        if (cpus_at != std::string::npos)
          for (int cpu : shm::parse_cpu_list(value.substr(cpus_at + 1))) shared_cpus.insert(cpu);
      }
      hosts_.push_back(std::move(other));
    }
    if (sharing > 0) shm::note_ranks_sharing_cores(sharing, int(shared_cpus.size()));
    place = sharing > 1 && one_mask;
  }
  BackendOptions bo;
  bo.group_name = options_.name;
  bo.rank_names = rank_names_;
  bo.shm = options_.shm;
  bo.cross = options_.cross;
  bo.deadline = deadline;
  backend_ = choose_backend(backend, elsewhere, options_.name).make(*store_, rank_, size_, bo);
  // After the backend's rendezvous: the scheduler places a rank anew as it wakes from each wait there.
  if (place) shm::place_once(before_me, sharing);
  if (settings().log_level >= 1 && rank_ == 0)
    std::fprintf(stderr, "[chorus] group '%s': %d ranks on backend %s\n", options_.name.c_str(), size_,
                 backend_->name().c_str());
}

Communicator::~Communicator() {
  order_.reset();  // submitted work first: it uses the backend
  if (aborted_.load()) return;
  try {
    backend_->finish(coarse_now() + std::min<Clock::duration>(options_.timeout, kFinishOnDestroy));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[chorus] rank %d: group '%s' destroyed after an unfinished call: %s\n", rank_,
                 options_.name.c_str(), e.what());
  }
}

void Communicator::shutdown(Timeout timeout) {
  order_->drain();                              // submitted collectives
  order_->wait_transfers();                     // sends and receives in flight: they may still be owed to a peer
  std::lock_guard<CallLock> lock(*call_lock_);  // no collective runs while the owed wait is paid
  if (aborted_.load()) return;                  // already shut down or failed: nothing is owed
  std::exception_ptr found;
  try {
    backend_->finish(coarse_now() + timeout.value_or(options_.timeout));
  } catch (const Error&) {
    found = std::current_exception();
  }
  {
    // Later calls fail at once. Peers are not told: this rank left in order (~ShmGroup marks it
    // as left when the communicator goes).
    std::lock_guard<std::mutex> state(state_mu_);
    if (!failed_) {
      failed_ = found ? found
                      : std::make_exception_ptr(
                            Error(detail::concat("group '", options_.name, "' was shut down on rank ", rank_)));
      aborted_.store(true, std::memory_order_release);
    }
  }
  if (found) std::rethrow_exception(found);
}

std::string Communicator::describe_rank(int rank) const {
  if (rank >= 0 && size_t(rank) < rank_names_.size()) return rank_names_[size_t(rank)];
  return detail::concat("rank ", rank);
}

std::string Communicator::backend_name() const { return hierarchy_ ? hierarchy_->name() : backend_->name(); }

int Communicator::host_count() const {
  std::set<std::string> distinct(hosts_.begin(), hosts_.end());
  return std::max<int>(1, int(distinct.size()));
}

void Communicator::run(Call& call, Timeout timeout) {
  validate_arguments(call, rank_, size_, options_.name);
  if (point_to_point(call.kind)) return order_->in_turn(order_->take_tickets(call), [&] { execute(call, timeout); });
  order_->drain();
  std::lock_guard<CallLock> lock(*call_lock_);
  if (hierarchy_ && hierarchy_->serves(call)) return hierarchy_->run(call, timeout);
  execute(call, timeout);
}

std::shared_ptr<Work> Communicator::run_async(Call call, Timeout timeout, AsyncOptions async, int* source) {
  validate_arguments(call, rank_, size_, options_.name);
  call.source = source;
  return order_->in_turn_async(
      call, [this, call, timeout]() mutable { execute(call, timeout); }, std::move(async));
}

template <class Body>
void Communicator::execute_with(Call& call, Timeout timeout, Body&& body) {
  if (aborted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(state_mu_);
    std::rethrow_exception(failed_);
  }
  call.start = coarse_now();
  call.deadline = call.start + timeout.value_or(options_.timeout);
  try {
    body();
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error&) {
    fail(std::current_exception());
    throw;
  }
}

void Communicator::execute(Call& call, Timeout timeout) {
  execute_with(call, timeout, [&] { backend_->run(call); });
}

void Communicator::abort(const std::string& why) {
  fail(std::make_exception_ptr(
      PeerFailure(detail::concat("group '", options_.name, "' on rank ", rank_, ": ", why), -1)));
}

void Communicator::fail(const std::exception_ptr& error) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (failed_) return;
    failed_ = error;
    aborted_.store(true, std::memory_order_release);
  }
  // Outside the lock, the subgroups first: aborting wakes this rank's waits at once, but telling
  // the peers goes through the store, which may take seconds when its host is gone; the threads
  // woken come back here (a hierarchy step's failure too) and raise failed_.
  if (hierarchy_) hierarchy_->fail(error);
  backend_->abort(error);
}

void Communicator::all_reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, Timeout timeout) {
  Call c{.kind = OpKind::AllReduce, .dtype = dtype, .op = op, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::broadcast(void* buf, size_t count, DataType dtype, int root, Timeout timeout) {
  Call c{.kind = OpKind::Broadcast, .dtype = dtype, .root = root, .count = count, .out = buf};
  run(c, timeout);
}

void Communicator::reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
                          Timeout timeout) {
  Call c{.kind = OpKind::Reduce, .dtype = dtype, .op = op, .root = root, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::all_gather(const void* in, void* out, size_t count, DataType dtype, Timeout timeout) {
  Call c{.kind = OpKind::AllGather, .dtype = dtype, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::all_gather_to(const void* in, const std::vector<void*>& outs, size_t count, DataType dtype,
                                 Timeout timeout) {
  Call c{.kind = OpKind::AllGather, .dtype = dtype, .count = count, .in = in, .outs = outs};
  run(c, timeout);
}

void Communicator::all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                                Timeout timeout) {
  Call c{.kind = OpKind::AllGatherV, .dtype = dtype, .in = in, .out = out, .counts = counts_of(counts)};
  run(c, timeout);
}

void Communicator::gather(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout) {
  Call c{.kind = OpKind::Gather, .dtype = dtype, .root = root, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, int root,
                            Timeout timeout) {
  Call c{.kind = OpKind::GatherV, .dtype = dtype, .root = root, .in = in, .out = out, .counts = counts_of(counts)};
  run(c, timeout);
}

void Communicator::scatter(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout) {
  Call c{.kind = OpKind::Scatter, .dtype = dtype, .root = root, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                                  Timeout timeout) {
  Call c{.kind = OpKind::ReduceScatter, .dtype = dtype, .op = op, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::all_to_all(const void* in, void* out, size_t count, DataType dtype, Timeout timeout) {
  Call c{.kind = OpKind::AllToAll, .dtype = dtype, .count = count, .in = in, .out = out};
  run(c, timeout);
}

void Communicator::all_to_all_v(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DataType dtype, Timeout timeout) {
  Call c{.kind = OpKind::AllToAllV,
         .dtype = dtype,
         .in = in,
         .out = out,
         .counts = counts_of(send_counts),
         .recv_counts = counts_of(recv_counts)};
  run(c, timeout);
}

void Communicator::send(const void* buf, size_t count, DataType dtype, int dst, int tag, Timeout timeout) {
  Call c{.kind = OpKind::Send, .dtype = dtype, .root = dst, .tag = tag, .count = count, .in = buf};
  run(c, timeout);
}

void Communicator::recv(void* buf, size_t count, DataType dtype, int src, int tag, Timeout timeout) {
  Call c{.kind = OpKind::Recv, .dtype = dtype, .root = src, .tag = tag, .count = count, .out = buf};
  run(c, timeout);
}

int Communicator::recv_any(void* buf, size_t count, DataType dtype, int tag, Timeout timeout) {
  int source = -1;
  Call c{
      .kind = OpKind::RecvAny, .dtype = dtype, .root = -1, .tag = tag, .count = count, .out = buf, .source = &source};
  run(c, timeout);
  return source;
}

std::shared_ptr<Work> Communicator::send_async(const void* buf, size_t count, DataType dtype, int dst, int tag,
                                               Timeout timeout, AsyncOptions async) {
  return run_async({.kind = OpKind::Send, .dtype = dtype, .root = dst, .tag = tag, .count = count, .in = buf}, timeout,
                   std::move(async));
}

std::shared_ptr<Work> Communicator::recv_async(void* buf, size_t count, DataType dtype, int src, int tag,
                                               Timeout timeout, AsyncOptions async) {
  return run_async({.kind = OpKind::Recv, .dtype = dtype, .root = src, .tag = tag, .count = count, .out = buf}, timeout,
                   std::move(async));
}

std::shared_ptr<Work> Communicator::recv_any_async(void* buf, size_t count, DataType dtype, int* source, int tag,
                                                   Timeout timeout, AsyncOptions async) {
  return run_async({.kind = OpKind::RecvAny, .dtype = dtype, .root = -1, .tag = tag, .count = count, .out = buf},
                   timeout, std::move(async), source);
}

void Communicator::barrier(Timeout timeout) {
  Call c{.kind = OpKind::Barrier};
  run(c, timeout);
}

std::shared_ptr<Work> Communicator::submit(std::function<void()> collectives, AsyncOptions async) {
  return order_->submit(std::move(collectives), std::move(async));
}

SymmetricMemory Communicator::alloc_symmetric(size_t bytes, Timeout timeout) {
  Call c{.kind = OpKind::AllocSymmetric, .count = bytes};
  order_->drain();
  std::lock_guard<CallLock> lock(*call_lock_);
  SymmetricMemory made;
  execute_with(c, timeout, [&] { made = backend_->alloc_symmetric(c); });
  return made;
}

void Communicator::reject(const std::string& operation, const std::string& why, Timeout timeout) {
  Call c{.kind = OpKind::Barrier};
  c.invalid = detail::concat(operation, " on group '", name(), "' (rank ", rank_, "): ", why);
  run(c, timeout);
  throw InvalidArgument(c.invalid);  // the backend threw already; this keeps [[noreturn]] honest
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks, Timeout timeout) {
  return split_as(ranks, options_.backend, timeout);
}

std::shared_ptr<Communicator> Communicator::split_as(const std::vector<int>& ranks, const std::string& backend,
                                                     Timeout timeout, const std::optional<CrossOptions>& cross) {
  Call c{.kind = OpKind::Split, .count = ranks.size(), .counts = {ranks.begin(), ranks.end()}};
  run(c, timeout);
  const int generation = ++splits_;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  std::shared_ptr<Communicator> made;
  if (it != ranks.end()) {
    CommunicatorOptions child = options_;
    child.name = detail::concat(options_.name, "/", generation);
    child.backend = backend;
    if (cross) child.cross = *cross;
    made = create(store_, int(it - ranks.begin()), int(ranks.size()), child);
  }
  barrier(timeout);  // the members are done with the store
  return made;
}

}  // namespace chorus
