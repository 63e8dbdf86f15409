#include "chorus/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/Dict.h>

#include "chorus/core/error.h"

namespace chorus {

using detail::concat;

namespace {
void check_place(int num_replicas, int rank) {
  if (num_replicas < 1)
    throw InvalidArgument(concat("DistributedSampler: num_replicas ", num_replicas, " must be >= 1"));
  if (rank < 0 || rank >= num_replicas)
    throw InvalidArgument(concat("DistributedSampler: rank ", rank, " is not in [0, ", num_replicas, ")"));
}
}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : size_(dataset_size), replicas_(num_replicas), rank_(rank), options_(options) {
  if (dataset_size < 0) throw InvalidArgument(concat("DistributedSampler: dataset size ", dataset_size, " < 0"));
  check_place(num_replicas, rank);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch != epoch_) position_ = 0;
  epoch_ = epoch;
}

void DistributedSampler::set_replicas(int num_replicas, int rank) {
  check_place(num_replicas, rank);
  replicas_ = num_replicas;
  rank_ = rank;
}

int64_t DistributedSampler::size() const {
  const int64_t left = remaining();
  if (left <= 0) return 0;
  return options_.drop_last ? left / replicas_ : (left + replicas_ - 1) / replicas_;
}

at::Tensor DistributedSampler::indices() const {
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  at::Tensor order;
  if (options_.shuffle) {
    auto gen = at::detail::createCPUGenerator(options_.seed + uint64_t(epoch_));
    order = at::randperm(size_, gen, i64);
  } else {
    order = at::arange(size_, i64);
  }
  at::Tensor rest = order.slice(0, position_, size_);
  const int64_t per_rank = size(), total = per_rank * replicas_;
  if (total > rest.size(0) && rest.size(0) > 0) {  // pad by repeating the start, as torch does
    const int64_t copies = (total + rest.size(0) - 1) / rest.size(0);
    rest = rest.repeat({copies}).slice(0, 0, total);
  }
  return rest.slice(0, rank_, total, replicas_).contiguous();
}

void DistributedSampler::advance(int64_t per_rank) {
  if (per_rank < 0) throw InvalidArgument(concat("DistributedSampler::advance: ", per_rank, " < 0"));
  position_ = std::min(size_, position_ + per_rank * replicas_);
}

c10::IValue DistributedSampler::state_dict() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("epoch", epoch_);
  d.insert("position", position_);
  d.insert("dataset_size", size_);
  d.insert("seed", int64_t(options_.seed));
  d.insert("shuffle", options_.shuffle);
  d.insert("drop_last", options_.drop_last);
  return d;
}

void DistributedSampler::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) throw InvalidArgument("DistributedSampler::load_state_dict: not a dict");
  const auto d = state.toGenericDict();
  auto field = [&](const char* name) {
    if (!d.contains(name)) throw InvalidArgument(concat("DistributedSampler::load_state_dict: no '", name, "'"));
    return d.at(name);
  };
  auto same = [&](const char* name, auto mine, auto theirs) {
    if (mine != theirs)
      throw InvalidArgument(concat("DistributedSampler::load_state_dict: the checkpoint's ", name, " is ", theirs,
                                   ", this sampler's ", mine));
  };
  same("dataset_size", size_, field("dataset_size").toInt());
  same("seed", int64_t(options_.seed), field("seed").toInt());
  same("shuffle", options_.shuffle, field("shuffle").toBool());
  same("drop_last", options_.drop_last, field("drop_last").toBool());
  const int64_t position = field("position").toInt();
  if (position < 0 || position > size_)
    throw InvalidArgument(
        concat("DistributedSampler::load_state_dict: position ", position, " is outside [0, ", size_, "]"));
  epoch_ = field("epoch").toInt();
  position_ = position;
}

}  // namespace chorus
