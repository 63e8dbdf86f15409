#include "replicas.h"

#include <mutex>
#include <unordered_map>

namespace chorus::detail {

namespace {
struct Replicas {
  std::mutex mu;
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<ProcessGroup>> groups;
};
Replicas& replicas() {
  static Replicas* r = new Replicas;
  return *r;
}
}  // namespace

std::shared_ptr<ProcessGroup> replica_group(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(replicas().mu);
  auto it = replicas().groups.find(t.unsafeGetTensorImpl());
  return it == replicas().groups.end() ? nullptr : it->second.lock();
}

void register_replicas(const std::vector<at::Tensor>& params, const std::shared_ptr<ProcessGroup>& group) {
  std::lock_guard<std::mutex> lock(replicas().mu);
  for (const auto& p : params) replicas().groups[p.unsafeGetTensorImpl()] = group;
}

void unregister_replicas(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(replicas().mu);
  for (const auto& p : params) replicas().groups.erase(p.unsafeGetTensorImpl());
}

}  // namespace chorus::detail
