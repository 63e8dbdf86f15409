// PyTorch Lightning's distributed utilities (docs/api.md, "Lightning-style utilities"), in
// chorus::lightning, an inline namespace (chorus::sync_ddp and chorus::lightning::sync_ddp are
// the same function).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/ddp.h"
#include "chorus/process_group.h"

namespace chorus {
inline namespace lightning {

// Collective: stacked (W, ...) like ProcessGroup::all_gather, but differentiable (Lightning's
// AllGatherGrad): in backward each rank receives the sum over ranks of the gradients that flowed
// into its own slice. Every rank must call backward through it.
at::Tensor all_gather_with_grad(const at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr);
// all_gather (with gradients when sync_grads) when distributed; t itself otherwise.
at::Tensor all_gather_ddp_if_available(const at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr,
                                       bool sync_grads = false);
// Collective: every rank's t, one tensor each; shapes may differ in any dimension.
std::vector<at::Tensor> gather_all_tensors(const at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr);
// Collective, in place (and returned): the reduction over the group; sum by default.
at::Tensor sync_ddp(at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr,
                    std::optional<ReduceOp> op = std::nullopt);
at::Tensor sync_ddp(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op);  // "sum" "mean" "avg" ...
// sync_ddp when distributed; t untouched otherwise.
at::Tensor sync_ddp_if_available(at::Tensor& t, std::shared_ptr<ProcessGroup> group = nullptr,
                                 std::optional<ReduceOp> op = std::nullopt);
at::Tensor sync_ddp_if_available(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op);

// Where a job's processes come from (Lightning's ClusterEnvironment). Subclass it for a custom
// cluster; DetectedEnvironment reads whatever launcher started the program.
class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  virtual bool creates_processes_externally() const = 0;
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int world_size() const = 0;
  virtual int global_rank() const = 0;
  virtual int local_rank() const = 0;
  virtual int node_rank() const = 0;
  // The address and port already serve a chorus store (a launcher hosts it): no rank serves one.
  virtual bool store_hosted() const { return false; }
};

class DetectedEnvironment : public ClusterEnvironment {
 public:
  DetectedEnvironment() : env_(Environment::detect()) {}
  explicit DetectedEnvironment(Environment env) : env_(std::move(env)) {}
  bool creates_processes_externally() const override { return env_.launcher != Launcher::Single; }
  std::string main_address() const override { return env_.master_addr; }
  int main_port() const override { return env_.master_port; }
  int world_size() const override { return env_.world_size; }
  int global_rank() const override { return env_.rank; }
  int local_rank() const override { return env_.local_rank; }
  int node_rank() const override { return env_.node_rank; }
  bool store_hosted() const override { return env_.store_hosted; }
  const Environment& environment() const { return env_; }

 private:
  Environment env_;
};

// Collective: the default group from a cluster environment (global_rank / world_size override
// it). Rank 0 serves the store on main_address():main_port() unless the environment hosts one.
// Returns the existing default group when one is initialized.
std::shared_ptr<ProcessGroup> init_dist_connection(const ClusterEnvironment& env, std::string backend = "auto",
                                                   std::optional<int> global_rank = {},
                                                   std::optional<int> world_size = {});

// Lightning's form: the hook takes its state explicitly; the wrapper is optional.
template <class State>
void register_ddp_comm_hook(DistributedDataParallel& model, std::shared_ptr<State> state,
                            std::function<c10::intrusive_ptr<c10::ivalue::Future>(State&, GradBucket&)> hook,
                            std::function<CommHook(CommHook)> wrapper = nullptr) {
  CommHook bound = [state, hook = std::move(hook)](GradBucket& b) { return hook(*state, b); };
  model.register_comm_hook(wrapper ? wrapper(std::move(bound)) : std::move(bound));
}

}  // namespace lightning
}  // namespace chorus
