#include "chorus/process_group.h"

#include <mutex>

#include "chorus/core/rendezvous.h"
#include "tensor_util.h"

namespace chorus {

using detail::concat;
using detail::core_count;
using detail::core_type;

std::vector<at::Tensor> TensorWork::result(std::optional<std::chrono::milliseconds> timeout) {
  wait(timeout);
  return outputs_;
}

namespace {

// A finished TensorWork for the blocking forms.
std::shared_ptr<TensorWork> done(std::vector<at::Tensor> outputs = {}) {
  auto w = std::make_shared<TensorWork>(std::move(outputs));
  w->finish(nullptr);
  return w;
}

// target = what the core wrote into buf, when they are different tensors (non-contiguous target).
void write_back(at::Tensor& target, const at::Tensor& buf) {
  if (!buf.is_same(target)) target.copy_(buf);
}

}  // namespace

// The contiguous tensor the core reads and writes for a caller's tensor.
struct ProcessGroup::Buffer {
  at::Tensor tensor;
  DataType dtype;
  size_t count;
  void* data() const { return tensor.numel() ? tensor.data_ptr() : nullptr; }
};

ProcessGroup::ProcessGroup(std::shared_ptr<Communicator> comm, std::vector<int> ranks)
    : comm_(std::move(comm)), ranks_(std::move(ranks)) {
  CHORUS_ENFORCE(comm_ != nullptr);
  CHORUS_ENFORCE_EQ(ranks_.size(), size_t(comm_->size()));
}

ProcessGroup::Buffer ProcessGroup::input(const at::Tensor& t, const char* op, std::optional<ReduceOp> reduce) {
  if (auto why = detail::tensor_problem(t, reduce); !why.empty()) comm_->reject(op, why);
  at::Tensor c = detail::plain(t);
  return Buffer{c, core_type(c.scalar_type())->dtype, core_count(c)};
}

// Wraps the core's work: the tensors stay alive until it finished, then `then` runs (copies into
// non-contiguous targets) before the TensorWork completes.
static std::shared_ptr<TensorWork> track(const std::shared_ptr<Work>& inner, std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> keep, std::function<void()> then = nullptr) {
  auto w = std::make_shared<TensorWork>(std::move(outputs), std::move(keep));
  inner->on_finish([w, then = std::move(then)](std::exception_ptr error) {
    if (!error && then) {
      try {
        then();
      } catch (...) {
        error = std::current_exception();
      }
    }
    w->finish(error);
  });
  return w;
}

std::shared_ptr<TensorWork> ProcessGroup::all_reduce_impl(at::Tensor& t, ReduceOp op, bool async) {
  Buffer b = input(t, "all_reduce_", op);
  if (!async) {
    comm_->all_reduce(b.data(), b.data(), b.count, b.dtype, op);
    write_back(t, b.tensor);
    return done();
  }
  return track(comm_->all_reduce_async(b.data(), b.data(), b.count, b.dtype, op), {}, {t, b.tensor},
               [t, buf = b.tensor]() mutable { write_back(t, buf); });
}

std::shared_ptr<TensorWork> ProcessGroup::broadcast_impl(at::Tensor& t, int src, bool async) {
  Buffer b = input(t, "broadcast_");
  if (!async) {
    comm_->broadcast(b.data(), b.count, b.dtype, src);
    write_back(t, b.tensor);
    return done();
  }
  return track(comm_->broadcast_async(b.data(), b.count, b.dtype, src), {}, {t, b.tensor},
               [t, buf = b.tensor]() mutable { write_back(t, buf); });
}

std::shared_ptr<TensorWork> ProcessGroup::reduce_impl(at::Tensor& t, int dst, ReduceOp op, bool async) {
  Buffer b = input(t, "reduce_", op);
  const bool mine = dst == rank();
  void* out = mine ? b.data() : nullptr;
  if (!async) {
    comm_->reduce(b.data(), out, b.count, b.dtype, op, dst);
    if (mine) write_back(t, b.tensor);
    return done();
  }
  return track(comm_->reduce_async(b.data(), out, b.count, b.dtype, op, dst), {}, {t, b.tensor},
               [t, buf = b.tensor, mine]() mutable {
                 if (mine) write_back(t, buf);
               });
}

static std::vector<int64_t> stacked_shape(int64_t n, at::IntArrayRef sizes) {
  std::vector<int64_t> s{n};
  s.insert(s.end(), sizes.begin(), sizes.end());
  return s;
}

std::shared_ptr<TensorWork> ProcessGroup::all_gather_impl(const at::Tensor& t, bool async) {
  Buffer b = input(t, "all_gather");
  at::Tensor out = at::empty(stacked_shape(size(), b.tensor.sizes()), b.tensor.options());
  void* o = out.numel() ? out.data_ptr() : nullptr;
  if (!async) {
    comm_->all_gather(b.data(), o, b.count, b.dtype);
    return done({out});
  }
  return track(comm_->all_gather_async(b.data(), o, b.count, b.dtype), {out}, {b.tensor});
}

std::shared_ptr<TensorWork> ProcessGroup::gather_impl(const at::Tensor& t, int dst, bool async) {
  Buffer b = input(t, "gather");
  at::Tensor out;
  void* o = nullptr;
  if (dst == rank()) {
    out = at::empty(stacked_shape(size(), b.tensor.sizes()), b.tensor.options());
    if (out.numel()) o = out.data_ptr();
  }
  std::vector<at::Tensor> outputs;
  if (out.defined()) outputs.push_back(out);
  if (!async) {
    comm_->gather(b.data(), o, b.count, b.dtype, dst);
    return done(outputs);
  }
  return track(comm_->gather_async(b.data(), o, b.count, b.dtype, dst), outputs, {b.tensor});
}

// Note [Shape agreement]: all_gather_v and scatter first move shapes (small blocking
// collectives), so every rank can allocate its outputs; a rank whose input is bad rejects in
// that first step, and a shape or dtype that differs between ranks is seen by all of them there.
std::shared_ptr<TensorWork> ProcessGroup::all_gather_v_impl(const at::Tensor& t, bool async) {
  Buffer b = input(t, "all_gather_v");
  const int w = size();
  int64_t head[2] = {b.tensor.dim(), int64_t(b.tensor.scalar_type())};
  std::vector<int64_t> heads(size_t(2 * w));
  comm_->all_gather(head, heads.data(), 2, DataType::Int64);
  std::vector<size_t> dims(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) dims[size_t(r)] = size_t(heads[size_t(2 * r)]);
  std::vector<int64_t> sizes(b.tensor.sizes().begin(), b.tensor.sizes().end());
  std::vector<int64_t> all_sizes;
  for (size_t d : dims) all_sizes.resize(all_sizes.size() + d);
  comm_->all_gather_v(sizes.data(), all_sizes.data(), dims, DataType::Int64);

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
  if (!same) {
    std::string lines;
    for (int r = 0; r < w; ++r) lines += concat("\n  rank ", r, ": ", calls[size_t(r)]);
    throw CollectiveMismatch(concat("all_gather_v on group '", name(),
                                    "': tensors may differ in size but must have the same number of dimensions and "
                                    "dtype on every rank:",
                                    lines),
                             calls);
  }
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
  void* o = total ? flat.data_ptr() : nullptr;
  if (!async) {
    comm_->all_gather_v(b.data(), o, counts, b.dtype);
    return done(outputs);
  }
  return track(comm_->all_gather_v_async(b.data(), o, counts, b.dtype), outputs, {b.tensor, flat});
}

std::shared_ptr<TensorWork> ProcessGroup::scatter_impl(const std::optional<at::Tensor>& stacked, int src, bool async) {
  constexpr int kMaxDims = 64;
  const int w = size();
  if (src < 0 || src >= w)
    comm_->reject("scatter", concat("source ", src, " is not a rank of this group (size ", w, ")"));
  const bool mine = rank() == src;
  Buffer b{};
  int64_t meta[2 + kMaxDims] = {0};
  if (mine) {
    std::string why;
    if (!stacked || !stacked->defined()) why = "the source must pass the stacked tensor (size(), ...)";
    else if (stacked->dim() == 0 || stacked->size(0) != w)
      why = concat("the source's tensor is ", detail::describe(*stacked), " but must be (", w,
                   ", ...): one block per rank along dim 0");
    else if (stacked->dim() > kMaxDims) why = concat("tensors of more than ", kMaxDims - 1, " dims are not supported");
    else why = detail::tensor_problem(*stacked);
    if (!why.empty()) comm_->reject("scatter", why);
    b = input(*stacked, "scatter");
    meta[0] = int64_t(b.tensor.scalar_type());
    meta[1] = b.tensor.dim() - 1;
    for (int64_t d = 1; d < b.tensor.dim(); ++d) meta[1 + d] = b.tensor.size(d);
  }
  comm_->broadcast(meta, 2 + kMaxDims, DataType::Int64, src);
  const auto type = at::ScalarType(meta[0]);
  at::Tensor out = at::empty(at::IntArrayRef(meta + 2, size_t(meta[1])), at::TensorOptions().dtype(type));
  const size_t count = size_t(out.numel()) * core_type(type)->per_element;
  const DataType dtype = core_type(type)->dtype;
  void* o = out.numel() ? out.data_ptr() : nullptr;
  const void* in = mine ? b.data() : nullptr;
  if (!async) {
    comm_->scatter(in, o, count, dtype, src);
    return done({out});
  }
  std::vector<at::Tensor> keep;
  if (mine) keep.push_back(b.tensor);
  return track(comm_->scatter_async(in, o, count, dtype, src), {out}, keep);
}

// reduce_scatter and all_to_all take (size() * n, ...).
static std::string blocks_problem(const at::Tensor& t, int w) {
  if (auto why = detail::tensor_problem(t); !why.empty()) return why;
  if (t.dim() == 0 || t.size(0) % w != 0)
    return concat("the tensor is ", detail::describe(t), " but dim 0 must be a multiple of the group size ", w);
  return "";
}

std::shared_ptr<TensorWork> ProcessGroup::reduce_scatter_impl(const at::Tensor& t, ReduceOp op, bool async) {
  if (auto why = blocks_problem(t, size()); !why.empty()) comm_->reject("reduce_scatter", why);
  Buffer b = input(t, "reduce_scatter", op);
  auto shape = b.tensor.sizes().vec();
  shape[0] /= size();
  at::Tensor out = at::empty(shape, b.tensor.options());
  const size_t count = b.count / size_t(size());
  void* o = out.numel() ? out.data_ptr() : nullptr;
  if (!async) {
    comm_->reduce_scatter(b.data(), o, count, b.dtype, op);
    return done({out});
  }
  return track(comm_->reduce_scatter_async(b.data(), o, count, b.dtype, op), {out}, {b.tensor});
}

std::shared_ptr<TensorWork> ProcessGroup::all_to_all_impl(const at::Tensor& t, bool async) {
  if (auto why = blocks_problem(t, size()); !why.empty()) comm_->reject("all_to_all", why);
  Buffer b = input(t, "all_to_all");
  at::Tensor out = at::empty_like(b.tensor, at::MemoryFormat::Contiguous);
  const size_t count = b.count / size_t(size());
  void* o = out.numel() ? out.data_ptr() : nullptr;
  if (!async) {
    comm_->all_to_all(b.data(), o, count, b.dtype);
    return done({out});
  }
  return track(comm_->all_to_all_async(b.data(), o, count, b.dtype), {out}, {b.tensor});
}

// Point to point: a bad tensor is this rank's error only (the peer's matching call fails on
// its own deadline or mismatch), so it throws here without communicating.
static void check_p2p(const at::Tensor& t, const char* op) {
  if (auto why = detail::tensor_problem(t); !why.empty()) throw InvalidArgument(concat(op, ": ", why));
}

std::shared_ptr<TensorWork> ProcessGroup::send_impl(const at::Tensor& t, int dst, int tag, bool async) {
  check_p2p(t, "send");
  at::Tensor c = detail::plain(t);
  const DataType dtype = core_type(c.scalar_type())->dtype;
  void* p = c.numel() ? c.data_ptr() : nullptr;
  if (!async) {
    comm_->send(p, core_count(c), dtype, dst, tag);
    return done();
  }
  return track(comm_->send_async(p, core_count(c), dtype, dst, tag), {}, {c});
}

std::shared_ptr<TensorWork> ProcessGroup::recv_impl(at::Tensor& t, int src, int tag, bool async) {
  check_p2p(t, "recv");
  at::Tensor c = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
  const DataType dtype = core_type(c.scalar_type())->dtype;
  void* p = c.numel() ? c.data_ptr() : nullptr;
  if (!async) {
    comm_->recv(p, core_count(c), dtype, src, tag);
    write_back(t, c);
    return done();
  }
  return track(comm_->recv_async(p, core_count(c), dtype, src, tag), {}, {t, c},
               [t, c]() mutable { write_back(t, c); });
}

void ProcessGroup::all_reduce_(at::Tensor& t, ReduceOp op) { all_reduce_impl(t, op, false); }
void ProcessGroup::broadcast_(at::Tensor& t, int src) { broadcast_impl(t, src, false); }
void ProcessGroup::reduce_(at::Tensor& t, int dst, ReduceOp op) { reduce_impl(t, dst, op, false); }
at::Tensor ProcessGroup::all_gather(const at::Tensor& t) { return all_gather_impl(t, false)->outputs_[0]; }
std::vector<at::Tensor> ProcessGroup::all_gather_v(const at::Tensor& t) { return all_gather_v_impl(t, false)->outputs_; }
std::optional<at::Tensor> ProcessGroup::gather(const at::Tensor& t, int dst) {
  auto w = gather_impl(t, dst, false);
  if (w->outputs_.empty()) return std::nullopt;
  return w->outputs_[0];
}
at::Tensor ProcessGroup::scatter(const std::optional<at::Tensor>& stacked, int src) {
  return scatter_impl(stacked, src, false)->outputs_[0];
}
at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& t, ReduceOp op) {
  return reduce_scatter_impl(t, op, false)->outputs_[0];
}
at::Tensor ProcessGroup::all_to_all(const at::Tensor& t) { return all_to_all_impl(t, false)->outputs_[0]; }
void ProcessGroup::send(const at::Tensor& t, int dst, int tag) { send_impl(t, dst, tag, false); }
void ProcessGroup::recv(at::Tensor& t, int src, int tag) { recv_impl(t, src, tag, false); }
void ProcessGroup::barrier(std::optional<std::chrono::milliseconds> timeout) { comm_->barrier(timeout); }

std::shared_ptr<TensorWork> ProcessGroup::all_reduce_async(at::Tensor& t, ReduceOp op) {
  return all_reduce_impl(t, op, true);
}
std::shared_ptr<TensorWork> ProcessGroup::broadcast_async(at::Tensor& t, int src) { return broadcast_impl(t, src, true); }
std::shared_ptr<TensorWork> ProcessGroup::reduce_async(at::Tensor& t, int dst, ReduceOp op) {
  return reduce_impl(t, dst, op, true);
}
std::shared_ptr<TensorWork> ProcessGroup::all_gather_async(const at::Tensor& t) { return all_gather_impl(t, true); }
std::shared_ptr<TensorWork> ProcessGroup::all_gather_v_async(const at::Tensor& t) {
  return all_gather_v_impl(t, true);
}
std::shared_ptr<TensorWork> ProcessGroup::gather_async(const at::Tensor& t, int dst) { return gather_impl(t, dst, true); }
std::shared_ptr<TensorWork> ProcessGroup::scatter_async(const std::optional<at::Tensor>& stacked, int src) {
  return scatter_impl(stacked, src, true);
}
std::shared_ptr<TensorWork> ProcessGroup::reduce_scatter_async(const at::Tensor& t, ReduceOp op) {
  return reduce_scatter_impl(t, op, true);
}
std::shared_ptr<TensorWork> ProcessGroup::all_to_all_async(const at::Tensor& t) { return all_to_all_impl(t, true); }
std::shared_ptr<TensorWork> ProcessGroup::send_async(const at::Tensor& t, int dst, int tag) {
  return send_impl(t, dst, tag, true);
}
std::shared_ptr<TensorWork> ProcessGroup::recv_async(at::Tensor& t, int src, int tag) {
  return recv_impl(t, src, tag, true);
}
std::shared_ptr<TensorWork> ProcessGroup::barrier_async() { return track(comm_->barrier_async(), {}, {}); }

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<int>& ranks) {
  auto child = comm_->split(ranks);
  if (!child) return nullptr;
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_rank(r));
  return std::make_shared<ProcessGroup>(child, global);
}

// ---- the default group ------------------------------------------------------------------

namespace {
std::mutex g_mu;
std::shared_ptr<ProcessGroup> g_default;
Environment g_env;
}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(const Environment& env, InitOptions options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_default) return g_default;
  auto store = connect_store(env);
  CommunicatorOptions co;
  co.backend = options.backend;
  co.timeout = options.timeout;
  co.name = "world";
  auto comm = Communicator::create(store, env.rank, env.world_size, co);
  std::vector<int> ranks(size_t(env.world_size));
  for (int r = 0; r < env.world_size; ++r) ranks[size_t(r)] = r;
  g_env = env;
  g_default = std::make_shared<ProcessGroup>(comm, ranks);
  return g_default;
}

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_default) return g_default;
  }
  return init_process_group(Environment::detect(), options);
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_default)
    throw Error("chorus: the default process group is not initialized: call chorus::init_process_group() "
                "(or Fabric::launch()) first");
  return g_default;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_default != nullptr;
}

Environment environment() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_default ? g_env : Environment();
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_default.reset();
  g_env = Environment();
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) { return default_group()->split(ranks); }

ProcessGroup& group_or_default(const std::shared_ptr<ProcessGroup>& group) {
  if (group) return *group;
  return *default_group();
}

}  // namespace chorus
