// The model of chorus-sharded-bench and chorus-checkpoint-bench (and of
// bench/peers/torch_zero.py): Linear(H,H)-ReLU x6 then Linear(H,10), seed 0.
// H = 4096: 100.7M f32 parameters. Other depths (`layers`) give models of many small parameters.
#pragma once

#include <torch/torch.h>

#include <cstdint>

inline torch::nn::Sequential make_mlp(int64_t h, int layers = 6) {
  torch::manual_seed(0);
  torch::nn::Sequential m;
  for (int i = 0; i < layers; ++i) {
    m->push_back(torch::nn::Linear(h, h));
    m->push_back(torch::nn::ReLU());
  }
  m->push_back(torch::nn::Linear(h, 10));
  return m;
}

inline int64_t mlp_params(int64_t h, int layers = 6) { return layers * (h * h + h) + h * 10 + 10; }
