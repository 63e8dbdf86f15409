// torch.distributed's list and coalesced forms of ProcessGroup: all_gather into the caller's
// list, the coalesced all_reduce / all_gather_into / reduce_scatter_into, all_to_all with split
// sizes or lists. C++ users have them as the Python backend does, which serves torch's calls with
// them one for one. Each is written once (Note [One body per collective], prepared_call.h); the
// coalesced ones agree on their lists first (Note [Agreeing on a list]).
#include <numeric>

#include "chorus/process_group.h"
#include "groups/process_group/prepared_call.h"

namespace chorus {

using detail::Buffer;
using detail::concat;
using detail::data_of;
using detail::input;
using detail::run_now;
using detail::write_back;
using Prepared = detail::PreparedCall;

namespace {

// The caller's outputs as contiguous buffers the core writes (staging where one is not), checked
// against `want` elements of t's dtype each; a bad one rejects `op` on every rank.
std::vector<at::Tensor> outputs_for(Communicator& comm, const char* op, const std::vector<at::Tensor>& outs,
                                    const at::Tensor& t, int64_t want) {
  std::vector<at::Tensor> targets;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (auto why = detail::output_problem(outs[i], t, want, false); !why.empty())
      comm.reject(op, concat("output ", i, ": ", why));
    targets.push_back(detail::writable(outs[i]));
  }
  return targets;
}

void write_all_back(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& targets) {
  for (size_t i = 0; i < outs.size(); ++i) write_back(outs[i], targets[i]);
}

Prepared all_gather_list_body(Communicator& comm, std::vector<at::Tensor>& outputs, const at::Tensor& t) {
  const char* op = "all_gather";
  Buffer b = input(comm, t, op);
  if (int(outputs.size()) != comm.size())
    comm.reject(op, concat("it needs one output per rank (", comm.size(), "), got ", outputs.size()));
  std::vector<at::Tensor> targets = outputs_for(comm, op, outputs, t, t.numel());
  std::vector<void*> blocks;
  for (const at::Tensor& target : targets) blocks.push_back(data_of(target));
  return {{}, [&comm, b, outputs, targets, blocks] {
            comm.all_gather_to(b.data(), blocks, b.count, b.dtype);
            write_all_back(outputs, targets);
          }};
}

Prepared all_reduce_coalesced_body(Communicator& comm, std::vector<at::Tensor>& tensors, ReduceOp op) {
  const char* name = "all_reduce_coalesced";
  for (const at::Tensor& t : tensors)
    if (auto why = detail::tensor_problem(t, op); !why.empty()) comm.reject(name, why);
  // One flat buffer per dtype, in order of first appearance; a dtype with one contiguous tensor
  // reduces it in place.
  struct Group {
    std::vector<at::Tensor> members;
    at::Tensor flat;
    Buffer buffer;
  };
  std::vector<Group> groups;
  for (const at::Tensor& t : tensors) {
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Group& x) { return x.members.front().scalar_type() == t.scalar_type(); });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{{}, {}, {}});
    g->members.push_back(t);
  }
  for (Group& g : groups) {
    if (g.members.size() == 1) {
      g.flat = detail::plain(g.members[0]);
      continue;
    }
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : g.members) flat.push_back(t.reshape({-1}));
    g.flat = at::cat(flat);
  }
  for (Group& g : groups) g.buffer = input(comm, g.flat, name, op);
  const std::string call = concat(name, "(", detail::list_string(tensors), ", ", to_string(op), ")");
  // One tensor: the core compares the one collective; any other count: the lists first.
  const bool check = tensors.size() != 1;
  return {{}, [&comm, groups, op, call, check, name] {
            if (check) detail::require_same(comm, name, detail::kSameList, call);
            for (const Group& g : groups) {
              const Buffer& b = g.buffer;
              comm.all_reduce(b.data(), b.data(), b.count, b.dtype, op);
              if (g.members.size() == 1) {
                write_back(g.members[0], g.flat);
                continue;
              }
              int64_t at = 0;
              for (const at::Tensor& t : g.members) {
                write_back(t, g.flat.slice(0, at, at + t.numel()).view(t.sizes()));
                at += t.numel();
              }
            }
          }};
}

// The pairs of all_gather_into_coalesced (size() times the input's elements out) and
// reduce_scatter_into_coalesced (the input's elements over size() out).
Prepared into_coalesced_body(Communicator& comm, const char* name, std::vector<at::Tensor>& outs,
                             const std::vector<at::Tensor>& ins, std::optional<ReduceOp> op) {
  const int w = comm.size();
  if (outs.size() != ins.size())
    comm.reject(name, concat("it takes one output per input, got ", outs.size(), " for ", ins.size()));
  std::vector<Buffer> in_bufs;
  std::vector<at::Tensor> targets;
  for (size_t i = 0; i < ins.size(); ++i) {
    in_bufs.push_back(input(comm, ins[i], name, op));
    if (op && ins[i].numel() % w)
      comm.reject(name,
                  concat("input ", i, "'s ", ins[i].numel(), " elements are not a multiple of the group size ", w));
    const int64_t want = op ? ins[i].numel() / w : ins[i].numel() * w;
    if (auto why = detail::output_problem(outs[i], ins[i], want, false); !why.empty())
      comm.reject(name, concat("output ", i, ": ", why));
    targets.push_back(detail::writable(outs[i]));
  }
  std::string call = concat(name, "(", detail::list_string(ins));
  if (op) call += concat(", ", to_string(*op));
  call += ")";
  return {{}, [&comm, name, outs, in_bufs, targets, op, call, w] {
            if (in_bufs.size() != 1) detail::require_same(comm, name, detail::kSameList, call);
            for (size_t i = 0; i < in_bufs.size(); ++i) {
              const Buffer& b = in_bufs[i];
              if (op)
                comm.reduce_scatter(b.data(), data_of(targets[i]), b.count / size_t(w), b.dtype, *op);
              else
                comm.all_gather(b.data(), data_of(targets[i]), b.count, b.dtype);
            }
            write_all_back(outs, targets);
          }};
}

// Every rank's block of `t` along dim 0, in core elements: `splits` rows each, or even blocks.
std::vector<size_t> split_counts(Communicator& comm, const char* op, const at::Tensor& t,
                                 const std::vector<int64_t>& splits, const char* which) {
  const int w = comm.size();
  const int64_t rows = t.dim() ? t.size(0) : 1;
  const size_t row = rows ? detail::core_count(t) / size_t(rows) : 0;
  std::vector<size_t> counts(static_cast<size_t>(w));
  if (splits.empty()) {
    if (rows % w)
      comm.reject(
          op, concat(which, " has ", rows, " rows, which do not split evenly over ", w, " ranks; pass split sizes"));
    for (auto& c : counts) c = size_t(rows / w) * row;
    return counts;
  }
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t(0));
  if (int(splits.size()) != w || total != rows ||
      std::any_of(splits.begin(), splits.end(), [](int64_t s) { return s < 0; }))
    comm.reject(op, concat(which, " split sizes ", detail::shape_string(splits), " must be ", w,
                           " non-negative numbers adding up to its ", rows, " rows"));
  for (size_t q = 0; q < counts.size(); ++q) counts[q] = size_t(splits[q]) * row;
  return counts;
}

Prepared all_to_all_into_body(Communicator& comm, at::Tensor& out, const at::Tensor& in,
                              const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits) {
  const char* op = "all_to_all_single";
  Buffer b = input(comm, in, op);
  if (auto why = detail::tensor_problem(out); !why.empty()) comm.reject(op, concat("output: ", why));
  if (out.scalar_type() != in.scalar_type())
    comm.reject(op, concat("input is ", detail::describe(in), " but output is ", detail::describe(out),
                           "; they must share a dtype"));
  std::vector<size_t> sends = split_counts(comm, op, in, in_splits, "input");
  std::vector<size_t> recvs = split_counts(comm, op, out, out_splits, "output");
  at::Tensor target = detail::writable(out);
  return {{}, [&comm, b, out, target, sends, recvs] {
            comm.all_to_all_v(b.data(), sends, data_of(target), recvs, b.dtype);
            write_back(out, target);
          }};
}

Prepared all_to_all_list_body(Communicator& comm, std::vector<at::Tensor>& outputs,
                              const std::vector<at::Tensor>& inputs) {
  const char* op = "all_to_all";
  const size_t w = size_t(comm.size());
  if (outputs.size() != w || inputs.size() != w)
    comm.reject(
        op, concat("it takes ", w, " input and ", w, " output tensors, got ", inputs.size(), " and ", outputs.size()));
  std::vector<size_t> sends(w), recvs(w);
  for (size_t q = 0; q < w; ++q) {
    for (const at::Tensor& t : {inputs[q], outputs[q]})
      if (auto why = detail::tensor_problem(t); !why.empty()) comm.reject(op, why);
    if (inputs[q].scalar_type() != inputs[0].scalar_type() || outputs[q].scalar_type() != inputs[0].scalar_type())
      comm.reject(op, concat("every tensor must have the dtype of the first (", detail::describe(inputs[0]), "); ",
                             detail::describe(inputs[q]), " and ", detail::describe(outputs[q]), " at ", q));
    sends[q] = detail::core_count(inputs[q]);
    recvs[q] = detail::core_count(outputs[q]);
  }
  std::vector<at::Tensor> flat_in;
  for (const at::Tensor& t : inputs) flat_in.push_back(t.reshape({-1}));
  Buffer b = input(comm, at::cat(flat_in), op);
  const int64_t total = std::accumulate(outputs.begin(), outputs.end(), int64_t(0),
                                        [](int64_t n, const at::Tensor& t) { return n + t.numel(); });
  at::Tensor got = at::empty({total}, inputs[0].options());
  return {{}, [&comm, b, sends, got, recvs, outputs] {
            comm.all_to_all_v(b.data(), sends, data_of(got), recvs, b.dtype);
            int64_t at = 0;
            for (const at::Tensor& t : outputs) {
              write_back(t, got.slice(0, at, at + t.numel()).view(t.sizes()));
              at += t.numel();
            }
          }};
}

// gather / scatter / reduce_scatter over lists: every tensor of the call has the shape and dtype
// of `like` (t, or out); the core moves them through one stacked buffer.
void check_list(Communicator& comm, const char* op, const std::vector<at::Tensor>& list, const at::Tensor& like,
                const char* which) {
  if (int(list.size()) != comm.size())
    comm.reject(op, concat("it needs one ", which, " per rank (", comm.size(), "), got ", list.size()));
  for (size_t i = 0; i < list.size(); ++i)
    if (auto why = detail::output_problem(list[i], like, like.numel(), false); !why.empty())
      comm.reject(op, concat(which, " ", i, ": ", why));
}

Prepared gather_list_body(Communicator& comm, std::vector<at::Tensor>& outputs, const at::Tensor& t, int dst) {
  const char* op = "gather";
  Buffer b = input(comm, t, op);
  at::Tensor stacked;
  if (comm.rank() == dst) {
    check_list(comm, op, outputs, t, "output");
    stacked = at::empty({comm.size() * t.numel()}, b.tensor.options());
  }
  return {{}, [&comm, b, outputs, stacked, dst] {
            comm.gather(b.data(), data_of(stacked), b.count, b.dtype, dst);
            const int64_t n = b.tensor.numel();
            for (size_t r = 0; r < outputs.size(); ++r)
              write_back(outputs[r], stacked.slice(0, int64_t(r) * n, int64_t(r + 1) * n).view(outputs[r].sizes()));
          }};
}

Prepared scatter_list_body(Communicator& comm, at::Tensor& out, const std::vector<at::Tensor>& inputs, int src) {
  const char* op = "scatter";
  if (auto why = detail::tensor_problem(out); !why.empty()) comm.reject(op, concat("output: ", why));
  if (src < 0 || src >= comm.size())
    comm.reject(op, concat("source ", src, " is not a rank of this group (size ", comm.size(), ")"));
  Buffer b{};
  if (comm.rank() == src) {
    check_list(comm, op, inputs, out, "input");
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : inputs) flat.push_back(t.reshape({-1}));
    b = input(comm, at::cat(flat), op);
  }
  at::Tensor target = detail::writable(out);
  const auto type = detail::core_type(out.scalar_type());
  return {{}, [&comm, b, out, target, src, count = detail::core_count(out), dtype = type->dtype] {
            comm.scatter(b.data(), data_of(target), count, dtype, src);
            write_back(out, target);
          }};
}

Prepared reduce_scatter_list_body(Communicator& comm, at::Tensor& out, const std::vector<at::Tensor>& inputs,
                                  ReduceOp op) {
  const char* name = "reduce_scatter";
  if (auto why = detail::tensor_problem(out, op); !why.empty()) comm.reject(name, concat("output: ", why));
  check_list(comm, name, inputs, out, "input");
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : inputs) flat.push_back(t.reshape({-1}));
  Buffer b = input(comm, at::cat(flat), name, op);
  at::Tensor target = detail::writable(out);
  return {{}, [&comm, b, out, target, op, count = detail::core_count(out)] {
            comm.reduce_scatter(b.data(), data_of(target), count, b.dtype, op);
            write_back(out, target);
          }};
}

}  // namespace

void ProcessGroup::gather(std::vector<at::Tensor>& outputs, const at::Tensor& t, int dst) {
  run_now(gather_list_body(*comm_, outputs, t, dst));
}
void ProcessGroup::scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, int src) {
  run_now(scatter_list_body(*comm_, out, inputs, src));
}
void ProcessGroup::reduce_scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, ReduceOp op) {
  run_now(reduce_scatter_list_body(*comm_, out, inputs, op));
}
ProcessGroup::Handle ProcessGroup::gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& t, int dst,
                                                TensorAsyncOptions async) {
  return submit(gather_list_body(*comm_, outputs, t, dst), std::move(async));
}
ProcessGroup::Handle ProcessGroup::scatter_async(at::Tensor& out, const std::vector<at::Tensor>& inputs, int src,
                                                 TensorAsyncOptions async) {
  return submit(scatter_list_body(*comm_, out, inputs, src), std::move(async));
}
ProcessGroup::Handle ProcessGroup::reduce_scatter_async(at::Tensor& out, const std::vector<at::Tensor>& inputs,
                                                        ReduceOp op, TensorAsyncOptions async) {
  return submit(reduce_scatter_list_body(*comm_, out, inputs, op), std::move(async));
}

void ProcessGroup::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& t) {
  run_now(all_gather_list_body(*comm_, outputs, t));
}
void ProcessGroup::all_reduce_coalesced_(std::vector<at::Tensor>& tensors, ReduceOp op) {
  run_now(all_reduce_coalesced_body(*comm_, tensors, op));
}
void ProcessGroup::all_gather_into_coalesced(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins) {
  run_now(into_coalesced_body(*comm_, "all_gather_into_coalesced", outs, ins, std::nullopt));
}
void ProcessGroup::reduce_scatter_into_coalesced(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins,
                                                 ReduceOp op) {
  run_now(into_coalesced_body(*comm_, "reduce_scatter_into_coalesced", outs, ins, op));
}
void ProcessGroup::all_to_all_into(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) {
  run_now(all_to_all_into_body(*comm_, out, in, out_splits, in_splits));
}
void ProcessGroup::all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  run_now(all_to_all_list_body(*comm_, outputs, inputs));
}

ProcessGroup::Handle ProcessGroup::all_gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& t,
                                                    TensorAsyncOptions async) {
  return submit(all_gather_list_body(*comm_, outputs, t), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_reduce_coalesced_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                              TensorAsyncOptions async) {
  return submit(all_reduce_coalesced_body(*comm_, tensors, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_gather_into_coalesced_async(std::vector<at::Tensor>& outs,
                                                                   const std::vector<at::Tensor>& ins,
                                                                   TensorAsyncOptions async) {
  return submit(into_coalesced_body(*comm_, "all_gather_into_coalesced", outs, ins, std::nullopt), std::move(async));
}
ProcessGroup::Handle ProcessGroup::reduce_scatter_into_coalesced_async(std::vector<at::Tensor>& outs,
                                                                       const std::vector<at::Tensor>& ins, ReduceOp op,
                                                                       TensorAsyncOptions async) {
  return submit(into_coalesced_body(*comm_, "reduce_scatter_into_coalesced", outs, ins, op), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_to_all_into_async(at::Tensor& out, const at::Tensor& in,
                                                         const std::vector<int64_t>& out_splits,
                                                         const std::vector<int64_t>& in_splits,
                                                         TensorAsyncOptions async) {
  return submit(all_to_all_into_body(*comm_, out, in, out_splits, in_splits), std::move(async));
}
ProcessGroup::Handle ProcessGroup::all_to_all_async(std::vector<at::Tensor>& outputs,
                                                    const std::vector<at::Tensor>& inputs, TensorAsyncOptions async) {
  return submit(all_to_all_list_body(*comm_, outputs, inputs), std::move(async));
}

}  // namespace chorus
