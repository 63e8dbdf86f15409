#include "groups/process_group/symmetric_pool.h"

namespace chorus::detail {

at::Tensor symmetric_tensor(Communicator& comm, int64_t numel, const at::TensorOptions& options) {
  SymmetricMemory mem = comm.alloc_symmetric(size_t(numel) * options.dtype().itemsize());
  void* data = mem.data();
  return at::from_blob(
      data, {numel}, [mem = std::move(mem)](void*) {}, options);
}

SymmetricArena::SymmetricArena(at::Tensor memory) : memory_(std::move(memory)) {
  if (memory_.numel() > 0) free_[0] = memory_.numel();
}

int64_t SymmetricArena::footprint(int64_t numel, const at::TensorOptions& options) {
  constexpr int64_t kAlign = 64;  // every tensor starts on a cache line
  return std::max<int64_t>(1, (numel * int64_t(options.dtype().itemsize()) + kAlign - 1) / kAlign) * kAlign;
}

at::Tensor SymmetricArena::take(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = footprint(numel, options);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const int64_t at = it->first, left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_[at + bytes] = left;
    auto* data = static_cast<uint8_t*>(memory_.data_ptr()) + at;
    return at::from_blob(
        data, {numel}, [arena = shared_from_this(), at, bytes](void*) { arena->give_back(at, bytes); },
        options.requires_grad(false));
  }
  return {};
}

void SymmetricArena::give_back(int64_t at, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + bytes) {  // joins the range after it
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      prev->second += bytes;
      return;
    }
  }
  free_[at] = bytes;
}

at::Tensor SymmetricPool::take(Communicator& comm, int64_t numel, const at::TensorOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  at::Tensor found;
  for (const auto& a : arenas_)
    if ((found = a->take(numel, options)).defined()) break;
  int32_t room = found.defined() ? 1 : 0;
  comm.all_reduce(&room, &room, 1, DataType::Int32, ReduceOp::Min);
  if (room == 1) return found;
  found.reset();  // its range goes back: every rank takes from the new arena
  const int64_t bytes = std::max(SymmetricArena::footprint(numel, options), kArenaBytes);
  arenas_.push_back(std::make_shared<SymmetricArena>(symmetric_tensor(comm, bytes, at::kByte)));
  return arenas_.back()->take(numel, options);
}

}  // namespace chorus::detail
