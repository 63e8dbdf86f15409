#include "chorus/core/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include "backend.h"
#include "call_check.h"
#include "engine/engine.h"
#include "chorus/core/error.h"
#include "chorus/core/prefix_store.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/settings.h"

namespace chorus {

std::vector<std::string> available_backends() {
  std::vector<std::string> v{"auto", "shm"};
#if CHORUS_HAVE_GLOO
  v.push_back("gloo");
#endif
#if CHORUS_HAVE_MPI
  v.push_back("mpi");
#endif
  return v;
}

SymmetricMemory private_memory(size_t bytes) {
  if (bytes == 0) return {};
  constexpr std::align_val_t kAlign{64};
  std::shared_ptr<void> owner(::operator new(bytes, kAlign), [kAlign](void* p) { ::operator delete(p, kAlign); });
  std::memset(owner.get(), 0, bytes);
  return SymmetricMemory(owner, owner.get(), bytes);
}

SymmetricMemory Backend::alloc_symmetric(const Call& call) {
  Call check = call;
  check.check_only = true;
  run(check);
  return private_memory(size_t(call.count));
}

namespace {

std::string host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + " " + boot;
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

// Collects the first problem with a call's arguments, in words that say what to do.
class Checker {
 public:
  Checker(Call& c, const Communicator& comm) : c_(c), comm_(comm) {}
  Checker(const Checker&) = delete;
  void fail(const std::string& why) {
    if (c_.invalid.empty())
      c_.invalid = detail::concat(describe(c_), " on group '", comm_.name(), "' (rank ", comm_.rank(), "): ", why);
  }
  void dtype() {
    if (uint8_t(c_.dtype) > uint8_t(DataType::Bool)) fail(detail::concat("unknown dtype code ", int(c_.dtype)));
  }
  void op() {
    if (uint8_t(c_.op) > uint8_t(ReduceOp::BitwiseXor)) return fail("unknown reduce op");
    if (auto why = reduce_op_problem(c_.dtype, c_.op); !why.empty()) fail(why);
  }
  void rank(int r, const char* role) {
    if (r < 0 || r >= comm_.size())
      fail(detail::concat(role, " ", r, " is not a rank of this group (size ", comm_.size(), ")"));
  }
  void buffer(const void* p, size_t elems, const char* name) {
    if (!p && elems) fail(detail::concat(name, " is null but must hold ", elems, " elements"));
  }
  // Buffer a may start exactly `a_at` elements into buffer b (the in-place form; none when
  // nullopt), or be disjoint from it. Skipped once an earlier check failed: the dtype may be
  // unknown, and the call must still reach the others (Note [Call check]).
  void aliasing(const void* a, size_t a_elems, const void* b, size_t b_elems, std::optional<size_t> a_at) {
    if (!c_.invalid.empty()) return;
    const size_t es = element_size(c_.dtype);
    if (a_at && a == static_cast<const uint8_t*>(b) + *a_at * es) return;
    if (overlaps(a, a_elems * es, b, b_elems * es))
      fail("input and output overlap: pass disjoint buffers, or use the documented in-place form");
  }
  void counts(const std::vector<size_t>& v, const char* name) {
    if (v.size() != size_t(comm_.size()))
      fail(detail::concat(name, " has ", v.size(), " entries but the group has ", comm_.size(), " ranks"));
  }

 private:
  Call& c_;
  const Communicator& comm_;
};

size_t sum(const std::vector<size_t>& v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

Call make(OpKind kind, DataType dtype, size_t count) {
  Call c;
  c.kind = kind;
  c.dtype = dtype;
  c.count = count;
  return c;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommunicatorOptions options) {
  if (!store) throw InvalidArgument("Communicator::create: the store is null");
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(detail::concat("Communicator::create: rank ", rank, " is not in [0, ", size, ")"));
  if (settings().timeout) options.timeout = *settings().timeout;
  if (options.shm_chunk_bytes == 0) options.shm_chunk_bytes = settings().shm_chunk_bytes;
  const bool automatic = options.backend == "auto" && settings().backend == "auto";
  auto comm = std::shared_ptr<Communicator>(new Communicator(std::move(store), rank, size, std::move(options)));
  if (automatic && comm->host_count() > 1) comm->build_hierarchy();
  return comm;
}

// Note [Hierarchy]: across hosts, "auto" runs all_reduce in three steps: a reduce-scatter inside
// each host (shm), an all-reduce of each slice between the ranks that hold the same slice on
// every host (gloo), and an all-gather inside each host (shm). Only 1/L of the data (L ranks per
// host) crosses the network per rank, and the shared-memory steps run at memory speed. It needs
// the same number of ranks on every host; otherwise, and for every other collective, the group
// runs flat on gloo. The whole group checks each call first (Call::check_only), so a bad or
// mismatched call raises on every rank as it does on one host, and the step between hosts
// skips its own check (Call::checked).
void Communicator::build_hierarchy() {
  std::vector<std::string> distinct;
  std::vector<std::vector<int>> members;  // each host's ranks, in rank order
  for (int r = 0; r < size_; ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), hosts_[size_t(r)]);
    if (it == distinct.end()) {
      distinct.push_back(hosts_[size_t(r)]);
      members.emplace_back();
      it = distinct.end() - 1;
    }
    members[size_t(it - distinct.begin())].push_back(r);
  }
  const size_t per_host = members.front().size();
  const bool even = std::all_of(members.begin(), members.end(), [&](const auto& m) { return m.size() == per_host; });
  if (!even || per_host == 1) {
    if (rank_ == 0)
      std::fprintf(stderr, "[chorus] group '%s': %d ranks on %zu hosts: gloo (flat: %s)\n", options_.name.c_str(),
                   size_, distinct.size(), even ? "one rank per host" : "hosts have different numbers of ranks");
    return;
  }
  for (const auto& m : members)
    if (auto made = split_as(m, "shm", {})) node_ = made, node_ranks_ = m;
  for (size_t i = 0; i < per_host; ++i) {
    std::vector<int> same_slice;
    for (const auto& m : members) same_slice.push_back(m[i]);
    if (auto made = split_as(same_slice, "gloo", {})) cross_ = made, cross_ranks_ = same_slice;
  }
  if (rank_ == 0)
    std::fprintf(stderr, "[chorus] group '%s': %d ranks on %zu hosts: %s; other collectives on gloo\n",
                 options_.name.c_str(), size_, distinct.size(), backend_name().c_str());
}

int Communicator::host_count() const {
  std::set<std::string> distinct(hosts_.begin(), hosts_.end());
  return std::max<int>(1, int(distinct.size()));
}

bool Communicator::hierarchical(const Call& c) const {
  // Small messages are latency-bound: one flat call beats three.
  return node_ && cross_ && c.count * element_size(c.dtype) >= (64u << 10);
}

void Communicator::hierarchical_all_reduce(Call& c, Timeout timeout) {
  Call check = c;
  check.check_only = true;
  execute(check, timeout);
  const auto deadline = Clock::now() + timeout.value_or(options_.timeout);
  auto left = [&] { return left_until(deadline); };
  // Each local rank's slice; the last count % L elements (fewer than L) go flat afterwards, so
  // that the steps read the input and write the output in place, without staging copies.
  const size_t es = element_size(c.dtype), L = size_t(node_->size());
  const size_t part = c.count / L, tail = c.count - part * L;
  hierarchy_slice_.resize(part * es);
  uint8_t* slice = hierarchy_slice_.data();
  // A failure in a step names ranks of its subgroup: say which ranks of this group they are.
  auto step = [&](Communicator& sub, const std::vector<int>& members, auto&& fn) {
    const std::string where = detail::concat(describe(c), " on group '", options_.name, "', in its subgroup '",
                                             sub.name(), "': ");
    try {
      fn();
    } catch (const InvalidArgument&) {
      throw;
    } catch (const PeerFailure& e) {
      const int r = e.failed_rank() >= 0 ? members[size_t(e.failed_rank())] : -1;
      fail(std::make_exception_ptr(PeerFailure(detail::concat(where, "rank ", r, " failed (", e.what(), ")"), r)));
    } catch (const TimeoutError& e) {
      std::vector<int> missing;
      for (int m : e.missing_ranks()) missing.push_back(members[size_t(m)]);
      fail(std::make_exception_ptr(
          TimeoutError(detail::concat(where, "rank ", list_ranks(missing), " did not take part (", e.what(), ")"), missing,
                       e.operation())));
    } catch (const Error&) {
      fail(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(state_mu_);
    if (failed_) std::rethrow_exception(failed_);
  };
  step(*node_, node_ranks_, [&] { node_->reduce_scatter(c.in, slice, part, c.dtype, c.op, left()); });
  step(*cross_, cross_ranks_, [&] {  // checked above: skip the engine's own round
    Call across = make(OpKind::AllReduce, c.dtype, part);
    across.op = c.op;
    across.in = slice;
    across.out = slice;
    across.checked = true;
    cross_->run(across, left());
  });
  step(*node_, node_ranks_, [&] { node_->all_gather(slice, c.out, part, c.dtype, left()); });
  if (tail) {
    Call rest = c;
    rest.count = tail;
    rest.in = static_cast<const uint8_t*>(c.in) + part * L * es;
    rest.out = static_cast<uint8_t*>(c.out) + part * L * es;
    execute(rest, Timeout(left()));
  }
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, CommunicatorOptions options)
    : rank_(rank), size_(size), options_(std::move(options)) {
  // Every rank creates its communicators in the same order, so a per-rank counter names this
  // group's keys identically everywhere and a re-created group never sees stale keys.
  const int64_t generation = store->add(detail::concat("chorus/", options_.name, "/created_by/", rank), 1);
  store_ = std::make_shared<PrefixStore>(detail::concat("chorus/", options_.name, "/", generation), store);

  std::string backend = options_.backend == "auto" ? settings().backend : options_.backend;
  const std::vector<std::string> known = available_backends();
  if (std::find(known.begin(), known.end(), backend) == known.end()) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    throw InvalidArgument(detail::concat("group '", options_.name, "': unknown backend '", backend,
                                         "' (this build has: ", list, ")"));
  }
  const auto deadline = Clock::now() + options_.timeout;
  if (size_ > 1) {
    const std::string me = host_identity();
    store_->set(detail::concat("host/", rank_), me);
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
      throw TimeoutError(detail::concat("group '", options_.name, "': rank ", rank_, " waited ",
                                        options_.timeout.count(), " ms for ranks ", list_ranks(absent),
                                        " to join; did every rank create the group?"),
                         absent, "init");
    }
    std::string elsewhere;
    for (int r = 0; r < size_; ++r) {
      std::string other = store_->get(keys[size_t(r)]);
      hosts_.push_back(other);
      if (other != me) elsewhere += detail::concat(elsewhere.empty() ? "" : ", ", r, " (", other.substr(0, other.find(' ')), ")");
    }
    if (!elsewhere.empty() && backend == "auto") backend = "gloo";  // and shm inside hosts: create()
    if (!elsewhere.empty() && backend == "shm")
      throw InvalidArgument(detail::concat("group '", options_.name, "': backend '", backend,
                                           "' needs every rank on this host, but ranks ", elsewhere,
                                           " are elsewhere; the cross-host backends are gloo and mpi"));
  }
  BackendOptions bo;
  bo.group_name = options_.name;
  bo.shm_chunk_bytes = options_.shm_chunk_bytes;
  bo.deadline = deadline;
  if (backend == "gloo") {
#if CHORUS_HAVE_GLOO
    backend_ = make_engine_backend(make_gloo_engine(*store_, rank_, size_, options_.timeout), *store_, rank_, size_, bo);
#endif
  } else if (backend == "mpi") {
#if CHORUS_HAVE_MPI
    backend_ = make_engine_backend(make_mpi_engine(*store_, rank_, size_, options_.name, options_.timeout), *store_,
                                   rank_, size_, bo);
#endif
  } else {
    backend_ = make_shm_backend(*store_, rank_, size_, bo);
  }
  if (settings().log_level >= 1 && rank_ == 0)
    std::fprintf(stderr, "[chorus] group '%s': %d ranks on backend %s\n", options_.name.c_str(), size_,
                 backend_->name().c_str());
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  for (auto& [t, work] : p2p_threads_) t.join();
}

std::string Communicator::backend_name() const {
  if (node_ && cross_)
    return detail::concat("hierarchical (", node_->backend_name(), " in each host, ", cross_->backend_name(),
                          " between hosts)");
  return backend_->name();
}

void Communicator::run(Call& call, Timeout timeout) {
  if (call.kind == OpKind::Send || call.kind == OpKind::Recv)
    return run_p2p(call, timeout, take_ticket(call.kind == OpKind::Send, call.root));
  drain();
  std::lock_guard<std::mutex> lock(call_mu_);
  execute(call, timeout);
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

void Communicator::fail(const std::exception_ptr& error) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (failed_) return;
  failed_ = error;
  backend_->abort(failed_);
  aborted_.store(true, std::memory_order_release);
}

void Communicator::all_reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, Timeout timeout) {
  Call c = make(OpKind::AllReduce, dtype, count);
  c.op = op;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.op();
  k.buffer(in, count, "input");
  k.buffer(out, count, "output");
  k.aliasing(in, count, out, count, 0);
  if (hierarchical(c)) {
    drain();
    std::lock_guard<std::mutex> lock(call_mu_);
    return hierarchical_all_reduce(c, timeout);
  }
  run(c, timeout);
}

void Communicator::broadcast(void* buf, size_t count, DataType dtype, int root, Timeout timeout) {
  Call c = make(OpKind::Broadcast, dtype, count);
  c.root = root;
  c.out = buf;
  Checker k(c, *this);
  k.dtype();
  k.rank(root, "root");
  k.buffer(buf, count, "buffer");
  run(c, timeout);
}

void Communicator::reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
                          Timeout timeout) {
  Call c = make(OpKind::Reduce, dtype, count);
  c.op = op;
  c.root = root;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.op();
  k.rank(root, "root");
  k.buffer(in, count, "input");
  if (rank_ == root) {
    k.buffer(out, count, "output");
    k.aliasing(in, count, out, count, 0);
  }
  run(c, timeout);
}

void Communicator::all_gather(const void* in, void* out, size_t count, DataType dtype, Timeout timeout) {
  gather_family(OpKind::AllGather, in, out, count, nullptr, dtype, 0, timeout);
}

void Communicator::all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                                Timeout timeout) {
  gather_family(OpKind::AllGatherV, in, out, 0, &counts, dtype, 0, timeout);
}

void Communicator::gather(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout) {
  gather_family(OpKind::Gather, in, out, count, nullptr, dtype, root, timeout);
}

void Communicator::gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, int root,
                            Timeout timeout) {
  gather_family(OpKind::GatherV, in, out, 0, &counts, dtype, root, timeout);
}

void Communicator::gather_family(OpKind kind, const void* in, void* out, size_t count,
                                 const std::vector<size_t>* counts, DataType dtype, int root, Timeout timeout) {
  const bool to_all = kind == OpKind::AllGather || kind == OpKind::AllGatherV;
  Call c = make(kind, dtype, counts ? 0 : count);
  c.root = root;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  if (!to_all) k.rank(root, "root");
  if (counts) k.counts(*counts, "counts");
  if (c.invalid.empty()) {
    size_t mine = count, total = count * size_t(size_), before = count * size_t(rank_);
    if (counts) {
      c.counts.assign(counts->begin(), counts->end());
      mine = (*counts)[size_t(rank_)];
      total = sum(*counts);
      before = 0;
      for (int r = 0; r < rank_; ++r) before += (*counts)[size_t(r)];
    }
    k.buffer(in, mine, "input");
    if (to_all || rank_ == root) {
      k.buffer(out, total, "output");
      k.aliasing(in, mine, out, total, before);
    }
  }
  run(c, timeout);
}

void Communicator::scatter(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout) {
  Call c = make(OpKind::Scatter, dtype, count);
  c.root = root;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.rank(root, "root");
  k.buffer(out, count, "output");
  if (rank_ == root) {
    k.buffer(in, count * size_t(size_), "input");
    k.aliasing(out, count, in, count * size_t(size_), count * size_t(rank_));
  }
  run(c, timeout);
}

void Communicator::reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                                  Timeout timeout) {
  Call c = make(OpKind::ReduceScatter, dtype, count);
  c.op = op;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.op();
  k.buffer(in, count * size_t(size_), "input");
  k.buffer(out, count, "output");
  k.aliasing(out, count, in, count * size_t(size_), count * size_t(rank_));
  run(c, timeout);
}

void Communicator::all_to_all(const void* in, void* out, size_t count, DataType dtype, Timeout timeout) {
  Call c = make(OpKind::AllToAll, dtype, count);
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.buffer(in, count * size_t(size_), "input");
  k.buffer(out, count * size_t(size_), "output");
  k.aliasing(in, count * size_t(size_), out, count * size_t(size_), 0);
  run(c, timeout);
}

void Communicator::all_to_all_v(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DataType dtype, Timeout timeout) {
  Call c = make(OpKind::AllToAllV, dtype, 0);
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  k.dtype();
  k.counts(send_counts, "send_counts");
  k.counts(recv_counts, "recv_counts");
  if (c.invalid.empty()) {
    c.counts.assign(send_counts.begin(), send_counts.end());
    c.recv_counts.assign(recv_counts.begin(), recv_counts.end());
    k.buffer(in, sum(send_counts), "input");
    k.buffer(out, sum(recv_counts), "output");
    k.aliasing(in, sum(send_counts), out, sum(recv_counts), std::nullopt);
  }
  run(c, timeout);
}

Call Communicator::make_p2p(OpKind kind, const void* in, void* out, size_t count, DataType dtype, int peer,
                            int tag) const {
  Call c = make(kind, dtype, count);
  c.root = peer;
  c.tag = tag;
  c.in = in;
  c.out = out;
  Checker k(c, *this);
  const bool sending = kind == OpKind::Send;
  k.dtype();
  k.rank(peer, sending ? "destination" : "source");
  if (peer == rank_) k.fail(sending ? "a rank cannot send to itself" : "a rank cannot receive from itself");
  if (tag < 0) k.fail("tags must be >= 0");
  k.buffer(sending ? in : out, count, "buffer");
  return c;
}

Call Communicator::make_send(const void* buf, size_t count, DataType dtype, int dst, int tag) const {
  return make_p2p(OpKind::Send, buf, nullptr, count, dtype, dst, tag);
}
Call Communicator::make_recv(void* buf, size_t count, DataType dtype, int src, int tag) const {
  return make_p2p(OpKind::Recv, nullptr, buf, count, dtype, src, tag);
}

void Communicator::send(const void* buf, size_t count, DataType dtype, int dst, int tag, Timeout timeout) {
  Call c = make_send(buf, count, dtype, dst, tag);
  run(c, timeout);
}

void Communicator::recv(void* buf, size_t count, DataType dtype, int src, int tag, Timeout timeout) {
  Call c = make_recv(buf, count, dtype, src, tag);
  run(c, timeout);
}

void Communicator::barrier(Timeout timeout) {
  Call c = make(OpKind::Barrier, DataType::UInt8, 0);
  run(c, timeout);
}

SymmetricMemory Communicator::alloc_symmetric(size_t bytes, Timeout timeout) {
  Call c = make(OpKind::AllocSymmetric, DataType::UInt8, bytes);
  drain();
  std::lock_guard<std::mutex> lock(call_mu_);
  SymmetricMemory made;
  execute_with(c, timeout, [&] { made = backend_->alloc_symmetric(c); });
  return made;
}

void Communicator::reject(const std::string& operation, const std::string& why, Timeout timeout) {
  Call c = make(OpKind::Barrier, DataType::UInt8, 0);
  c.invalid = detail::concat(operation, " on group '", name(), "' (rank ", rank_, "): ", why);
  run(c, timeout);
  throw InvalidArgument(c.invalid);  // the backend threw already; this keeps [[noreturn]] honest
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks, Timeout timeout) {
  return split_as(ranks, options_.backend, timeout);
}

std::shared_ptr<Communicator> Communicator::split_as(const std::vector<int>& ranks, const std::string& backend,
                                                     Timeout timeout) {
  Call c = make(OpKind::Split, DataType::UInt8, ranks.size());
  Checker k(c, *this);
  std::set<int> seen;
  for (int r : ranks) {
    k.rank(r, "member");
    if (!seen.insert(r).second) k.fail(detail::concat("rank ", r, " is listed twice"));
  }
  if (ranks.empty()) k.fail("the list of ranks is empty");
  c.counts.assign(ranks.begin(), ranks.end());
  // Every rank must pass the same list: the call check compares it element by element. The
  // shared counts area holds size() entries; a longer list repeats a rank and is invalid anyway.
  if (c.counts.size() > size_t(size_)) c.counts.resize(size_t(size_));
  run(c, timeout);
  const int generation = ++splits_;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  std::shared_ptr<Communicator> made;
  if (it != ranks.end()) {
    CommunicatorOptions child = options_;
    child.name = detail::concat(options_.name, "/", generation);
    child.backend = backend;
    made = create(store_, int(it - ranks.begin()), int(ranks.size()), child);
  }
  barrier(timeout);  // the members are done with the store
  return made;
}

}  // namespace chorus
