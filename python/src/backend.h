// chorus as a torch.distributed backend: a c10d::Backend over chorus's ProcessGroup (backend.cc).
// Only chorus's public headers: every collective it serves is a ProcessGroup operation that C++
// users have too.
#pragma once

#include <chorus/core/communicator.h>
#include <chorus/core/error.h>
#include <chorus/core/settings.h>
#include <chorus/process_group.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace chorus::python {

class ChorusWork;

class ProcessGroupChorus : public c10d::Backend {
 public:
  ProcessGroupChorus(std::shared_ptr<chorus::ProcessGroup> pg, std::chrono::milliseconds timeout);
  // Lets the submitted work finish, then closes the communicator (Note [Closing under the GIL]).
  ~ProcessGroupChorus() override;
  // destroy_process_group: Communicator::shutdown, with the GIL released (Note [Closing under
  // the GIL]); raises what the group's last call left unchecked.
  void shutdown() override;
  // How the destructor runs its teardown: the Python module makes it release the GIL first.
  static inline std::function<void(const std::function<void()>&)> run_teardown = [](const std::function<void()>& fn) {
    fn();
  };
  // The creator torch calls for each group: rendezvous through `store` (torch's, already prefixed
  // for the group), one Communicator per group. `global_ranks`: the default group's rank of each
  // member (empty: this is the default group).
  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout, const std::string& name,
                                                  std::vector<int> global_ranks);

  const std::string getBackendName() const override { return "chorus"; }
  // The chorus engine that moves this group's data: "shm", "gloo", or the hierarchy across hosts.
  std::string engine() const { return pg_->communicator().backend_name(); }
  c10::intrusive_ptr<Options> getBackendOptions() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // Refused by name: chorus moves dense tensors.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // Note [Coalescing blocks]: between startCoalescing and endCoalescing every call is issued as
  // usual, and endCoalescing returns one Work that finishes when all of them have (torch's
  // batch_isend_irecv and _coalescing_manager wait on that one).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // A group of `ranks` (of this group) on `store`, made by its members only (ProcessGroup's
  // split_group).
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // Note [Buckets in symmetric memory]: torch's DDP reducer asks its group's backend for the
  // memory of its gradient buckets when DDP_DISABLE_COMM_MEM is 0 (torch's default is 1;
  // chorus_torch sets 0 unless the user set it), and FSDP2 for its all-gather and reduce-scatter
  // staging buffers, per collective, after set_allocate_memory_from_process_group_for_comm(True).
  // chorus gives both the group's symmetric memory through its pool (Note [Symmetric pool]), so
  // that those collectives move bytes straight between the ranks' buffers, without staging, and
  // FSDP2's per-call buffers reuse memory instead of allocating. Collective, as both callers are:
  // every rank asks for the same sizes in the same order.
  bool supportsTensorAlloc(c10::DeviceIndex /*device_index*/) override { return true; }
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  // The number of collectives issued on this group (TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper
  // compares it between ranks before each collective).
  void setSequenceNumberForGroup() override { sequence_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

 private:
  // One call: its ChorusWork, given to `start` (which issues the ProcessGroup call with it as
  // the handle), counted as a collective or not, and kept for an open coalescing block. `sync`
  // (c10d's asyncOp is false: Python waits for it at once) runs it on the calling thread.
  c10::intrusive_ptr<c10d::Work> issue(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs, bool sync,
                                       const std::function<void(chorus::TensorAsyncOptions)>& start);
  std::shared_ptr<chorus::ProcessGroup> pg_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> sequence_{0};
  std::mutex coalescing_mu_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<ChorusWork>> block_;  // the calls of the open coalescing block
};

}  // namespace chorus::python
