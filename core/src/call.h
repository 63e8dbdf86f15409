// One collective or point-to-point call as the Communicator hands it to a backend: its arguments
// (validated on this rank, communicator/arguments.h), plus the deadline. Backends never see
// torch, only these.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/core/dtype.h"

namespace chorus {

enum class OpKind : uint8_t {
  Barrier = 1,
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  AllGatherV,
  Gather,
  GatherV,
  Scatter,
  ReduceScatter,
  AllToAll,
  AllToAllV,
  Send,
  Recv,
  Split,
  AllocSymmetric,
  RecvAny,  // a Recv from whichever peer's message comes first (root -1)
};
std::string_view to_string(OpKind kind);
// Send, Recv, RecvAny: ordered per (peer, direction), not collective.
inline bool point_to_point(OpKind kind) {
  return kind == OpKind::Send || kind == OpKind::Recv || kind == OpKind::RecvAny;
}

using Clock = std::chrono::steady_clock;

// steady_clock's time at the last tick (1-4 ms): cheap enough to stamp every call, precise
// enough for deadlines.
Clock::time_point coarse_now();

// The time left until `deadline`, at least 1 ms: what a call passes on to the step it waits in.
std::chrono::milliseconds left_until(Clock::time_point deadline);

struct Call {
  OpKind kind = OpKind::Barrier;
  DataType dtype = DataType::UInt8;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;        // broadcast/reduce/gather/scatter; peer for send/recv
  int tag = 0;         // send/recv
  uint64_t count = 0;  // elements per rank (the meaning each collective documents)
  const void* in = nullptr;
  void* out = nullptr;
  // AllGatherV/GatherV: elements of every rank. AllToAllV: send counts (per destination).
  // Split: the member ranks.
  std::vector<uint64_t> counts;
  std::vector<uint64_t> recv_counts;  // AllToAllV only (per source)
  int* source = nullptr;              // RecvAny: where the backend writes the sender's rank
  // AllGather into separate buffers: rank p's block goes to outs[p] (out is null). Empty: out.
  std::vector<void*> outs;
  Clock::time_point start;
  Clock::time_point deadline;
  // Non-empty when this rank's arguments were rejected: the backend still meets the others in
  // the call's first step so that every rank raises InvalidArgument, then throws this text.
  std::string invalid;
  // Only compare the call with the other ranks' (Note [Comparing calls]) and move no data: a layer
  // that runs the call some other way (Note [Hierarchy]) compares it on the whole group first.
  bool compare_only = false;
  // The whole group compared this very call already (Note [Hierarchy]): a backend whose comparison
  // costs a network round (the engines) skips its own.
  bool compared = false;
};

// "all_reduce(f32 x 1000, sum)" — how calls appear in error messages.
std::string describe(OpKind kind, DataType dtype, ReduceOp op, int root, uint64_t count);
std::string describe(const Call& call);

}  // namespace chorus
