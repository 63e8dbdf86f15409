// Lightning-style utilities, and the differentiable all_gather.
#include "chorus/lightning.h"

#include <torch/csrc/autograd/custom_function.h>

namespace chorus {

using detail::concat;

namespace {

// Note [AllGatherGrad]: forward stacks every rank's tensor; a rank's tensor influenced every
// rank's loss through its slice, so its gradient is the sum over ranks of the gradient of that
// slice: all_reduce(sum) the whole incoming gradient and keep our own slice.
struct AllGatherGrad : public torch::autograd::Function<AllGatherGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t,
                            std::shared_ptr<ProcessGroup> group) {
    ProcessGroup& g = group_or_default(group);
    ctx->saved_data["rank"] = int64_t(g.rank());
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(std::move(group)));
    return g.all_gather(t);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
    at::Tensor grad = grads[0].contiguous().clone();
    group_or_default(holder->group).all_reduce_(grad, ReduceOp::Sum);
    return {grad[ctx->saved_data["rank"].toInt()], at::Tensor()};
  }
  struct GroupHolder : torch::CustomClassHolder {
    explicit GroupHolder(std::shared_ptr<ProcessGroup> g) : group(std::move(g)) {}
    std::shared_ptr<ProcessGroup> group;
  };
};

}  // namespace

inline namespace lightning {

at::Tensor all_gather_with_grad(const at::Tensor& t, std::shared_ptr<ProcessGroup> group) {
  return AllGatherGrad::apply(t, std::move(group));
}

at::Tensor all_gather_ddp_if_available(const at::Tensor& t, std::shared_ptr<ProcessGroup> group, bool sync_grads) {
  if (!is_initialized()) return t;
  if (sync_grads) return all_gather_with_grad(t, std::move(group));
  at::NoGradGuard no_grad;
  return group_or_default(group).all_gather(t);
}

std::vector<at::Tensor> gather_all_tensors(const at::Tensor& t, std::shared_ptr<ProcessGroup> group) {
  if (!group && !is_initialized()) return {t};
  return group_or_default(group).all_gather_v(t);
}

at::Tensor sync_ddp(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::optional<ReduceOp> op) {
  group_or_default(group).all_reduce_(t, op.value_or(ReduceOp::Sum));
  return t;
}

at::Tensor sync_ddp(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op) {
  return sync_ddp(t, std::move(group), parse_reduce_op(op));
}

at::Tensor sync_ddp_if_available(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::optional<ReduceOp> op) {
  if (!group && !(is_initialized() && default_group()->size() > 1)) return t;  // no group with peers
  return sync_ddp(t, std::move(group), op);
}

at::Tensor sync_ddp_if_available(at::Tensor& t, std::shared_ptr<ProcessGroup> group, std::string_view op) {
  return sync_ddp_if_available(t, std::move(group), parse_reduce_op(op));
}

std::shared_ptr<ProcessGroup> init_dist_connection(const ClusterEnvironment& env, std::string backend,
                                                   std::optional<int> global_rank, std::optional<int> world_size) {
  if (is_initialized()) return default_group();
  Environment e;
  e.rank = global_rank.value_or(env.global_rank());
  e.world_size = world_size.value_or(env.world_size());
  e.local_rank = env.local_rank();
  e.node_rank = env.node_rank();
  e.master_addr = env.main_address();
  e.master_port = env.main_port();
  e.store_hosted = env.store_hosted();
  e.launcher = env.creates_processes_externally() ? Launcher::Env : Launcher::Single;
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
    throw InvalidArgument(concat("init_dist_connection: global rank ", e.rank, " is not in [0, ", e.world_size, ")"));
  InitOptions options;
  options.backend = std::move(backend);
  return init_process_group(e, options);
}

}  // namespace lightning
}  // namespace chorus
