// ProcessGroup: the collectives of the C++ API, each written once (Note [One body per collective],
// prepared_call.h). torch.distributed's list and coalesced forms live in list_collectives.cc, the
// default group in default_group.cc.
#include "chorus/process_group.h"

#include "groups/process_group/prepared_call.h"
#include "groups/process_group/symmetric_pool.h"

namespace chorus {

using detail::Buffer;
using detail::concat;
using detail::core_count;
using detail::core_type;
using detail::data_of;
using detail::input;
using detail::run_now;
using detail::write_back;
using Prepared = detail::PreparedCall;

std::vector<at::Tensor> TensorWork::result(std::optional<std::chrono::milliseconds> timeout) {
  wait(timeout);
  return outputs_;
}

ProcessGroup::Handle ProcessGroup::submit(Prepared p, TensorAsyncOptions async) {
  Handle w = async.handle ? std::move(async.handle) : std::make_shared<TensorWork>();
  w->outputs_ = std::move(p.outputs);
  comm_->submit(std::move(p.body), {.handle = w, .then = std::move(async.then), .on_caller = async.on_caller});
  return w;
}

namespace {

std::vector<int64_t> stacked_shape(int64_t n, at::IntArrayRef sizes) {
  std::vector<int64_t> s{n};
  s.insert(s.end(), sizes.begin(), sizes.end());
  return s;
}

// reduce_scatter and all_to_all take (size() * n, ...).
std::string blocks_problem(const at::Tensor& t, int w) {
  if (auto why = detail::tensor_problem(t); !why.empty()) return why;
  if (t.dim() == 0 || t.size(0) % w != 0)
    return concat("the tensor is ", detail::describe(t), " but dim 0 must be a multiple of the group size ", w);
  return "";
}

Prepared all_reduce_body(Communicator& comm, at::Tensor& t, ReduceOp op) {
  Buffer b = input(comm, t, "all_reduce_", op);
  return {{}, [&comm, t, b, op]() mutable {
            comm.all_reduce(b.data(), b.data(), b.count, b.dtype, op);
            write_back(t, b.tensor);
          }};
}

Prepared broadcast_body(Communicator& comm, at::Tensor& t, int src) {
  Buffer b = input(comm, t, "broadcast_");
  return {{}, [&comm, t, b, src]() mutable {
            comm.broadcast(b.data(), b.count, b.dtype, src);
            write_back(t, b.tensor);
          }};
}

Prepared reduce_body(Communicator& comm, at::Tensor& t, int dst, ReduceOp op) {
  Buffer b = input(comm, t, "reduce_", op);
  const bool mine = dst == comm.rank();
  return {{}, [&comm, t, b, dst, op, mine]() mutable {
            comm.reduce(b.data(), mine ? b.data() : nullptr, b.count, b.dtype, op, dst);
            if (mine) write_back(t, b.tensor);
          }};
}

Prepared all_gather_body(Communicator& comm, const at::Tensor& t) {
  Buffer b = input(comm, t, "all_gather");
  at::Tensor out = at::empty(stacked_shape(comm.size(), b.tensor.sizes()), b.tensor.options());
  return {{out}, [&comm, b, out] { comm.all_gather(b.data(), data_of(out), b.count, b.dtype); }};
}

// all_gather_into / reduce_scatter_into: the caller's `out` must be contiguous, of t's dtype, and
// size() times t's elements (all_gather) or t's elements over size() (reduce_scatter).
std::string into_problem(const at::Tensor& out, const at::Tensor& t, int64_t want) {
  return detail::output_problem(out, t, want, /*contiguous=*/true);
}

Prepared all_gather_into_body(Communicator& comm, at::Tensor& out, const at::Tensor& t) {
  Buffer b = input(comm, t, "all_gather_into");
  if (auto why = into_problem(out, t, t.numel() * comm.size()); !why.empty()) comm.reject("all_gather_into", why);
  return {{}, [&comm, b, out] { comm.all_gather(b.data(), data_of(out), b.count, b.dtype); }};
}

Prepared reduce_scatter_into_body(Communicator& comm, at::Tensor& out, const at::Tensor& t, ReduceOp op) {
  Buffer b = input(comm, t, "reduce_scatter_into", op);
  std::string why = t.numel() % comm.size() ? concat("the tensor's ", t.numel(),
                                                     " elements are not a multiple of the group size ", comm.size())
                                            : into_problem(out, t, t.numel() / comm.size());
  if (!why.empty()) comm.reject("reduce_scatter_into", why);
  const size_t count = b.count / size_t(comm.size());
  return {{}, [&comm, b, out, count, op] { comm.reduce_scatter(b.data(), data_of(out), count, b.dtype, op); }};
}

Prepared gather_body(Communicator& comm, const at::Tensor& t, int dst) {
  Buffer b = input(comm, t, "gather");
  at::Tensor out;
  if (dst == comm.rank()) out = at::empty(stacked_shape(comm.size(), b.tensor.sizes()), b.tensor.options());
  std::vector<at::Tensor> outputs;
  if (out.defined()) outputs.push_back(out);
  return {outputs, [&comm, b, out, dst] { comm.gather(b.data(), data_of(out), b.count, b.dtype, dst); }};
}

// Note [Shape agreement]: all_gather_v and scatter first move shapes (small blocking
// collectives), so every rank can allocate its outputs; a rank whose input is bad rejects in
// that first step, and a shape or dtype that differs between ranks is seen by all of them there.
Prepared all_gather_v_body(Communicator& comm, const at::Tensor& t) {
  Buffer b = input(comm, t, "all_gather_v");
  const int w = comm.size();
  int64_t head[2] = {b.tensor.dim(), int64_t(b.tensor.scalar_type())};
  std::vector<int64_t> heads(size_t(2 * w));
  comm.all_gather(head, heads.data(), 2, DataType::Int64);
  std::vector<size_t> dims(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) dims[size_t(r)] = size_t(heads[size_t(2 * r)]);
  std::vector<int64_t> sizes(b.tensor.sizes().begin(), b.tensor.sizes().end());
  std::vector<int64_t> all_sizes;
  for (size_t d : dims) all_sizes.resize(all_sizes.size() + d);
  comm.all_gather_v(sizes.data(), all_sizes.data(), dims, DataType::Int64);

  bool same = true;
  std::vector<std::string> calls;
  std::vector<at::IntArrayRef> shapes;
  size_t at = 0;
  for (int r = 0; r < w; ++r) {
    shapes.emplace_back(all_sizes.data() + at, dims[size_t(r)]);
    at += dims[size_t(r)];
    const auto type = at::ScalarType(heads[size_t(2 * r + 1)]);
    calls.push_back(concat("all_gather_v(", c10::toString(type), detail::shape_string(shapes.back()), ")"));
    same = same && dims[size_t(r)] == dims[0] && heads[size_t(2 * r + 1)] == heads[1];
  }
  if (!same)
    detail::throw_mismatch(comm, "all_gather_v",
                           "tensors may differ in size but must have the same number of dimensions and dtype on "
                           "every rank",
                           std::move(calls));
  const size_t per = core_type(b.tensor.scalar_type())->per_element;
  std::vector<size_t> counts(static_cast<size_t>(w));
  size_t total = 0;
  for (int r = 0; r < w; ++r) {
    counts[size_t(r)] = size_t(c10::multiply_integers(shapes[size_t(r)])) * per;
    total += counts[size_t(r)];
  }
  at::Tensor flat = at::empty({int64_t(total / per)}, b.tensor.options());
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (int r = 0; r < w; ++r) {
    const int64_t n = int64_t(counts[size_t(r)] / per);
    outputs.push_back(flat.narrow(0, offset, n).view(shapes[size_t(r)]));
    offset += n;
  }
  return {outputs, [&comm, b, flat, counts] { comm.all_gather_v(b.data(), data_of(flat), counts, b.dtype); }};
}

Prepared scatter_body(Communicator& comm, const std::optional<at::Tensor>& stacked, int src) {
  constexpr int kMaxDims = 64;
  const int w = comm.size();
  if (src < 0 || src >= w)
    comm.reject("scatter", concat("source ", src, " is not a rank of this group (size ", w, ")"));
  const bool mine = comm.rank() == src;
  Buffer b{};
  int64_t meta[2 + kMaxDims] = {0};
  if (mine) {
    std::string why;
    if (!stacked || !stacked->defined())
      why = "the source must pass the stacked tensor (size(), ...)";
    else if (stacked->dim() == 0 || stacked->size(0) != w)
      why = concat("the source's tensor is ", detail::describe(*stacked), " but must be (", w,
                   ", ...): one block per rank along dim 0");
    else if (stacked->dim() > kMaxDims)
      why = concat("tensors of more than ", kMaxDims - 1, " dims are not supported");
    else
      why = detail::tensor_problem(*stacked);
    if (!why.empty()) comm.reject("scatter", why);
    b = input(comm, *stacked, "scatter");
    meta[0] = int64_t(b.tensor.scalar_type());
    meta[1] = b.tensor.dim() - 1;
    for (int64_t d = 1; d < b.tensor.dim(); ++d) meta[1 + d] = b.tensor.size(d);
  }
  comm.broadcast(meta, 2 + kMaxDims, DataType::Int64, src);
  const auto type = at::ScalarType(meta[0]);
  at::Tensor out = at::empty(at::IntArrayRef(meta + 2, size_t(meta[1])), at::TensorOptions().dtype(type));
  const size_t count = size_t(out.numel()) * core_type(type)->per_element;
  const DataType dtype = core_type(type)->dtype;
  return {{out}, [&comm, b, out, count, dtype, src] { comm.scatter(b.data(), data_of(out), count, dtype, src); }};
}

Prepared reduce_scatter_body(Communicator& comm, const at::Tensor& t, ReduceOp op) {
  if (auto why = blocks_problem(t, comm.size()); !why.empty()) comm.reject("reduce_scatter", why);
  Buffer b = input(comm, t, "reduce_scatter", op);
  auto shape = b.tensor.sizes().vec();
  shape[0] /= comm.size();
  at::Tensor out = at::empty(shape, b.tensor.options());
  const size_t count = b.count / size_t(comm.size());
  return {{out}, [&comm, b, out, count, op] { comm.reduce_scatter(b.data(), data_of(out), count, b.dtype, op); }};
}

Prepared all_to_all_body(Communicator& comm, const at::Tensor& t) {
  if (auto why = blocks_problem(t, comm.size()); !why.empty()) comm.reject("all_to_all", why);
  Buffer b = input(comm, t, "all_to_all");
  at::Tensor out = at::empty_like(b.tensor, at::MemoryFormat::Contiguous);
  const size_t count = b.count / size_t(comm.size());
  return {{out}, [&comm, b, out, count] { comm.all_to_all(b.data(), data_of(out), count, b.dtype); }};
}

// Point to point: a bad tensor is this rank's error only (the peer's matching call fails on
// its own deadline or mismatch), so it throws here without communicating.
Buffer message(const at::Tensor& t, const char* op, bool receiving) {
  if (auto why = detail::tensor_problem(t); !why.empty()) throw InvalidArgument(concat(op, ": ", why));
  at::Tensor c =
      receiving ? (t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous)) : detail::plain(t);
  return Buffer{c, core_type(c.scalar_type())->dtype, core_count(c)};
}

// The handle of a point-to-point call. Its `then` keeps the call's buffer alive and copies a
// received message where it belongs, before the caller's own `then`.
ProcessGroup::Handle p2p_handle(TensorAsyncOptions& async) {
  return async.handle ? std::move(async.handle) : std::make_shared<TensorWork>();
}
std::function<void()> and_then(std::function<void()> first, std::function<void()> second) {
  if (!second) return first;
  return [first = std::move(first), second = std::move(second)] {
    first();
    second();
  };
}

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Communicator> comm, std::vector<int> ranks)
    : comm_(std::move(comm)), ranks_(std::move(ranks)), pool_(std::make_shared<detail::SymmetricPool>()) {
  CHORUS_ENFORCE(comm_ != nullptr);
  CHORUS_ENFORCE_EQ(ranks_.size(), size_t(comm_->size()));
}

at::Tensor ProcessGroup::alloc_symmetric(int64_t numel, const at::TensorOptions& options) {
  if (!options.device().is_cpu() || numel == 0) return at::zeros({numel}, options);
  return detail::symmetric_tensor(*comm_, numel, options);
}

at::Tensor ProcessGroup::take_symmetric(int64_t numel, const at::TensorOptions& options) {
  if (!options.device().is_cpu() || numel == 0) return at::empty({numel}, options);
  return pool_->take(*comm_, numel, options);
}

void ProcessGroup::all_reduce_(at::Tensor& t, ReduceOp op) { run_now(all_reduce_body(*comm_, t, op)); }
void ProcessGroup::broadcast_(at::Tensor& t, int src) { run_now(broadcast_body(*comm_, t, src)); }
void ProcessGroup::reduce_(at::Tensor& t, int dst, ReduceOp op) { run_now(reduce_body(*comm_, t, dst, op)); }
at::Tensor ProcessGroup::all_gather(const at::Tensor& t) { return run_now(all_gather_body(*comm_, t))[0]; }
std::vector<at::Tensor> ProcessGroup::all_gather_v(const at::Tensor& t) {
  return run_now(all_gather_v_body(*comm_, t));
}
std::optional<at::Tensor> ProcessGroup::gather(const at::Tensor& t, int dst) {
  auto outputs = run_now(gather_body(*comm_, t, dst));
  if (outputs.empty()) return std::nullopt;
  return outputs[0];
}
at::Tensor ProcessGroup::scatter(const std::optional<at::Tensor>& stacked, int src) {
  return run_now(scatter_body(*comm_, stacked, src))[0];
}
at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& t, ReduceOp op) {
  return run_now(reduce_scatter_body(*comm_, t, op))[0];
}
void ProcessGroup::all_gather_into(at::Tensor& out, const at::Tensor& t) {
  run_now(all_gather_into_body(*comm_, out, t));
}
void ProcessGroup::reduce_scatter_into(at::Tensor& out, const at::Tensor& t, ReduceOp op) {
  run_now(reduce_scatter_into_body(*comm_, out, t, op));
}
at::Tensor ProcessGroup::all_to_all(const at::Tensor& t) { return run_now(all_to_all_body(*comm_, t))[0]; }
void ProcessGroup::barrier(std::optional<std::chrono::milliseconds> timeout) { comm_->barrier(timeout); }

ProcessGroup::Handle ProcessGroup::all_reduce_async(at::Tensor& t, ReduceOp op, TensorAsyncOptions async) {
  return submit(all_reduce_body(*comm_, t, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::broadcast_async(at::Tensor& t, int src, TensorAsyncOptions async) {
  return submit(broadcast_body(*comm_, t, src), std::move(async));
}
ProcessGroup::Handle ProcessGroup::reduce_async(at::Tensor& t, int dst, ReduceOp op, TensorAsyncOptions async) {
  return submit(reduce_body(*comm_, t, dst, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_gather_async(const at::Tensor& t, TensorAsyncOptions async) {
  return submit(all_gather_body(*comm_, t), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_gather_v_async(const at::Tensor& t, TensorAsyncOptions async) {
  return submit(all_gather_v_body(*comm_, t), std::move(async));
}
ProcessGroup::Handle ProcessGroup::gather_async(const at::Tensor& t, int dst, TensorAsyncOptions async) {
  return submit(gather_body(*comm_, t, dst), std::move(async));
}
ProcessGroup::Handle ProcessGroup::scatter_async(const std::optional<at::Tensor>& stacked, int src,
                                                 TensorAsyncOptions async) {
  return submit(scatter_body(*comm_, stacked, src), std::move(async));
}
ProcessGroup::Handle ProcessGroup::reduce_scatter_async(const at::Tensor& t, ReduceOp op, TensorAsyncOptions async) {
  return submit(reduce_scatter_body(*comm_, t, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_gather_into_async(at::Tensor& out, const at::Tensor& t,
                                                         TensorAsyncOptions async) {
  return submit(all_gather_into_body(*comm_, out, t), std::move(async));
}
ProcessGroup::Handle ProcessGroup::reduce_scatter_into_async(at::Tensor& out, const at::Tensor& t, ReduceOp op,
                                                             TensorAsyncOptions async) {
  return submit(reduce_scatter_into_body(*comm_, out, t, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_to_all_async(const at::Tensor& t, TensorAsyncOptions async) {
  return submit(all_to_all_body(*comm_, t), std::move(async));
}
ProcessGroup::Handle ProcessGroup::barrier_async(TensorAsyncOptions async) {
  Communicator& comm = *comm_;
  return submit({{}, [&comm] { comm.barrier(); }}, std::move(async));
}

void ProcessGroup::send(const at::Tensor& t, int dst, int tag) {
  Buffer m = message(t, "send", false);
  comm_->send(m.data(), m.count, m.dtype, dst, tag);
}
void ProcessGroup::recv(at::Tensor& t, int src, int tag) {
  Buffer m = message(t, "recv", true);
  comm_->recv(m.data(), m.count, m.dtype, src, tag);
  write_back(t, m.tensor);
}
int ProcessGroup::recv_any(at::Tensor& t, int tag) {
  Buffer m = message(t, "recv", true);
  const int from = comm_->recv_any(m.data(), m.count, m.dtype, tag);
  write_back(t, m.tensor);
  return from;
}

ProcessGroup::Handle ProcessGroup::send_async(const at::Tensor& t, int dst, int tag, TensorAsyncOptions async) {
  Buffer m = message(t, "send", false);
  Handle w = p2p_handle(async);
  comm_->send_async(m.data(), m.count, m.dtype, dst, tag, {}, {.handle = w, .then = and_then([m] {}, async.then)});
  return w;
}
ProcessGroup::Handle ProcessGroup::recv_async(at::Tensor& t, int src, int tag, TensorAsyncOptions async) {
  Buffer m = message(t, "recv", true);
  Handle w = p2p_handle(async);
  comm_->recv_async(m.data(), m.count, m.dtype, src, tag, {},
                    {.handle = w, .then = and_then([t, m] { write_back(t, m.tensor); }, async.then)});
  return w;
}
ProcessGroup::Handle ProcessGroup::recv_any_async(at::Tensor& t, int tag, TensorAsyncOptions async) {
  Buffer m = message(t, "recv", true);
  Handle w = p2p_handle(async);
  TensorWork* raw = w.get();
  auto publish = [t, m, raw] {
    write_back(t, m.tensor);
    raw->source_.store(raw->received_from_, std::memory_order_release);
  };
  comm_->recv_any_async(m.data(), m.count, m.dtype, &raw->received_from_, tag, {},
                        {.handle = w, .then = and_then(std::move(publish), async.then)});
  return w;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<int>& ranks) {
  auto child = comm_->split(ranks);
  if (!child) return nullptr;
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_rank(r));
  return std::make_shared<ProcessGroup>(child, global);
}

}  // namespace chorus
