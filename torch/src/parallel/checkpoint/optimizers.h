// Optimizer state for checkpoints: the LibTorch optimizers chorus can save and restore (SGD,
// Adam, AdamW, Adagrad, RMSprop), each as a codec between its typed options and per-parameter
// state and names, tensors and numbers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace chorus::detail::checkpoint {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

struct Codec {
  std::string type;  // "Adam"
  std::function<bool(torch::optim::Optimizer&)> is;
  std::function<c10::impl::GenericDict(torch::optim::OptimizerOptions&)> options;
  std::function<void(torch::optim::OptimizerOptions&, const c10::impl::GenericDict&)> set_options;
  std::function<Tensors(torch::optim::OptimizerParamState&)> tensors;  // undefined ones included
  std::function<int64_t(torch::optim::OptimizerParamState&)> step;     // -1: the state has none
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const std::map<std::string, at::Tensor>&, int64_t)>
      make;
};

// The codec of o's type; InvalidArgument naming `item` and the type when there is none.
const Codec& codec_of(torch::optim::Optimizer& o, const std::string& item);

// The key of p's state in Optimizer::state().
void* state_key(const at::Tensor& p);

}  // namespace chorus::detail::checkpoint
