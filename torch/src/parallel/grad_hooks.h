// The autograd plumbing DistributedDataParallel and ShardedDataParallel share: a call after each
// parameter's gradient is accumulated, and one at the end of the running backward pass. Both
// reach their owner through a weak_ptr, so a wrapper destroyed while a graph still holds its
// hooks is simply not called.
#pragma once

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace chorus::detail {

// Post-hooks on the gradient accumulators of some parameters, removed when this goes. The
// accumulators are kept alive meanwhile (a parameter's own reference to it is weak).
class GradReadyHooks {
 public:
  GradReadyHooks() = default;
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;
  ~GradReadyHooks() { clear(); }

  // Removes every hook added.
  void clear() {
    for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
    hooks_.clear();
  }

  // After `param`'s gradient is accumulated: (owner->*ready)(index), while owner lives.
  template <class Owner>
  void add(const at::Tensor& param, std::weak_ptr<Owner> owner, void (Owner::*ready)(size_t), size_t index) {
    struct Hook : torch::autograd::FunctionPostHook {
      Hook(std::weak_ptr<Owner> o, void (Owner::*f)(size_t), size_t i) : owner(std::move(o)), fn(f), index(i) {}
      torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                                const torch::autograd::variable_list& /*inputs*/) override {
        if (auto o = owner.lock()) ((*o).*fn)(index);
        return outputs;
      }
      std::weak_ptr<Owner> owner;
      void (Owner::*fn)(size_t);
      size_t index;
    };
    auto acc = torch::autograd::impl::grad_accumulator(param);
    const uintptr_t key = acc->add_post_hook(std::make_unique<Hook>(std::move(owner), ready, index));
    hooks_.emplace_back(std::move(acc), key);
  }

 private:
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

// (owner->*fn)() once the running backward pass is done (autograd's final callbacks), while owner
// lives. Call it from inside a backward pass.
template <class Owner>
void at_backward_end(std::weak_ptr<Owner> owner, void (Owner::*fn)()) {
  torch::autograd::Engine::get_default_engine().queue_callback([owner = std::move(owner), fn] {
    if (auto o = owner.lock()) ((*o).*fn)();
  });
}

}  // namespace chorus::detail
