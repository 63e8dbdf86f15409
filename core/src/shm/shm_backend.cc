// The shared-memory Backend: one ShmGroup per communicator, calls dispatched to the algorithm
// files, failures published so peers stop waiting.
#include "chorus/core/error.h"
#include "shm/algorithms.h"

namespace chorus {
namespace shm {
namespace {

class ShmBackend : public Backend {
 public:
  ShmBackend(Store& store, int rank, int size, const BackendOptions& options) : g_(store, rank, size, options) {}
  std::string name() const override { return "shm"; }

  void run(const Call& c) override {
    if (point_to_point(c.kind)) {
      if (!c.invalid.empty()) throw InvalidArgument(c.invalid);
      if (c.kind == OpKind::RecvAny) return recv_any(g_, c);
      return c.kind == OpKind::Send ? send(g_, c) : recv(g_, c);
    }
    g_.start(c);
    if (c.compare_only) return g_.sync();
    switch (c.kind) {
      case OpKind::Barrier:
      case OpKind::Split: return g_.sync();
      case OpKind::AllReduce:
      case OpKind::Reduce: return all_reduce(g_, c);
      case OpKind::Broadcast: return broadcast(g_, c);
      case OpKind::AllGather:
      case OpKind::AllGatherV:
      case OpKind::Gather:
      case OpKind::GatherV: return gather(g_, c);
      case OpKind::Scatter: return scatter(g_, c);
      case OpKind::ReduceScatter: return reduce_scatter(g_, c);
      case OpKind::AllToAll:
      case OpKind::AllToAllV: return all_to_all(g_, c);
      case OpKind::Send:
      case OpKind::Recv:
      case OpKind::RecvAny:
      case OpKind::AllocSymmetric: break;  // not through run()
    }
  }

  SymmetricMemory alloc_symmetric(const Call& c) override { return shm::alloc_symmetric(g_, c); }

  void abort(const std::exception_ptr& cause) override { g_.abort(abort_cause(cause)); }

  void finish(Clock::time_point deadline) override { g_.finish(deadline); }

 private:
  ShmGroup g_;
};

}  // namespace
}  // namespace shm

std::unique_ptr<Backend> make_shm_backend(Store& store, int rank, int size, const BackendOptions& options) {
  return std::make_unique<shm::ShmBackend>(store, rank, size, options);
}

}  // namespace chorus
