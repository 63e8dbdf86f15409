// Optimizer state for checkpoints: each LibTorch optimizer's options and per-parameter state as
// names, tensors and numbers, and back (optimizers.h).
#include "parallel/checkpoint/optimizers.h"

#include <torch/optim.h>

#include "groups/tensor_util.h"

namespace chorus::detail::checkpoint {

namespace optim = torch::optim;

namespace {

using Dict = c10::impl::GenericDict;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

at::Tensor take(const std::map<std::string, at::Tensor>& t, const std::string& name) {
  auto it = t.find(name);
  return it == t.end() ? at::Tensor() : it->second;
}
double num(const Dict& d, const char* k) { return d.at(k).toDouble(); }

template <class Options>
Dict adam_like_options(optim::OptimizerOptions& o) {
  auto& a = static_cast<Options&>(o);
  Dict d = new_dict();
  d.insert("lr", a.lr());
  d.insert("betas", c10::ivalue::Tuple::create(std::get<0>(a.betas()), std::get<1>(a.betas())));
  d.insert("eps", a.eps());
  d.insert("weight_decay", a.weight_decay());
  d.insert("amsgrad", a.amsgrad());
  return d;
}
template <class Options>
void set_adam_like_options(optim::OptimizerOptions& o, const Dict& d) {
  auto& a = static_cast<Options&>(o);
  auto betas = d.at("betas").toTuple();
  a.lr(num(d, "lr")).eps(num(d, "eps")).weight_decay(num(d, "weight_decay")).amsgrad(d.at("amsgrad").toBool());
  a.betas(std::make_tuple(betas->elements()[0].toDouble(), betas->elements()[1].toDouble()));
}
template <class State>
Codec adam_like(const std::string& type, std::function<bool(optim::Optimizer&)> is,
                std::function<Dict(optim::OptimizerOptions&)> options,
                std::function<void(optim::OptimizerOptions&, const Dict&)> set_options) {
  return Codec{.type = type,
               .is = std::move(is),
               .options = std::move(options),
               .set_options = std::move(set_options),
               .tensors =
                   [](optim::OptimizerParamState& s) {
                     auto& a = static_cast<State&>(s);
                     return Tensors{{"exp_avg", a.exp_avg()},
                                    {"exp_avg_sq", a.exp_avg_sq()},
                                    {"max_exp_avg_sq", a.max_exp_avg_sq()}};
                   },
               .step = [](optim::OptimizerParamState& s) { return static_cast<State&>(s).step(); },
               .make =
                   [](const std::map<std::string, at::Tensor>& t, int64_t step) {
                     auto s = std::make_unique<State>();
                     s->step(step).exp_avg(take(t, "exp_avg")).exp_avg_sq(take(t, "exp_avg_sq"));
                     s->max_exp_avg_sq(take(t, "max_exp_avg_sq"));
                     return std::unique_ptr<optim::OptimizerParamState>(std::move(s));
                   }};
}

const std::vector<Codec>& codecs() {
  static const std::vector<Codec> all = [] {
    std::vector<Codec> v;
    v.push_back(
        Codec{.type = "SGD",
              .is = [](optim::Optimizer& o) { return dynamic_cast<optim::SGD*>(&o) != nullptr; },
              .options =
                  [](optim::OptimizerOptions& o) {
                    auto& a = static_cast<optim::SGDOptions&>(o);
                    Dict d = new_dict();
                    d.insert("lr", a.lr());
                    d.insert("momentum", a.momentum());
                    d.insert("dampening", a.dampening());
                    d.insert("weight_decay", a.weight_decay());
                    d.insert("nesterov", a.nesterov());
                    return d;
                  },
              .set_options =
                  [](optim::OptimizerOptions& o, const Dict& d) {
                    static_cast<optim::SGDOptions&>(o)
                        .lr(num(d, "lr"))
                        .momentum(num(d, "momentum"))
                        .dampening(num(d, "dampening"))
                        .weight_decay(num(d, "weight_decay"))
                        .nesterov(d.at("nesterov").toBool());
                  },
              .tensors =
                  [](optim::OptimizerParamState& s) {
                    return Tensors{{"momentum_buffer", static_cast<optim::SGDParamState&>(s).momentum_buffer()}};
                  },
              .step = [](optim::OptimizerParamState&) { return int64_t(-1); },
              .make =
                  [](const std::map<std::string, at::Tensor>& t, int64_t) {
                    auto s = std::make_unique<optim::SGDParamState>();
                    s->momentum_buffer(take(t, "momentum_buffer"));
                    return std::unique_ptr<optim::OptimizerParamState>(std::move(s));
                  }});
    // AdamW derives from neither Adam nor the other way round: each is its own type.
    v.push_back(adam_like<optim::AdamParamState>(
        "Adam", [](optim::Optimizer& o) { return dynamic_cast<optim::Adam*>(&o) != nullptr; },
        adam_like_options<optim::AdamOptions>, set_adam_like_options<optim::AdamOptions>));
    v.push_back(adam_like<optim::AdamWParamState>(
        "AdamW", [](optim::Optimizer& o) { return dynamic_cast<optim::AdamW*>(&o) != nullptr; },
        adam_like_options<optim::AdamWOptions>, set_adam_like_options<optim::AdamWOptions>));
    v.push_back(
        Codec{.type = "Adagrad",
              .is = [](optim::Optimizer& o) { return dynamic_cast<optim::Adagrad*>(&o) != nullptr; },
              .options =
                  [](optim::OptimizerOptions& o) {
                    auto& a = static_cast<optim::AdagradOptions&>(o);
                    Dict d = new_dict();
                    d.insert("lr", a.lr());
                    d.insert("lr_decay", a.lr_decay());
                    d.insert("weight_decay", a.weight_decay());
                    d.insert("initial_accumulator_value", a.initial_accumulator_value());
                    d.insert("eps", a.eps());
                    return d;
                  },
              .set_options =
                  [](optim::OptimizerOptions& o, const Dict& d) {
                    static_cast<optim::AdagradOptions&>(o)
                        .lr(num(d, "lr"))
                        .lr_decay(num(d, "lr_decay"))
                        .weight_decay(num(d, "weight_decay"))
                        .initial_accumulator_value(num(d, "initial_accumulator_value"))
                        .eps(num(d, "eps"));
                  },
              .tensors =
                  [](optim::OptimizerParamState& s) {
                    return Tensors{{"sum", static_cast<optim::AdagradParamState&>(s).sum()}};
                  },
              .step = [](optim::OptimizerParamState& s) { return static_cast<optim::AdagradParamState&>(s).step(); },
              .make =
                  [](const std::map<std::string, at::Tensor>& t, int64_t step) {
                    auto s = std::make_unique<optim::AdagradParamState>();
                    s->sum(take(t, "sum")).step(step);
                    return std::unique_ptr<optim::OptimizerParamState>(std::move(s));
                  }});
    v.push_back(Codec{
        .type = "RMSprop",
        .is = [](optim::Optimizer& o) { return dynamic_cast<optim::RMSprop*>(&o) != nullptr; },
        .options =
            [](optim::OptimizerOptions& o) {
              auto& a = static_cast<optim::RMSpropOptions&>(o);
              Dict d = new_dict();
              d.insert("lr", a.lr());
              d.insert("alpha", a.alpha());
              d.insert("eps", a.eps());
              d.insert("weight_decay", a.weight_decay());
              d.insert("momentum", a.momentum());
              d.insert("centered", a.centered());
              return d;
            },
        .set_options =
            [](optim::OptimizerOptions& o, const Dict& d) {
              static_cast<optim::RMSpropOptions&>(o)
                  .lr(num(d, "lr"))
                  .alpha(num(d, "alpha"))
                  .eps(num(d, "eps"))
                  .weight_decay(num(d, "weight_decay"))
                  .momentum(num(d, "momentum"))
                  .centered(d.at("centered").toBool());
            },
        .tensors =
            [](optim::OptimizerParamState& s) {
              auto& a = static_cast<optim::RMSpropParamState&>(s);
              return Tensors{
                  {"square_avg", a.square_avg()}, {"momentum_buffer", a.momentum_buffer()}, {"grad_avg", a.grad_avg()}};
            },
        .step = [](optim::OptimizerParamState& s) { return static_cast<optim::RMSpropParamState&>(s).step(); },
        .make =
            [](const std::map<std::string, at::Tensor>& t, int64_t step) {
              auto s = std::make_unique<optim::RMSpropParamState>();
              s->step(step).square_avg(take(t, "square_avg"));
              s->momentum_buffer(take(t, "momentum_buffer")).grad_avg(take(t, "grad_avg"));
              return std::unique_ptr<optim::OptimizerParamState>(std::move(s));
            }});
    return v;
  }();
  return all;
}

}  // namespace

const Codec& codec_of(optim::Optimizer& o, const std::string& item) {
  for (const auto& c : codecs())
    if (c.is(o)) return c;
  throw InvalidArgument(concat("CheckpointState: optimizer '", item, "' is of a type checkpoints cannot restore (",
                               typeid(o).name(), "); they know SGD, Adam, AdamW, Adagrad and RMSprop"));
}

void* state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

}  // namespace chorus::detail::checkpoint
