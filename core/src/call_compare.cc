#include "call_compare.h"

#include <algorithm>
#include <cstring>

#include "chorus/core/error.h"

namespace chorus {

namespace {
// A mismatch report's line per rank: "\n  rank 2 (call #7): barrier()".
constexpr const char* kReportLine = "\n  rank ";
constexpr const char* kReportCall = "): ";
}  // namespace

uint64_t fingerprint(const CallDesc& desc, const std::vector<uint64_t>& counts) {
  CallDesc d = desc;
  d.invalid = 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  mix(&d, sizeof d);
  if (OpKind(d.kind) != OpKind::AllToAllV) mix(counts.data(), counts.size() * sizeof(uint64_t));
  return h;
}

std::vector<uint64_t> travelling_counts(const Call& call) {
  if (!has_counts(call.kind)) return {};
  std::vector<uint64_t> v(call.counts.begin(), call.counts.end());
  v.insert(v.end(), call.recv_counts.begin(), call.recv_counts.end());
  return v;
}

std::string list_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

void put_text(char* field, const std::string& text, size_t bytes) {
  std::memset(field, 0, bytes);
  std::memcpy(field, text.data(), std::min(text.size(), bytes - 1));
}

std::string describe_desc(const CallDesc& d, const uint64_t* counts, int world) {
  std::string s = describe(OpKind(d.kind), DataType(d.dtype), ReduceOp(d.op), d.root, d.count);
  if (d.ncounts > 0) {
    s += " counts [";
    const uint32_t shown = std::min<uint32_t>(d.ncounts, 16);
    for (uint32_t i = 0; i < shown; ++i) s += (i ? ", " : "") + std::to_string(counts[i]);
    if (shown < d.ncounts) s += ", ...";
    s += "]";
    if (OpKind(d.kind) == OpKind::AllToAllV) {
      s += " recv [";
      for (int i = 0; i < std::min(world, 16); ++i) s += (i ? ", " : "") + std::to_string(counts[world + i]);
      s += "]";
    }
  }
  return s;
}

void compare_calls(const std::vector<RankCall>& all, int me, uint64_t index, const std::string& group) {
  const int world = int(all.size());
  const CallDesc mine = all[size_t(me)].desc;
  bool invalid = false, mismatch = false;
  for (const RankCall& r : all) {
    const CallDesc& d = r.desc;
    invalid = invalid || d.invalid;
    mismatch = mismatch || d.call != mine.call || d.kind != mine.kind || d.dtype != mine.dtype || d.op != mine.op ||
               d.root != mine.root || d.count != mine.count || d.ncounts != mine.ncounts;
    if (!mismatch && mine.ncounts > 0 && OpKind(mine.kind) != OpKind::AllToAllV)
      mismatch = !std::equal(r.counts, r.counts + mine.ncounts, all[size_t(me)].counts);
  }
  if (invalid) {
    if (mine.invalid) throw InvalidArgument(all[size_t(me)].invalid_text);
    std::string texts;
    for (int p = 0; p < world; ++p)
      if (all[size_t(p)].desc.invalid)
        texts += detail::concat(texts.empty() ? "" : "; ", "rank ", p, ": ", all[size_t(p)].invalid_text);
    throw InvalidArgument(
        detail::concat(describe(OpKind(mine.kind), DataType(mine.dtype), ReduceOp(mine.op), mine.root, mine.count),
                       " on group '", group, "': another rank rejected its arguments (", texts, ")"));
  }
  if (!mismatch && OpKind(mine.kind) == OpKind::AllToAllV) {
    // What p sends to q must be what q expects from p.
    for (int p = 0; p < world && !mismatch; ++p)
      for (int q = 0; q < world && !mismatch; ++q)
        mismatch = all[size_t(p)].counts[q] != all[size_t(q)].counts[world + p];
  }
  if (!mismatch) return;
  std::vector<std::string> calls;
  std::string lines;
  for (int p = 0; p < world; ++p) {
    const CallDesc& d = all[size_t(p)].desc;
    calls.push_back(describe_desc(d, all[size_t(p)].counts, world));
    lines += detail::concat(kReportLine, p, " (call #", d.call, kReportCall, calls.back());
  }
  throw CollectiveMismatch(detail::concat("ranks of group '", group, "' made different calls at call #", index,
                                          " (every rank must call the same collective with the same dtype, "
                                          "count, op and root):",
                                          lines),
                           calls);
}

std::vector<std::string> calls_in_mismatch_report(const std::string& text) {
  std::vector<std::string> calls;
  for (size_t at = text.find(kReportLine); at != std::string::npos; at = text.find(kReportLine, at + 1)) {
    const size_t call = text.find(kReportCall, at);
    if (call == std::string::npos) break;
    const size_t begin = call + std::strlen(kReportCall);
    calls.push_back(text.substr(begin, text.find('\n', begin) - begin));
  }
  return calls;
}

}  // namespace chorus
