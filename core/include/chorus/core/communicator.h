// A process group's collectives on raw buffers (pointer, element count, dtype).
//
// Every call is collective over the group unless it says otherwise: all ranks make the same
// calls in the same order with the same dtype, counts, op and root. Breaking that raises
// CollectiveMismatch on every rank instead of hanging; bad arguments on one rank raise
// InvalidArgument on every rank; a peer that never arrives raises TimeoutError naming it at the
// deadline; a peer that dies raises PeerFailure naming it within seconds. After TimeoutError,
// PeerFailure or CollectiveMismatch the communicator is aborted and every later call rethrows
// that error at once.
//
// In place: pass the same buffer as in and out (all_reduce, reduce, all_to_all), or the
// rank's own block of the other buffer (all_gather(_v)/gather(_v): in == out + displacement of
// this rank; scatter/reduce_scatter: out == in + rank * count). Any other overlap of in and out
// is an InvalidArgument. Results are bitwise identical on every rank.
//
// Collectives from several threads are serialized; the order in which they reach the group is
// the order every rank must follow. submit() queues collectives to run on one executor thread per
// communicator, in submission order, and a blocking collective first waits for the submitted
// ones. Sends and receives are ordered per (peer, direction) in the order they are issued, and
// run independently of collectives and of other peers, so a rank may post send_async to one peer
// and then block in recv from another. Buffers must stay alive until the returned Work completes.
//
// Where each step of a call lives: docs/tour.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/cross_options.h"
#include "chorus/core/dtype.h"
#include "chorus/core/shm_options.h"
#include "chorus/core/store.h"
#include "chorus/core/symmetric_memory.h"
#include "chorus/core/work.h"

namespace chorus {

class Backend;
class CallLock;
class CallOrder;
class Hierarchy;
struct Call;

struct CommunicatorOptions {
  // "auto" (CHORUS_BACKEND, else: shm when every rank is on this host; across hosts, shm inside
  // each host and tcp between them, Note [Hierarchy]), "shm", "tcp", "gloo" or "mpi".
  std::string backend = "auto";
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // default deadline of each call
  std::string name = "world";                                    // appears in every message about this group
  ShmOptions shm;                                                // the shared-memory engine's tuning
  CrossOptions cross;                                            // the tcp engine's, between hosts
};

using Timeout = std::optional<std::chrono::milliseconds>;

// How an asynchronous call (submit, send_async, recv_async, recv_any_async) reports.
struct AsyncOptions {
  // The Work to return and finish: a subclass that carries results for the layer above (the torch
  // layer's TensorWork, the Python backend's c10d Work). Null: a plain Work. Given to one call only.
  std::shared_ptr<Work> handle;
  // Runs on the call's thread after the call succeeded, before the Work finishes (copying a
  // result where it belongs); what it throws becomes the Work's error.
  std::function<void()> then;
  // submit only: the caller is about to wait for it. It takes its place in the order as usual and
  // submit returns it finished, its error kept in the Work. The executor is not woken for it:
  // when nothing is queued before it, it runs on the calling thread (Note [Running on the
  // waiter]), with no hand-off to the executor and back.
  bool on_caller = false;
};

class Communicator {
 public:
  // Collective over `size` processes that pass the same store (or stores of one server) and
  // distinct ranks. Blocks until all have joined or the timeout passes (TimeoutError naming the
  // absent ranks). Throws InvalidArgument for a bad rank/size or backend name.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommunicatorOptions options = {});
  // Without shutdown() first, pays what this rank still owes its last call (as shutdown() does,
  // waiting kFinishOnDestroy at most) and logs what that finds to stderr. Never throws.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  // How errors name a rank of this group: "rank 2 (global rank 5 on host2)", the job's rank as
  // its launcher gave it and the host it runs on ("rank 2 (on host2)" in the job's own group).
  std::string describe_rank(int rank) const;
  // True once a failure (a peer that died or left, a mismatch, a timeout) left the group
  // unusable: every later call rethrows it.
  bool failed() const { return aborted_.load(std::memory_order_acquire); }
  // Fails the group from outside (another thread learnt that a peer is gone): the calls in
  // progress and every later one raise PeerFailure with `why`. Only this rank's side.
  void abort(const std::string& why);
  // "shm", "gloo", or "hierarchical (shm in each host, gloo between hosts)".
  std::string backend_name() const;
  int host_count() const;  // distinct hosts among the ranks
  std::chrono::milliseconds timeout() const { return options_.timeout; }

  // out[i] = in_0[i] op in_1[i] op ... (rank order). count elements each. (Float sums and products
  // of 1 MiB and more with more ranks than cores, and some across hosts, add in another order:
  // docs/launching.md.)
  void all_reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, Timeout timeout = {});
  // buf of root goes to every rank's buf.
  void broadcast(void* buf, size_t count, DataType dtype, int root, Timeout timeout = {});
  // Like all_reduce, result on root only (out may be null elsewhere).
  void reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root, Timeout timeout = {});
  // out (size() * count) = every rank's in, in rank order.
  void all_gather(const void* in, void* out, size_t count, DataType dtype, Timeout timeout = {});
  // The same into separate buffers: rank p's in goes to outs[p] (count elements each; the blocks
  // must not overlap each other, nor in unless in == outs[rank()]).
  void all_gather_to(const void* in, const std::vector<void*>& outs, size_t count, DataType dtype,
                     Timeout timeout = {});
  // Uneven: rank p contributes counts[p] elements; out holds their concatenation.
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, Timeout timeout = {});
  void gather(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout = {});
  void gather_v(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, int root,
                Timeout timeout = {});
  // Root's in holds size() blocks of count; rank q receives block q in out.
  void scatter(const void* in, void* out, size_t count, DataType dtype, int root, Timeout timeout = {});
  // in holds size() blocks of count; rank q receives the reduction of everyone's block q.
  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, Timeout timeout = {});
  // in and out hold size() blocks of count; block q of in goes to rank q, block p of out
  // comes from rank p.
  void all_to_all(const void* in, void* out, size_t count, DataType dtype, Timeout timeout = {});
  void all_to_all_v(const void* in, const std::vector<size_t>& send_counts, void* out,
                    const std::vector<size_t>& recv_counts, DataType dtype, Timeout timeout = {});
  // Point to point, not collective. Messages from one rank to another match in order; a recv
  // whose tag, dtype or count differs from the next message raises CollectiveMismatch on both.
  // send returns once the data is handed over (small messages do not wait for the receiver).
  void send(const void* buf, size_t count, DataType dtype, int dst, int tag = 0, Timeout timeout = {});
  void recv(void* buf, size_t count, DataType dtype, int src, int tag = 0, Timeout timeout = {});
  // Receives the next message from whichever rank's comes first, and returns that rank. It takes
  // its turn on every incoming (peer) order at once: receives issued before it, from any peer,
  // finish first; those issued after wait for it. A peer that dies while it waits is named in a
  // PeerFailure, as for recv.
  int recv_any(void* buf, size_t count, DataType dtype, int tag = 0, Timeout timeout = {});
  void barrier(Timeout timeout = {});
  // Collective: every rank allocates `bytes` (the same on every rank) of symmetric memory
  // (Note [Symmetric memory]), 64-byte aligned and zero-filled.
  SymmetricMemory alloc_symmetric(size_t bytes, Timeout timeout = {});
  // Collective, for layers built on this one that find this rank's input bad: takes this rank's
  // place in the group's next collective, whatever the others call, so that every rank raises
  // InvalidArgument carrying "`operation` on group '<name>' (rank r): `why`". Always throws.
  [[noreturn]] void reject(const std::string& operation, const std::string& why, Timeout timeout = {});
  // Leaves the group, as destroy_process_group does. Waits for the submitted work and the sends
  // and receives in flight (each until its own deadline at most), then for what
  // this rank still owes its last call: a rank that received nothing after a call's last phase
  // left it before the others were done and before the call was compared (Note [Owed waits]).
  // Throws what that finds: CollectiveMismatch when the last call differed between the ranks,
  // PeerFailure or TimeoutError (after `timeout`, default the group's) when a peer failed in it or
  // never made it. Not collective: each rank shuts down when it is done. Later calls throw Error.
  // Idempotent.
  void shutdown(Timeout timeout = {});
  // How long the destructor waits for what shutdown() waits for.
  static constexpr std::chrono::seconds kFinishOnDestroy{10};

  // Collective over this group: a new group of `ranks` (their order gives the new ranks).
  // Returns null on ranks not in the list, after the members have built the new group (so a
  // non-member may exit, taking a store it hosts with it). Groups live independently.
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks, Timeout timeout = {});

  // Queues `collectives` (a function that makes blocking calls on this communicator) behind
  // the ones submitted before, to run on this communicator's executor thread; returns at once.
  // The Work finishes when the function returns, with what it threw. Buffers must stay alive
  // until then. A blocking collective on another thread first waits for every submitted one.
  std::shared_ptr<Work> submit(std::function<void()> collectives, AsyncOptions async = {});
  // Point to point without blocking: the message takes its place in the (peer, direction) order
  // now, and moves on a thread of its own.
  std::shared_ptr<Work> send_async(const void* buf, size_t count, DataType dtype, int dst, int tag = 0,
                                   Timeout timeout = {}, AsyncOptions async = {});
  std::shared_ptr<Work> recv_async(void* buf, size_t count, DataType dtype, int src, int tag = 0, Timeout timeout = {},
                                   AsyncOptions async = {});
  // recv_any without blocking: *source (which must stay valid until the Work finishes) is set to
  // the sender's rank before the Work finishes.
  std::shared_ptr<Work> recv_any_async(void* buf, size_t count, DataType dtype, int* source, int tag = 0,
                                       Timeout timeout = {}, AsyncOptions async = {});

 private:
  friend class Hierarchy;  // runs its steps through execute() and fail()
  Communicator(std::shared_ptr<Store> store, int rank, int size, CommunicatorOptions options);
  // The one path every call takes: validate its arguments (communicator/arguments.h), take its
  // place in the order (communicator/ordering.h), then execute it.
  void run(Call& call, Timeout timeout);
  std::shared_ptr<Work> run_async(Call call, Timeout timeout, AsyncOptions async,
                                  int* source = nullptr);  // send_async / recv_async / recv_any_async
  void execute(Call& call, Timeout timeout);               // after ordering: the backend, and the aborted state
  template <class Body>
  void execute_with(Call& call, Timeout timeout, Body&& body);  // body instead of the backend's run()
  // Marks the communicator failed after an error that leaves the group unusable.
  void fail(const std::exception_ptr& error);
  // `cross`: the subgroup's CrossOptions (default: this group's).
  std::shared_ptr<Communicator> split_as(const std::vector<int>& ranks, const std::string& backend, Timeout timeout,
                                         const std::optional<CrossOptions>& cross = std::nullopt);

  std::shared_ptr<Store> store_;
  int rank_, size_;
  CommunicatorOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Hierarchy> hierarchy_;  // Note [Hierarchy]: across hosts, when it can serve
  std::unique_ptr<CallOrder> order_;      // the executor of submit() and the point-to-point order
  std::unique_ptr<CallLock> call_lock_;   // one collective at a time reaches the backend
  std::mutex state_mu_;
  std::exception_ptr failed_;         // set once aborted
  std::atomic<bool> aborted_{false};  // failed_ is set: the fast path reads only this
  int splits_ = 0;
  std::vector<std::string> hosts_;       // each rank's host identity
  std::vector<std::string> rank_names_;  // describe_rank()
};

}  // namespace chorus
