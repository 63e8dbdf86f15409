// Process groups on tensors: the torch.distributed-style layer over a core Communicator.
//
// Every collective here is collective over its group (the Communicator's rules hold: same calls,
// same order, same dtype and element count on every rank). Tensors may be of any shape, 0-d,
// empty or non-contiguous, of dtype f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool, or complex (moved
// as pairs of reals; sum and mean only). They must live on the CPU. A bad tensor on one rank
// raises InvalidArgument on every rank.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/communicator.h"
#include "chorus/core/dtype.h"
#include "chorus/core/environment.h"
#include "chorus/core/error.h"
#include "chorus/core/work.h"

namespace chorus {

struct InitOptions {
  std::string backend = "auto";                                  // "auto", "shm", "gloo" or "mpi"
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // default deadline of every call
};

// The handle of an asynchronous tensor collective, and the call's queued item itself (Note [One
// Work per call] in the core's ordering.cc). The collective keeps the tensors it reads and writes
// alive until it finishes. A layer that needs more in its handle (the Python backend's c10d Work)
// derives from it and passes its object as the `handle` of an *_async call.
class TensorWork : public Work {
 public:
  TensorWork() = default;
  // Blocks like wait() (and throws what it throws), then returns the collective's new tensors:
  // one for all_gather, gather (none off the destination), scatter, reduce_scatter, all_to_all;
  // one per rank for all_gather_v; none for the in-place collectives.
  std::vector<at::Tensor> result(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Non-blocking: recv_any_async's sender once the work finished; -1 before, and for other calls.
  int source() const { return source_.load(std::memory_order_acquire); }

 private:
  friend class ProcessGroup;
  std::vector<at::Tensor> outputs_;
  std::atomic<int> source_{-1};
  int received_from_ = -1;  // the core writes recv_any's sender here, then source_ publishes it
};

// How an asynchronous tensor call reports: the core's AsyncOptions with a TensorWork handle.
struct TensorAsyncOptions {
  std::shared_ptr<TensorWork> handle;  // the handle to return (a subclass of TensorWork); null: a new one
  // Runs on the collective's thread after it succeeded, before the work finishes; what it
  // throws becomes the work's error.
  std::function<void()> then;
  // The caller waits for it at once: the call returns its work finished, the collective having
  // run in its place in the order, on the calling thread when nothing was queued before it
  // (AsyncOptions::on_caller). Not for send and recv, which move on a thread of their own.
  bool on_caller = false;
};

namespace detail {
struct PreparedCall;  // torch/src/groups/process_group/prepared_call.h
class SymmetricPool;  // symmetric_pool.h
}  // namespace detail

class ProcessGroup {
 public:
  // Wraps a communicator; ranks[i] is the default group's rank of this group's rank i.
  ProcessGroup(std::shared_ptr<Communicator> comm, std::vector<int> ranks);

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  const std::string& name() const { return comm_->name(); }
  // The default group's rank of this group's rank r.
  int global_rank(int r) const { return ranks_.at(size_t(r)); }
  const std::vector<int>& ranks() const { return ranks_; }
  Communicator& communicator() { return *comm_; }
  // Collective: a zeroed flat tensor of `numel` elements for a buffer that is reduced again and
  // again (a gradient bucket), on the CPU in the group's symmetric memory (Note [Symmetric
  // memory]: collectives then move its bytes straight between the ranks' tensors), elsewhere in
  // ordinary memory. Every rank makes the same ones in the same order.
  at::Tensor alloc_symmetric(int64_t numel, const at::TensorOptions& options = {});
  // Collective: a flat tensor of `numel` elements for a collective's buffer (a staging buffer
  // asked for per call, as torch's FSDP2 does), contents unspecified, taken from the group's
  // pool of symmetric memory (Note [Symmetric pool]): the memory of dropped tensors serves later
  // calls, so after the first few calls a take costs one small all_reduce, not an allocation.
  // Every rank takes the same sizes in the same order. Off the CPU: at::empty.
  at::Tensor take_symmetric(int64_t numel, const at::TensorOptions& options = {});

  // In place: t becomes the reduction over ranks (rank order, identical bits everywhere).
  void all_reduce_(at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // In place: every rank's t becomes src's t (same shape and dtype everywhere).
  void broadcast_(at::Tensor& t, int src = 0);
  // In place on dst: t becomes the reduction; other ranks' t is left as it was.
  void reduce_(at::Tensor& t, int dst, ReduceOp op = ReduceOp::Sum);
  // Every rank's t stacked in rank order: (size(), *t.sizes()).
  at::Tensor all_gather(const at::Tensor& t);
  // Every rank's t, one tensor each; shapes may differ in every dimension (same ndim and dtype,
  // else CollectiveMismatch on every rank).
  std::vector<at::Tensor> all_gather_v(const at::Tensor& t);
  // Stacked (size(), *t.sizes()) on dst; nullopt elsewhere.
  std::optional<at::Tensor> gather(const at::Tensor& t, int dst);
  // src passes (size(), ...); rank q gets block q. Other ranks may pass nullopt.
  at::Tensor scatter(const std::optional<at::Tensor>& stacked_on_src, int src);
  // t: (size() * n, ...) -> this rank's block (n, ...) of the reduction.
  at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // t: (size() * n, ...); block q goes to rank q; block p of the result came from rank p.
  at::Tensor all_to_all(const at::Tensor& t);
  // Into the caller's tensor (torch's all_gather_into_tensor / reduce_scatter_tensor): `out` is
  // contiguous, of t's dtype, with size() * t.numel() elements (rank r's t at r * t.numel()), or,
  // for reduce_scatter_into, t.numel() / size() elements (this rank's block of the reduction).
  void all_gather_into(at::Tensor& out, const at::Tensor& t);
  void reduce_scatter_into(at::Tensor& out, const at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Point to point (not collective): messages from one rank to another match in order, and the
  // receiver's tensor must have the sender's dtype and element count.
  void send(const at::Tensor& t, int dst, int tag = 0);
  void recv(at::Tensor& t, int src, int tag = 0);
  // Receives the next message from whichever rank's comes first; returns that rank (Communicator::
  // recv_any: it waits for the receives issued before it, from any rank).
  int recv_any(at::Tensor& t, int tag = 0);
  void barrier(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // ---- torch.distributed's list and coalesced forms (for C++, and what the Python backend serves)
  // Every rank's t into outputs[r]: the caller's tensors, each of t's dtype and element count.
  // Moves each rank's data straight into its output, without a staging tensor.
  void all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& t);
  // Every tensor of the list reduced in place, in one call: one collective per dtype in the list
  // (tensors may differ in shape and dtype). Every rank must pass the same shapes and dtypes in
  // the same order, else CollectiveMismatch on every rank, showing each rank's list.
  void all_reduce_coalesced_(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::Sum);
  // all_gather_into / reduce_scatter_into of each pair (outs[i], ins[i]), in one call, with the
  // same agreement rule on the lists.
  void all_gather_into_coalesced(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins);
  void reduce_scatter_into_coalesced(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins,
                                     ReduceOp op = ReduceOp::Sum);
  // torch's all_to_all_single: rows in_splits[q] of `in` (along dim 0, in order) go to rank q, and
  // out_splits[p] rows of `out` come from rank p. Empty splits: equal blocks of size() rows each.
  // in and out share a dtype and their rows' shape.
  void all_to_all_into(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits = {},
                       const std::vector<int64_t>& in_splits = {});
  // torch's list all_to_all: inputs[q] goes to rank q, outputs[p] comes from rank p (sizes may
  // differ per pair; one dtype).
  void all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);
  // torch's list gather / scatter / reduce_scatter: every rank's t into outputs[r] on dst (other
  // ranks pass an empty list); inputs[q] of src into rank q's out; the reduction of every rank's
  // inputs[q] into rank q's out. The tensors of a call share the shape and dtype of t / out.
  void gather(std::vector<at::Tensor>& outputs_on_dst, const at::Tensor& t, int dst);
  void scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs_on_src, int src);
  void reduce_scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, ReduceOp op = ReduceOp::Sum);

  // Asynchronous forms: the same collective, queued behind the earlier asynchronous ones on the
  // group's executor (Note [One body per collective] in process_group.cc). They return at once
  // (all_gather_v and scatter first agree on shapes, which blocks briefly); a bad tensor raises
  // here, on every rank. TensorWork::result() gives the new tensors. In-place targets must not be
  // read or written until the work finished. `async`: the handle to return, and what to run
  // after the collective (TensorAsyncOptions).
  using Handle = std::shared_ptr<TensorWork>;
  Handle all_reduce_async(at::Tensor& t, ReduceOp op = ReduceOp::Sum, TensorAsyncOptions async = {});
  Handle broadcast_async(at::Tensor& t, int src = 0, TensorAsyncOptions async = {});
  Handle reduce_async(at::Tensor& t, int dst, ReduceOp op = ReduceOp::Sum, TensorAsyncOptions async = {});
  Handle all_gather_async(const at::Tensor& t, TensorAsyncOptions async = {});
  Handle all_gather_v_async(const at::Tensor& t, TensorAsyncOptions async = {});
  Handle gather_async(const at::Tensor& t, int dst, TensorAsyncOptions async = {});
  Handle scatter_async(const std::optional<at::Tensor>& stacked_on_src, int src, TensorAsyncOptions async = {});
  Handle reduce_scatter_async(const at::Tensor& t, ReduceOp op = ReduceOp::Sum, TensorAsyncOptions async = {});
  Handle all_to_all_async(const at::Tensor& t, TensorAsyncOptions async = {});
  Handle all_gather_into_async(at::Tensor& out, const at::Tensor& t, TensorAsyncOptions async = {});
  Handle reduce_scatter_into_async(at::Tensor& out, const at::Tensor& t, ReduceOp op = ReduceOp::Sum,
                                   TensorAsyncOptions async = {});
  Handle send_async(const at::Tensor& t, int dst, int tag = 0, TensorAsyncOptions async = {});
  Handle recv_async(at::Tensor& t, int src, int tag = 0, TensorAsyncOptions async = {});
  Handle recv_any_async(at::Tensor& t, int tag = 0, TensorAsyncOptions async = {});  // TensorWork::source()
  Handle barrier_async(TensorAsyncOptions async = {});
  Handle all_gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& t, TensorAsyncOptions async = {});
  Handle all_reduce_coalesced_async(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::Sum,
                                    TensorAsyncOptions async = {});
  Handle all_gather_into_coalesced_async(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins,
                                         TensorAsyncOptions async = {});
  Handle reduce_scatter_into_coalesced_async(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins,
                                             ReduceOp op = ReduceOp::Sum, TensorAsyncOptions async = {});
  Handle all_to_all_into_async(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits = {},
                               const std::vector<int64_t>& in_splits = {}, TensorAsyncOptions async = {});
  Handle all_to_all_async(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                          TensorAsyncOptions async = {});
  Handle gather_async(std::vector<at::Tensor>& outputs_on_dst, const at::Tensor& t, int dst,
                      TensorAsyncOptions async = {});
  Handle scatter_async(at::Tensor& out, const std::vector<at::Tensor>& inputs_on_src, int src,
                       TensorAsyncOptions async = {});
  Handle reduce_scatter_async(at::Tensor& out, const std::vector<at::Tensor>& inputs, ReduceOp op = ReduceOp::Sum,
                              TensorAsyncOptions async = {});

  // Collective over this group: a group of `ranks` (ranks of this group; their order gives the
  // new ranks). Null on ranks not in the list.
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks);

 private:
  Handle submit(detail::PreparedCall call, TensorAsyncOptions async);
  std::shared_ptr<Communicator> comm_;
  std::vector<int> ranks_;
  std::shared_ptr<detail::SymmetricPool> pool_;
};

// ---- the default group ------------------------------------------------------------------
// Collective over every process of the job: reads the launcher's environment (chorusrun,
// torchrun, mpirun, srun, env://, or a single process), meets the others through the rendezvous
// store and makes the default group. Idempotent: later calls return the same group.
std::shared_ptr<ProcessGroup> init_process_group(InitOptions options = {});
// The same from explicit facts (Lightning's init_dist_connection): rank 0 serves the store on
// address:port unless `store_hosted`.
std::shared_ptr<ProcessGroup> init_process_group(const Environment& env, InitOptions options = {});
// The default group; throws Error when init_process_group has not been called.
std::shared_ptr<ProcessGroup> default_group();
bool is_initialized();
// What the launcher said (ranks, nodes, addresses) for the default group; a single process when
// not initialized.
Environment environment();
// Forgets the default group (not collective). Groups made from it, and the default group itself
// while held elsewhere, stay usable. When nothing else holds it, shuts it down
// (Communicator::shutdown): throws what this rank's last call left unchecked (a mismatch, a
// failed or missing peer), after the group's timeout at most.
void destroy_process_group();
// Collective over the default group: a group of `ranks` (default-group ranks). Null on ranks
// not in the list.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);
// `group` when given, else the default group (throws when not initialized).
ProcessGroup& group_or_default(const std::shared_ptr<ProcessGroup>& group);

}  // namespace chorus
