// chorus as a torch.distributed backend: a c10d::ProcessGroup over chorus's ProcessGroup, meeting
// its peers on the store torch hands the backend. Every collective torch.distributed 1.13 has for
// CPU tensors; what chorus refuses (sparse or non-CPU tensors, recv from any source) raises an
// error naming the call.
//
// Note [Completing futures]
// c10d's futures run their .then() callbacks on the thread that completes them, and DDP comm hooks
// (PowerSGD) issue and wait for further collectives inside those callbacks. chorus finishes work
// on its executor thread, which must never block, so a finished chorus work only hands its
// completion to a pool of completer threads; the pool grows when every completer is busy (a
// callback waiting on another collective), so a completion never waits behind the callback
// that waits for it. A thread that waits for the work (Work::wait, the common synchronous call)
// completes the future itself as soon as chorus's work finished, whichever comes first; when a
// thread waits without a timeout, no completer is woken at all.
#include "backend.h"

#include "tensor_util.h"  // chorus's torch layer: dtype mapping and tensor checks

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
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
    work->on_finish([self](std::exception_ptr error) {
      if (!self->waiter_.load()) Completer::get().post([self, error] { self->complete(error); });
    });
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
    if (timeout == ::kNoTimeout) waiter_ = true;  // it completes the future itself, below
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
  std::atomic<bool> waiter_{false};  // a thread waits without a timeout: no completer needed
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

// Dense CPU tensors of a dtype chorus moves; anything else is an error naming the call.
void dense(const at::Tensor& t, const char* where) {
  if (!t.device().is_cpu() || t.is_sparse())
    throw InvalidArgument(detail::concat("chorus backend: ", where, ": only dense CPU tensors, got ",
                                         t.is_sparse() ? "a sparse tensor" : t.device().str()));
  if (!detail::core_type(t.scalar_type()))
    throw InvalidArgument(
        detail::concat("chorus backend: ", where, ": chorus cannot move ", t.scalar_type(), " tensors"));
}

std::vector<at::Tensor> flat_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return flat;
}

// Per-rank size from which a list all_gather broadcasts into the caller's tensors.
constexpr int64_t kDirectGatherBytes = 256 << 10;

at::Tensor& one(std::vector<at::Tensor>& tensors, const char* where) {
  if (tensors.size() != 1)
    throw InvalidArgument(
        detail::concat("chorus backend: ", where, " takes one tensor per call, got ", tensors.size()));
  dense(tensors[0], where);
  return tensors[0];
}

}  // namespace

// The c10d Work of a chorus work; collectives count toward the sequence number.
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::issue(c10d::OpType type, const char* title,
                                                         std::vector<at::Tensor> outputs,
                                                         std::shared_ptr<chorus::Work> work,
                                                         std::function<void()> then) {
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE) ++sequence_;
  return ChorusWork::track(getRank(), type, title, std::move(outputs), std::move(work), std::move(then));
}

ProcessGroupChorus::ProcessGroupChorus(std::shared_ptr<chorus::ProcessGroup> pg)
    : c10d::Backend(pg->rank(), pg->size()), pg_(std::move(pg)) {}

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

c10::intrusive_ptr<c10d::Backend> ProcessGroupChorus::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                             int size, std::chrono::milliseconds timeout,
                                                             const std::string& name, std::vector<int> global_ranks) {
  CommunicatorOptions options;
  if (const char* b = std::getenv("CHORUS_BACKEND")) options.backend = b;
  options.timeout = timeout;
  options.name = name;
  auto comm = Communicator::create(std::make_shared<C10dStore>(store), rank, size, options);
  if (global_ranks.empty())
    for (int r = 0; r < size; ++r) global_ranks.push_back(r);
  return c10::make_intrusive<ProcessGroupChorus>(std::make_shared<chorus::ProcessGroup>(comm, global_ranks));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor& t = one(tensors, "broadcast");
  return issue(c10d::OpType::BROADCAST, "chorus:broadcast", tensors, pg_->broadcast_async(t, int(opts.rootRank)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor& t = one(tensors, "all_reduce");
  return issue(c10d::OpType::ALLREDUCE, "chorus:all_reduce", tensors,
               pg_->all_reduce_async(t, reduce_op(opts.reduceOp, "all_reduce")));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor& t = one(tensors, "reduce");
  return issue(c10d::OpType::REDUCE, "chorus:reduce", tensors,
               pg_->reduce_async(t, int(opts.rootRank), reduce_op(opts.reduceOp, "reduce")));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions&) {
  at::Tensor& t = one(inputs, "all_gather");
  if (outputs.size() != 1 || int(outputs[0].size()) != getSize())
    throw InvalidArgument(
        detail::concat("chorus backend: all_gather needs one output list of ", getSize(), " tensors"));
  std::vector<at::Tensor> out = outputs[0];
  for (const at::Tensor& o : out) {
    dense(o, "all_gather");
    if (o.numel() != t.numel() || o.scalar_type() != t.scalar_type())
      throw InvalidArgument(detail::concat("chorus backend: all_gather: output ", detail::describe(o),
                                           " does not fit input ", detail::describe(t)));
  }
  // Small: one all_gather into a fresh stacked tensor, then copies. Large (a choice every rank
  // makes alike, from the size): one broadcast from each rank straight into the caller's tensors,
  // no staging tensor whose fresh pages would cost more than the transfer.
  if (t.numel() * int64_t(t.element_size()) >= kDirectGatherBytes) {
    auto pg = pg_;
    const int me = getRank();
    auto work = pg_->communicator().submit([pg, out, t, me]() mutable {
      for (int r = 0; r < int(out.size()); ++r) {
        if (r == me) out[size_t(r)].copy_(t.reshape(out[size_t(r)].sizes()));
        pg->broadcast_(out[size_t(r)], r);
      }
    });
    return issue(c10d::OpType::ALLGATHER, "chorus:all_gather", out, work);
  }
  auto work = pg_->all_gather_async(t);
  return issue(c10d::OpType::ALLGATHER, "chorus:all_gather", out, work, [work, out] {
    at::Tensor stacked = work->result().at(0);
    for (size_t r = 0; r < out.size(); ++r) out[r].copy_(stacked[int64_t(r)].view(out[r].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  return issue(c10d::OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {output},
               pg_->all_gather_into_async(output, input));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  return issue(c10d::OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {output},
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
  return issue(c10d::OpType::GATHER, "chorus:gather", out, work, [work, out] {
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
  return issue(c10d::OpType::SCATTER, "chorus:scatter", outputs, work,
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
  return issue(c10d::OpType::REDUCE_SCATTER, "chorus:reduce_scatter", outputs, work,
               [work, t]() mutable { t.copy_(work->result().at(0).view_as(t)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions&) {
  const char* op = "all_to_all_single";
  dense(input, op);
  dense(output, op);
  if (input.scalar_type() != output.scalar_type())
    throw InvalidArgument(detail::concat("chorus backend: ", op, ": input is ", detail::describe(input),
                                         " but output is ", detail::describe(output), "; they must share a dtype"));
  return exchange(input, split_counts(input, input_splits, op, "input"), output,
                  split_counts(output, output_splits, op, "output"), op, {output});
}

// Every rank's block of `t` along dim 0, in core elements: `splits` rows each, or even blocks.
std::vector<size_t> ProcessGroupChorus::split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                                     const char* op, const char* which) const {
  const int64_t rows = t.dim() ? t.size(0) : 1;
  const size_t row = rows ? detail::core_count(t) / size_t(rows) : 0;
  std::vector<size_t> counts(static_cast<size_t>(getSize()));
  if (splits.empty()) {
    if (rows % getSize())
      throw InvalidArgument(detail::concat("chorus backend: ", op, ": ", which, " has ", rows,
                                           " rows, which do not split evenly over ", getSize(),
                                           " ranks; pass split sizes"));
    for (auto& c : counts) c = size_t(rows / getSize()) * row;
    return counts;
  }
  int64_t total = 0;
  for (int64_t s : splits) total += s;
  if (int(splits.size()) != getSize() || total != rows ||
      std::any_of(splits.begin(), splits.end(), [](int64_t s) { return s < 0; }))
    throw InvalidArgument(detail::concat("chorus backend: ", op, ": ", which, " split sizes ",
                                         detail::shape_string(splits), " must be ", getSize(),
                                         " non-negative numbers adding up to its ", rows, " rows"));
  for (size_t q = 0; q < counts.size(); ++q) counts[q] = size_t(splits[q]) * row;
  return counts;
}

// all_to_all_v of contiguous `in` into `out` (copied back when out is not contiguous).
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::exchange(const at::Tensor& in, std::vector<size_t> send_counts,
                                                            at::Tensor out, std::vector<size_t> recv_counts,
                                                            const char* op, std::vector<at::Tensor> outputs,
                                                            std::function<void(const at::Tensor&)> then) {
  const auto type = detail::core_type(in.scalar_type());  // known: the caller checked it with dense()
  at::Tensor src = detail::plain(in), dst = detail::plain(out);
  Communicator& comm = pg_->communicator();
  auto work = comm.submit([&comm, src, dst, send_counts, recv_counts, dtype = type->dtype] {
    comm.all_to_all_v(src.numel() ? src.data_ptr() : nullptr, send_counts, dst.numel() ? dst.data_ptr() : nullptr,
                      recv_counts, dtype);
  });
  return issue(c10d::OpType::ALLTOALL, op, std::move(outputs), work, [dst, out, then = std::move(then)]() mutable {
    if (!dst.is_same(out)) out.copy_(dst);
    if (then) then(dst);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  const char* op = "all_to_all";
  if (int(outputs.size()) != getSize() || int(inputs.size()) != getSize())
    throw InvalidArgument(detail::concat("chorus backend: ", op, " takes ", getSize(), " input and ", getSize(),
                                         " output tensors, got ", inputs.size(), " and ", outputs.size()));
  std::vector<size_t> send(inputs.size()), recv(outputs.size());
  for (size_t q = 0; q < inputs.size(); ++q) {
    dense(inputs[q], op);
    dense(outputs[q], op);
    if (inputs[q].scalar_type() != inputs[0].scalar_type() || outputs[q].scalar_type() != inputs[0].scalar_type())
      throw InvalidArgument(detail::concat("chorus backend: ", op, ": every tensor must have the dtype of the first (",
                                           detail::describe(inputs[0]), "); ", detail::describe(inputs[q]), " and ",
                                           detail::describe(outputs[q]), " at ", q));
    send[q] = detail::core_count(inputs[q]);
    recv[q] = detail::core_count(outputs[q]);
  }
  at::Tensor in = at::cat(flat_views(inputs));
  at::Tensor out = at::empty({int64_t(std::accumulate(outputs.begin(), outputs.end(), int64_t(0),
                                                      [](int64_t n, const at::Tensor& t) { return n + t.numel(); }))},
                             inputs[0].options());
  return exchange(in, send, out, recv, op, outputs, [outputs](const at::Tensor& got) {
    int64_t at = 0;
    for (const at::Tensor& t : outputs) {
      const_cast<at::Tensor&>(t).copy_(got.slice(0, at, at + t.numel()).view(t.sizes()));
      at += t.numel();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  const ReduceOp reduce = reduce_op(opts.reduceOp, op);
  // One flat tensor per dtype, reduced in order of first appearance, then copied back.
  std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> groups;
  for (const at::Tensor& t : tensors) {
    dense(t, op);
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& entry) { return entry.second.front().scalar_type() == t.scalar_type(); });
    if (g == groups.end()) g = groups.insert(groups.end(), {at::Tensor(), {}});
    g->second.push_back(t);
  }
  for (auto& [flat, members] : groups) flat = at::cat(flat_views(members));
  auto pg = pg_;
  auto work = pg_->communicator().submit([pg, groups, reduce]() mutable {
    for (auto& [flat, members] : groups) pg->all_reduce_(flat, reduce);
  });
  return issue(c10d::OpType::ALLREDUCE_COALESCED, "chorus:all_reduce_coalesced", tensors, work, [groups] {
    for (const auto& [flat, members] : groups) {
      int64_t at = 0;
      for (at::Tensor t : members) {
        t.copy_(flat.slice(0, at, at + t.numel()).view(t.sizes()));
        at += t.numel();
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const c10d::AllgatherOptions&) {
  const char* op = "all_gather_coalesced";
  if (int(outputs.size()) != getSize())
    throw InvalidArgument(
        detail::concat("chorus backend: ", op, " needs ", getSize(), " output lists, got ", outputs.size()));
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size())
      throw InvalidArgument(detail::concat("chorus backend: ", op, ": output list ", r, " has ", outputs[r].size(),
                                           " tensors for ", inputs.size(), " inputs"));
    for (size_t j = 0; j < inputs.size(); ++j) {
      dense(inputs[j], op);
      dense(outputs[r][j], op);
      if (outputs[r][j].sizes() != inputs[j].sizes() || outputs[r][j].scalar_type() != inputs[j].scalar_type())
        throw InvalidArgument(detail::concat("chorus backend: ", op, ": output ", r, "/", j, " is ",
                                             detail::describe(outputs[r][j]), " for input ",
                                             detail::describe(inputs[j])));
    }
  }
  // Every input's bytes in one buffer; gathered as bytes, so tensors of several dtypes travel together.
  std::vector<at::Tensor> bytes;
  for (const at::Tensor& t : inputs) bytes.push_back(detail::plain(t).reshape({-1}).view(at::kByte));
  at::Tensor in = at::cat(bytes);
  at::Tensor all = at::empty({getSize() * in.numel()}, in.options());
  auto work = pg_->all_gather_into_async(all, in);
  std::vector<at::Tensor> flat_outputs;
  for (auto& list : outputs) flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
  const int64_t per_rank = in.numel();
  return issue(c10d::OpType::ALLGATHER_COALESCED, "chorus:all_gather_coalesced", flat_outputs, work,
               [outputs, all, per_rank] {
                 for (size_t r = 0; r < outputs.size(); ++r) {
                   int64_t at = int64_t(r) * per_rank;
                   for (at::Tensor t : outputs[r]) {
                     const int64_t n = t.numel() * int64_t(t.element_size());
                     t.copy_(all.slice(0, at, at + n).view(t.scalar_type()).view(t.sizes()));
                     at += n;
                   }
                 }
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor& t = one(tensors, "send");
  return issue(c10d::OpType::SEND, "chorus:send", tensors, pg_->send_async(t, dst, tag));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor& t = one(tensors, "recv");
  return issue(c10d::OpType::RECV, "chorus:recv", tensors, pg_->recv_async(t, src, tag));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>&, int) {
  throw InvalidArgument(
      "chorus backend: recv from any source (src=None) is not supported: name the rank to receive from");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  return issue(c10d::OpType::BARRIER, "chorus:barrier", {}, pg_->barrier_async());
}

}  // namespace chorus::python
