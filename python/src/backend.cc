// chorus as a torch.distributed backend: a c10d::Backend over chorus's ProcessGroup, meeting its
// peers on the store torch hands the backend. Every collective torch.distributed 2.x has for CPU
// tensors, each a ProcessGroup operation; what chorus cannot do (sparse tensors, tensors off the
// CPU, dtypes it cannot move) is refused by ProcessGroup with an error naming the call, on every
// rank. Its Works: work.cc.
#include "backend.h"

#include <algorithm>

#include "work.h"

namespace chorus::python {

using detail::concat;

namespace {

// ---- the store: torch's (PrefixStore over env://, tcp://, file://, torchrun's agent store) ----

class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    guard("set", key, [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string get(const std::string& key) override {
    std::string out;
    guard("get", key, [&] {
      auto v = store_->get(key);
      out.assign(v.begin(), v.end());
    });
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t out = 0;
    guard("add", key, [&] { out = store_->add(key, delta); });
    return out;
  }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    std::string out;
    guard("compare_set", key, [&] {
      auto v = store_->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                                  std::vector<uint8_t>(desired.begin(), desired.end()));
      out.assign(v.begin(), v.end());
    });
    return out;
  }
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout) override {
    guard("wait", keys.empty() ? std::string() : keys.front(), [&] {
      if (timeout)
        store_->wait(keys, *timeout);
      else
        store_->wait(keys);
    });
  }
  bool check(const std::vector<std::string>& keys) override {
    bool out = false;
    guard("check", keys.empty() ? std::string() : keys.front(), [&] { out = store_->check(keys); });
    return out;
  }
  bool delete_key(const std::string& key) override {
    bool out = false;
    guard("delete_key", key, [&] { out = store_->deleteKey(key); });
    return out;
  }
  std::string describe() const override { return "torch's store"; }

 private:
  template <class F>
  void guard(const char* op, const std::string& key, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw StoreError(detail::concat("torch's store: ", op, " '", key, "' failed: ", e.what()));
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
};

// c10d's reduce op as chorus's, and what c10d wants on top of it afterwards: AVG on integers is a
// sum divided with truncation, as torch's other backends do (chorus's own mean refuses integers
// rather than truncate); PREMUL_SUM is a sum scaled by its factor.
struct Reduction {
  chorus::ReduceOp op;
  std::function<void(at::Tensor)> after;  // on the result, before the work finishes
};

Reduction reduction(const c10d::ReduceOp& op, at::ScalarType dtype, int world, const char* where) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return {chorus::ReduceOp::Sum, nullptr};
    case c10d::ReduceOp::AVG:
      if (!at::isIntegralType(dtype, /*includeBool=*/false)) return {chorus::ReduceOp::Mean, nullptr};
      return {chorus::ReduceOp::Sum, [world](at::Tensor t) { t.div_(world, "trunc"); }};
    case c10d::ReduceOp::PRODUCT: return {chorus::ReduceOp::Product, nullptr};
    case c10d::ReduceOp::MIN: return {chorus::ReduceOp::Min, nullptr};
    case c10d::ReduceOp::MAX: return {chorus::ReduceOp::Max, nullptr};
    case c10d::ReduceOp::BAND: return {chorus::ReduceOp::BitwiseAnd, nullptr};
    case c10d::ReduceOp::BOR: return {chorus::ReduceOp::BitwiseOr, nullptr};
    case c10d::ReduceOp::BXOR: return {chorus::ReduceOp::BitwiseXor, nullptr};
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* factor = dynamic_cast<const c10d::PreMulSumSupplement*>(op.supplement_.get());
      if (!factor) break;
      if (factor->tensor_factor.defined())
        return {chorus::ReduceOp::Sum, [f = factor->tensor_factor](at::Tensor t) { t.mul_(f.to(t.device())); }};
      return {chorus::ReduceOp::Sum, [f = factor->double_factor](at::Tensor t) { t.mul_(f); }};
    }
    default: break;
  }
  throw InvalidArgument(concat("chorus backend: ", where, ": reduce op ", int(op.op_), " is not supported"));
}

// `after` applied to each of `tensors` (the results of a reduction), as one `then`.
std::function<void()> on_results(const Reduction& r, std::vector<at::Tensor> tensors) {
  if (!r.after) return nullptr;
  return [after = r.after, tensors = std::move(tensors)] {
    for (const at::Tensor& t : tensors) after(t);
  };
}

at::Tensor& one(std::vector<at::Tensor>& tensors, const char* where) {
  if (tensors.size() != 1)
    throw InvalidArgument(concat("chorus backend: ", where, " takes one tensor per call, got ", tensors.size(),
                                 " (one tensor per device and process is all torch.distributed passes on the CPU)"));
  return tensors[0];
}

std::vector<at::Tensor>& one_list(std::vector<std::vector<at::Tensor>>& lists, const char* where) {
  if (lists.size() != 1)
    throw InvalidArgument(concat("chorus backend: ", where, " takes one list of tensors per call, got ", lists.size()));
  return lists[0];
}

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(std::shared_ptr<chorus::ProcessGroup> pg, std::chrono::milliseconds timeout)
    : c10d::Backend(pg->rank(), pg->size()), pg_(std::move(pg)), timeout_(timeout) {}

// Note [Closing under the GIL]
// torch drops a group (destroy_process_group, interpreter exit) on a thread that holds the GIL,
// and closing the communicator joins its executor. The executor, releasing a finished body, may
// free the last reference to a tensor Python made, and that takes the GIL: a deadlock, seen in
// torch's suite. So the teardown runs with the GIL released (run_teardown, set by the module),
// and it first waits for every submitted body, so that none of them (which hold this group) is
// left to drop the communicator on the executor's own thread.
ProcessGroupChorus::~ProcessGroupChorus() {
  run_teardown([this] {
    try {
      pg_->communicator().submit([] {})->wait();
    } catch (...) {  // an aborted group still ran what was queued; nothing more to wait for
    }
    pg_.reset();
  });
}

void ProcessGroupChorus::shutdown() {
  run_teardown([this] { pg_->communicator().shutdown(timeout_); });
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupChorus::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                             int size, std::chrono::milliseconds timeout,
                                                             const std::string& name, std::vector<int> global_ranks) {
  CommunicatorOptions options;
  options.backend = settings().backend;
  options.timeout = timeout;
  options.name = name;
  auto comm = Communicator::create(std::make_shared<C10dStore>(store), rank, size, options);
  if (global_ranks.empty())
    for (int r = 0; r < size; ++r) global_ranks.push_back(r);
  return c10::make_intrusive<ProcessGroupChorus>(std::make_shared<chorus::ProcessGroup>(comm, global_ranks), timeout);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupChorus::getBackendOptions() {
  return c10::make_intrusive<Options>("chorus", timeout_);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupChorus::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const std::vector<int>& ranks,
                                                            const c10::intrusive_ptr<Options>& opts) {
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;
  std::vector<int> global;
  std::string name = "split of '" + pg_->name() + "' = world ranks [";
  for (size_t i = 0; i < ranks.size(); ++i) {
    global.push_back(pg_->global_rank(ranks[i]));
    name += concat(i ? ", " : "", global.back());
  }
  return create(store, int(me - ranks.begin()), int(ranks.size()), opts ? opts->timeout : timeout_, name + "]", global);
}

at::Tensor ProcessGroupChorus::allocateTensor(long size, at::TensorOptions options) {
  return pg_->take_symmetric(size, options);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::issue(c10d::OpType type, const char* title,
                                                         std::vector<at::Tensor> outputs, bool sync,
                                                         const std::function<void(TensorAsyncOptions)>& start) {
  auto work = c10::make_intrusive<ChorusWork>(getRank(), type, title, std::move(outputs), sync);
  start({.handle = work->handle(), .on_caller = sync});
  if (sync) work->complete(work->chorus::Work::exception());  // it ran on this thread and finished
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE) ++sequence_;
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  if (coalescing_) block_.push_back(work);
  return work;
}

void ProcessGroupChorus::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  if (coalescing_)
    throw InvalidArgument("chorus backend: startCoalescing: a coalescing block is already open on this group");
  coalescing_ = true;
  block_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::endCoalescing() {
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  if (!coalescing_) throw InvalidArgument("chorus backend: endCoalescing without startCoalescing");
  coalescing_ = false;
  return c10::make_intrusive<BlockWork>(getRank(), std::move(block_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor& t = one(tensors, "broadcast");
  return issue(c10d::OpType::BROADCAST, "chorus:broadcast", tensors, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->broadcast_async(t, int(opts.rootRank), std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor& t = one(tensors, "all_reduce");
  Reduction r = reduction(opts.reduceOp, t.scalar_type(), getSize(), "all_reduce");
  return issue(c10d::OpType::ALLREDUCE, "chorus:all_reduce", tensors, !opts.asyncOp, [&](TensorAsyncOptions a) {
    a.then = on_results(r, {t});
    pg_->all_reduce_async(t, r.op, std::move(a));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_sparse(std::vector<at::Tensor>&,
                                                                    const c10d::AllreduceOptions&) {
  throw InvalidArgument(
      "chorus backend: all_reduce of a sparse tensor: chorus moves dense tensors; reduce t.to_dense() instead");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  // Integer AVG divides each integer tensor; every tensor takes the same chorus op.
  Reduction r = reduction(opts.reduceOp, tensors.empty() ? at::kFloat : tensors[0].scalar_type(), getSize(),
                          "all_reduce_coalesced");
  std::vector<at::Tensor> integers;
  for (const at::Tensor& t : tensors) {
    Reduction mine = reduction(opts.reduceOp, t.scalar_type(), getSize(), "all_reduce_coalesced");
    if (mine.op != r.op)
      throw InvalidArgument(
          "chorus backend: all_reduce_coalesced with AVG takes integer or floating tensors, not both");
    if (mine.after) integers.push_back(t);
  }
  return issue(c10d::OpType::ALLREDUCE_COALESCED, "chorus:all_reduce_coalesced", tensors, !opts.asyncOp,
               [&](TensorAsyncOptions a) {
                 a.then = on_results(r, integers.empty() ? tensors : integers);
                 pg_->all_reduce_coalesced_async(tensors, r.op, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor& t = one(tensors, "reduce");
  Reduction r = reduction(opts.reduceOp, t.scalar_type(), getSize(), "reduce");
  const int root = int(opts.rootRank);
  return issue(c10d::OpType::REDUCE, "chorus:reduce", tensors, !opts.asyncOp, [&](TensorAsyncOptions a) {
    if (getRank() == root) a.then = on_results(r, {t});
    pg_->reduce_async(t, root, r.op, std::move(a));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  at::Tensor& t = one(inputs, "all_gather");
  std::vector<at::Tensor>& out = one_list(outputs, "all_gather");
  return issue(c10d::OpType::ALLGATHER, "chorus:all_gather", out, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->all_gather_async(out, t, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  return issue(c10d::OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {output}, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->all_gather_into_async(output, input, std::move(a)); });
}

// torch's all_gather_coalesced: outputs[r][i] is rank r's inputs[i]. Each input gathered into
// one staging tensor per input, then viewed out per rank.
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  if (int(outputs.size()) != getSize())
    throw InvalidArgument(concat("chorus backend: ", op, " needs ", getSize(), " output lists, got ", outputs.size()));
  for (size_t r = 0; r < outputs.size(); ++r)
    if (outputs[r].size() != inputs.size())
      throw InvalidArgument(concat("chorus backend: ", op, ": output list ", r, " has ", outputs[r].size(),
                                   " tensors for ", inputs.size(), " inputs"));
  std::vector<at::Tensor> gathered, flat_outputs;
  for (const at::Tensor& t : inputs)
    gathered.push_back(at::empty({getSize() * t.numel()}, t.options().memory_format(at::MemoryFormat::Contiguous)));
  for (auto& list : outputs) flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
  return issue(c10d::OpType::ALLGATHER_COALESCED, "chorus:all_gather_coalesced", flat_outputs, !opts.asyncOp,
               [&](TensorAsyncOptions a) {
                 a.then = [outputs, gathered, inputs] {
                   for (size_t r = 0; r < outputs.size(); ++r)
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       const int64_t n = inputs[i].numel();
                       at::Tensor dst = outputs[r][i];
                       dst.copy_(gathered[i].slice(0, int64_t(r) * n, int64_t(r + 1) * n).view(dst.sizes()));
                     }
                 };
                 pg_->all_gather_into_coalesced_async(gathered, inputs, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                   std::vector<at::Tensor>& inputs,
                                                                                   const c10d::AllgatherOptions& opts) {
  return issue(c10d::OpType::COALESCED, "chorus:all_gather_into_tensor_coalesced", outputs, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->all_gather_into_coalesced_async(outputs, inputs, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  at::Tensor& t = one(inputs, "gather");
  const int root = int(opts.rootRank);
  std::vector<at::Tensor> out;
  if (getRank() == root) out = one_list(outputs, "gather");
  return issue(c10d::OpType::GATHER, "chorus:gather", out, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->gather_async(out, t, root, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  at::Tensor& t = one(outputs, "scatter");
  const int root = int(opts.rootRank);
  std::vector<at::Tensor> in;
  if (getRank() == root) in = one_list(inputs, "scatter");
  return issue(c10d::OpType::SCATTER, "chorus:scatter", outputs, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->scatter_async(t, in, root, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  at::Tensor& t = one(outputs, "reduce_scatter");
  std::vector<at::Tensor>& in = one_list(inputs, "reduce_scatter");
  Reduction r = reduction(opts.reduceOp, t.scalar_type(), getSize(), "reduce_scatter");
  return issue(c10d::OpType::REDUCE_SCATTER, "chorus:reduce_scatter", outputs, !opts.asyncOp,
               [&](TensorAsyncOptions a) {
                 a.then = on_results(r, {t});
                 pg_->reduce_scatter_async(t, in, r.op, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  Reduction r = reduction(opts.reduceOp, input.scalar_type(), getSize(), "reduce_scatter_tensor");
  return issue(c10d::OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {output}, !opts.asyncOp,
               [&](TensorAsyncOptions a) {
                 a.then = on_results(r, {output});
                 pg_->reduce_scatter_into_async(output, input, r.op, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  Reduction r = reduction(opts.reduceOp, inputs.empty() ? at::kFloat : inputs[0].scalar_type(), getSize(), op);
  for (const at::Tensor& t : inputs)
    if (reduction(opts.reduceOp, t.scalar_type(), getSize(), op).op != r.op)
      throw InvalidArgument(concat("chorus backend: ", op, " with AVG takes integer or floating tensors, not both"));
  return issue(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "chorus:reduce_scatter_tensor_coalesced", outputs,
               !opts.asyncOp, [&](TensorAsyncOptions a) {
                 a.then = on_results(r, outputs);
                 pg_->reduce_scatter_into_coalesced_async(outputs, inputs, r.op, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  return issue(c10d::OpType::ALLTOALL_BASE, "chorus:all_to_all_single", {output}, !opts.asyncOp,
               [&](TensorAsyncOptions a) {
                 pg_->all_to_all_into_async(output, input, output_splits, input_splits, std::move(a));
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  return issue(c10d::OpType::ALLTOALL, "chorus:all_to_all", outputs, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->all_to_all_async(outputs, inputs, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor& t = one(tensors, "send");
  return issue(c10d::OpType::SEND, "chorus:send", tensors, false,
               [&](TensorAsyncOptions a) { pg_->send_async(t, dst, tag, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor& t = one(tensors, "recv");
  return issue(c10d::OpType::RECV, "chorus:recv", tensors, false,
               [&](TensorAsyncOptions a) { pg_->recv_async(t, src, tag, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  at::Tensor& t = one(tensors, "recv");
  return issue(c10d::OpType::RECVANYSOURCE, "chorus:recv_any_source", tensors, false,
               [&](TensorAsyncOptions a) { pg_->recv_any_async(t, tag, std::move(a)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions& opts) {
  return issue(c10d::OpType::BARRIER, "chorus:barrier", {}, !opts.asyncOp,
               [&](TensorAsyncOptions a) { pg_->barrier_async(std::move(a)); });
}

}  // namespace chorus::python
