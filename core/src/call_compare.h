// Note [Comparing calls]: the cross-rank half of checking a call (the local half is argument
// validation, communicator/arguments.h). Before moving any data, every backend compares the
// ranks' calls: each rank publishes a CallDesc (plus its counts, and why its arguments were
// invalid if they were) and compares everyone's with compare_calls. Different calls raise
// CollectiveMismatch on every rank, showing each rank's call; a rank whose arguments were
// invalid makes every rank raise InvalidArgument. How the descriptors travel is the backend's
// business (shared memory; or a max-reduction of their fingerprints, and an all_gather of the
// whole records only when they differ).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "call.h"

namespace chorus {

constexpr size_t kTextBytes = 256;  // room for a rejection text
// Room for an abort text: a mismatch report lists every rank's call, about 50 bytes a rank.
constexpr size_t kAbortTextBytes = 8192;

// What a rank called, as its peers see it. Plain data.
struct CallDesc {
  uint64_t count;
  uint32_t call;     // 1-based index of the call in this communicator (compared for equality)
  uint32_t ncounts;  // entries of the counts that travel with it
  int32_t root;
  uint8_t kind, dtype, op, invalid;
};
static_assert(sizeof(CallDesc) == 24);

// Whether the call's counts (and AllToAllV's recv counts after them) travel with it.
inline bool has_counts(OpKind kind) {
  return kind == OpKind::AllGatherV || kind == OpKind::GatherV || kind == OpKind::AllToAllV || kind == OpKind::Split;
}
// Every call makes one, so both are inline.
inline CallDesc make_desc(const Call& call, uint64_t index) {
  CallDesc d{};
  d.call = uint32_t(index);
  d.count = call.count;
  d.root = call.root;
  d.kind = uint8_t(call.kind);
  d.dtype = uint8_t(call.dtype);
  d.op = uint8_t(call.op);
  d.invalid = call.invalid.empty() ? 0 : 1;
  if (has_counts(call.kind)) d.ncounts = uint32_t(call.counts.size());
  return d;
}
// The call's counts as they travel: counts, then (AllToAllV) recv_counts; 2 * world at most.
std::vector<uint64_t> travelling_counts(const Call& call);
// "2, 5, 7": ranks as error messages list them.
std::string list_ranks(const std::vector<int>& ranks);
// Copies text into a field of `bytes` (kTextBytes unless told), cut to fit, always terminated.
void put_text(char* field, const std::string& text, size_t bytes = kTextBytes);
std::string describe_desc(const CallDesc& d, const uint64_t* counts, int world);
// The calls a mismatch report (CollectiveMismatch's what()) shows, one per rank, read back from
// its text: how a rank that learns of the mismatch from a peer's abort shows the same calls.
std::vector<std::string> calls_in_mismatch_report(const std::string& text);

// What compare_calls compares between ranks, as 64 bits: equal fingerprints mean equal calls
// (but for a 2^-64 chance). A rejection does not count, and neither do all_to_all_v's counts,
// which rightly differ between ranks. Lets a backend check a call with one small max-reduction
// and gather the whole descriptors only when the ranks disagree.
uint64_t fingerprint(const CallDesc& desc, const std::vector<uint64_t>& counts);

// One rank's call as it arrived.
struct RankCall {
  CallDesc desc;
  const uint64_t* counts;    // 2 * world entries
  const char* invalid_text;  // kTextBytes, terminated
};

// Throws InvalidArgument or CollectiveMismatch unless every rank made this rank's call
// (Note [Comparing calls]). `all` is indexed by rank; `group` names the group in messages.
void compare_calls(const std::vector<RankCall>& all, int me, uint64_t index, const std::string& group);

}  // namespace chorus
