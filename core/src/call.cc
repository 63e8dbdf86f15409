#include "call.h"

#include <time.h>

#include <algorithm>

#include "chorus/core/error.h"

namespace chorus {

Clock::time_point coarse_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // the same clock as steady_clock, at tick resolution
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
}

std::string_view to_string(OpKind kind) {
  switch (kind) {
    case OpKind::Barrier: return "barrier";
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::AllGatherV: return "all_gather_v";
    case OpKind::Gather: return "gather";
    case OpKind::GatherV: return "gather_v";
    case OpKind::Scatter: return "scatter";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::AllToAllV: return "all_to_all_v";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::Split: return "split";
    case OpKind::AllocSymmetric: return "alloc_symmetric";
    case OpKind::RecvAny: return "recv_any";
  }
  return "unknown call";
}

std::string describe(OpKind kind, DataType dtype, ReduceOp op, int root, uint64_t count) {
  std::string s = std::string(to_string(kind));
  switch (kind) {
    case OpKind::Barrier: return s + "()";
    case OpKind::Split: return detail::concat(s, "(", count, " ranks)");
    case OpKind::AllocSymmetric: return detail::concat(s, "(", count, " bytes)");
    default: break;
  }
  s += detail::concat("(", to_string(dtype));
  if (kind != OpKind::AllGatherV && kind != OpKind::GatherV && kind != OpKind::AllToAllV)
    s += detail::concat(" x ", count);
  if (kind == OpKind::AllReduce || kind == OpKind::Reduce || kind == OpKind::ReduceScatter)
    s += detail::concat(", ", to_string(op));
  if (kind == OpKind::Broadcast || kind == OpKind::Reduce || kind == OpKind::Gather || kind == OpKind::GatherV ||
      kind == OpKind::Scatter)
    s += detail::concat(", root ", root);
  return s + ")";
}

std::string describe(const Call& c) {
  std::string s = describe(c.kind, c.dtype, c.op, c.root, c.count);
  if (c.kind == OpKind::RecvAny)
    s = detail::concat("recv(", to_string(c.dtype), " x ", c.count, ", from any rank, tag ", c.tag, ")");
  else if (point_to_point(c.kind))
    s = detail::concat(to_string(c.kind), "(", to_string(c.dtype), " x ", c.count, ", ",
                       c.kind == OpKind::Send ? "to" : "from", " rank ", c.root, ", tag ", c.tag, ")");
  return s;
}

}  // namespace chorus
