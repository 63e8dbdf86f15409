// chorus as a torch.distributed backend (issue 19), first cut: a c10d::ProcessGroup over chorus's
// ProcessGroup, meeting its peers on the store torch hands the backend. Built only with
// -DCHORUS_BUILD_PYTHON=ON while it grows; the ops it does not serve yet raise an error naming them.
//
// Note [Completing futures]
// c10d's futures run their .then() callbacks on the thread that completes them, and DDP comm hooks
// (PowerSGD) issue and wait for further collectives inside those callbacks. chorus finishes work
// on its executor thread, which must never block, so a finished chorus work only hands its
// completion to a pool of completer threads; the pool grows when every completer is busy (a
// callback waiting on another collective), so a completion never waits behind the callback
// that waits for it. A thread that waits for the work (Work::wait, the common synchronous call)
// completes the future itself as soon as chorus's work finished, whichever comes first.
#include "backend.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace chorus::python {

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

// ---- completions (Note [Completing futures]) -------------------------------------------------

class Completer {
 public:
  static Completer& get() {
    static Completer* c = new Completer;  // never destroyed: its threads outlive static destructors
    return *c;
  }
  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(fn));
    if (idle_ == 0) {
      ++threads_;
      std::thread([this] { loop(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !tasks_.empty(); });
      --idle_;
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0, threads_ = 0;
};

class ChorusWork : public c10d::Work {
 public:
  ChorusWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs)
      : Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  // Completes this work when `work` finishes: `then` (copies into the caller's tensors) runs on a
  // completer thread first.
  static c10::intrusive_ptr<ChorusWork> track(int rank, c10d::OpType type, const char* title,
                                              std::vector<at::Tensor> outputs, std::shared_ptr<chorus::Work> work,
                                              std::function<void()> then = nullptr) {
    auto self = c10::make_intrusive<ChorusWork>(rank, type, title, std::move(outputs));
    self->work_ = work;
    self->then_ = std::move(then);
    work->on_finish(
        [self](std::exception_ptr error) { Completer::get().post([self, error] { self->complete(error); }); });
    return self;
  }

  // Once, by whichever comes first: a completer thread, or a thread waiting in wait() (which then
  // runs the future's callbacks itself, one thread hand-off sooner).
  void complete(std::exception_ptr error) {
    if (claimed_.exchange(true)) return;
    if (!error && then_) try {
        then_();
      } catch (...) {
        error = std::current_exception();
      }
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      work_->wait(timeout == ::kNoTimeout ? std::nullopt : std::optional<std::chrono::milliseconds>(timeout));
      complete(nullptr);
    } catch (const TimeoutError&) {
      if (!work_->is_completed()) throw;  // the deadline passed; the work goes on
      complete(work_->exception());
    } catch (...) {
      complete(std::current_exception());
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<chorus::Work> work_;
  std::function<void()> then_;
  std::atomic<bool> claimed_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

chorus::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* where) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return chorus::ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return chorus::ReduceOp::Mean;
    case c10d::ReduceOp::PRODUCT: return chorus::ReduceOp::Product;
    case c10d::ReduceOp::MIN: return chorus::ReduceOp::Min;
    case c10d::ReduceOp::MAX: return chorus::ReduceOp::Max;
    case c10d::ReduceOp::BAND: return chorus::ReduceOp::BitwiseAnd;
    case c10d::ReduceOp::BOR: return chorus::ReduceOp::BitwiseOr;
    case c10d::ReduceOp::BXOR: return chorus::ReduceOp::BitwiseXor;
    default: break;
  }
  throw InvalidArgument(detail::concat("chorus backend: ", where, ": this reduce op is not supported"));
}

at::Tensor& one(std::vector<at::Tensor>& tensors, const char* where) {
  if (tensors.size() != 1)
    throw InvalidArgument(
        detail::concat("chorus backend: ", where, " takes one tensor per call, got ", tensors.size()));
  const at::Tensor& t = tensors[0];
  if (!t.device().is_cpu() || t.is_sparse())
    throw InvalidArgument(detail::concat("chorus backend: ", where, ": only dense CPU tensors, got ",
                                         t.is_sparse() ? "a sparse tensor" : t.device().str()));
  return tensors[0];
}

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(std::shared_ptr<chorus::ProcessGroup> pg)
    : c10d::ProcessGroup(pg->rank(), pg->size()), pg_(std::move(pg)) {}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupChorus::create(const c10::intrusive_ptr<c10d::Store>& store,
                                                                  int rank, int size, std::chrono::milliseconds timeout,
                                                                  const std::string& name) {
  CommunicatorOptions options;
  if (const char* b = std::getenv("CHORUS_BACKEND")) options.backend = b;
  options.timeout = timeout;
  options.name = name;
  auto comm = Communicator::create(std::make_shared<C10dStore>(store), rank, size, options);
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[size_t(r)] = r;
  return c10::make_intrusive<ProcessGroupChorus>(std::make_shared<chorus::ProcessGroup>(comm, ranks));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor& t = one(tensors, "broadcast");
  return ChorusWork::track(getRank(), c10d::OpType::BROADCAST, "chorus:broadcast", tensors,
                           pg_->broadcast_async(t, int(opts.rootRank)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor& t = one(tensors, "all_reduce");
  return ChorusWork::track(getRank(), c10d::OpType::ALLREDUCE, "chorus:all_reduce", tensors,
                           pg_->all_reduce_async(t, reduce_op(opts.reduceOp, "all_reduce")));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor& t = one(tensors, "reduce");
  return ChorusWork::track(getRank(), c10d::OpType::REDUCE, "chorus:reduce", tensors,
                           pg_->reduce_async(t, int(opts.rootRank), reduce_op(opts.reduceOp, "reduce")));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions&) {
  at::Tensor& t = one(inputs, "all_gather");
  if (outputs.size() != 1 || int(outputs[0].size()) != getSize())
    throw InvalidArgument(
        detail::concat("chorus backend: all_gather needs one output list of ", getSize(), " tensors"));
  auto work = pg_->all_gather_async(t);
  std::vector<at::Tensor> out = outputs[0];
  return ChorusWork::track(getRank(), c10d::OpType::ALLGATHER, "chorus:all_gather", out, work, [work, out] {
    at::Tensor stacked = work->result().at(0);
    for (size_t r = 0; r < out.size(); ++r) out[r].copy_(stacked[int64_t(r)]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  return ChorusWork::track(getRank(), c10d::OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {output},
                           pg_->all_gather_into_async(output, input));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  return ChorusWork::track(getRank(), c10d::OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {output},
                           pg_->reduce_scatter_into_async(output, input, reduce_op(opts.reduceOp, "reduce_scatter")));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  at::Tensor& t = one(inputs, "gather");
  const int root = int(opts.rootRank);
  const bool mine = getRank() == root;
  if (mine && (outputs.size() != 1 || int(outputs[0].size()) != getSize()))
    throw InvalidArgument(
        detail::concat("chorus backend: gather needs one output list of ", getSize(), " tensors on the root"));
  auto work = pg_->gather_async(t, root);
  std::vector<at::Tensor> out = mine ? outputs[0] : std::vector<at::Tensor>{};
  return ChorusWork::track(getRank(), c10d::OpType::GATHER, "chorus:gather", out, work, [work, out] {
    if (out.empty()) return;
    at::Tensor stacked = work->result().at(0);
    for (size_t r = 0; r < out.size(); ++r) out[r].copy_(stacked[int64_t(r)]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  at::Tensor& t = one(outputs, "scatter");
  const int root = int(opts.rootRank);
  std::optional<at::Tensor> stacked;
  if (getRank() == root) {
    if (inputs.size() != 1 || int(inputs[0].size()) != getSize())
      throw InvalidArgument(
          detail::concat("chorus backend: scatter needs one input list of ", getSize(), " tensors on the root"));
    stacked = at::stack(inputs[0]);
  }
  auto work = pg_->scatter_async(stacked, root);
  return ChorusWork::track(getRank(), c10d::OpType::SCATTER, "chorus:scatter", outputs, work,
                           [work, t]() mutable { t.copy_(work->result().at(0)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  at::Tensor& t = one(outputs, "reduce_scatter");
  if (inputs.size() != 1 || int(inputs[0].size()) != getSize())
    throw InvalidArgument(
        detail::concat("chorus backend: reduce_scatter needs one input list of ", getSize(), " tensors"));
  auto work = pg_->reduce_scatter_async(at::cat(inputs[0]), reduce_op(opts.reduceOp, "reduce_scatter"));
  return ChorusWork::track(getRank(), c10d::OpType::REDUCE_SCATTER, "chorus:reduce_scatter", outputs, work,
                           [work, t]() mutable { t.copy_(work->result().at(0).view_as(t)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions&) {
  auto even = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
    return splits.empty() || std::all_of(splits.begin(), splits.end(),
                                         [&](int64_t s) { return s * getSize() == (t.dim() ? t.size(0) : 0); });
  };
  if (!even(output_splits, output) || !even(input_splits, input))
    throw InvalidArgument("chorus backend: all_to_all_single with uneven split sizes is not supported yet");
  auto work = pg_->all_to_all_async(input);
  return ChorusWork::track(getRank(), c10d::OpType::ALLTOALL_BASE, "chorus:all_to_all_single", {output}, work,
                           [work, output]() mutable { output.copy_(work->result().at(0).view_as(output)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor& t = one(tensors, "send");
  return ChorusWork::track(getRank(), c10d::OpType::SEND, "chorus:send", tensors, pg_->send_async(t, dst, tag));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor& t = one(tensors, "recv");
  return ChorusWork::track(getRank(), c10d::OpType::RECV, "chorus:recv", tensors, pg_->recv_async(t, src, tag));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  return ChorusWork::track(getRank(), c10d::OpType::BARRIER, "chorus:barrier", {}, pg_->barrier_async());
}

}  // namespace chorus::python
