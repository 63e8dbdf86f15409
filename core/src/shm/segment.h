// The shared-memory segment of one communicator, and the layout of everything inside it.
//
//   Header
//   RankControl[W]   per rank: its phase counter (the futex word), state, pid, the descriptors
//                    and inline payloads of its last two calls, error texts, per-call counts
//   slots[W][2]      per rank two data slots of slot_bytes, alternating by phase parity (Note
//                    [Deep slots when ranks share cores])
//   channels[W][W]   per ordered pair a two-chunk ring for send/recv
//
// Note [Segment lifetime]: rank 0 creates the segment under a random name and publishes the
// name in the store; each rank maps it and counts itself in Header::attached, and the rank that
// completes the count unlinks the name. From then on nothing is left in /dev/shm whatever
// happens to the processes: the memory lives exactly as long as some rank maps it. If the
// rendezvous fails, the rank that notices unlinks the name itself.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "call.h"
#include "call_compare.h"

namespace chorus {
class Store;
}

namespace chorus::shm {

constexpr size_t kLine = 64;
constexpr size_t kInlineBytes = 32;

// A fresh name for a POSIX shared-memory object ("/chorus-<pid>-<random>", under 64 bytes).
std::string unique_shm_name();

// Throws Error("<who>: <what> '<name>': <errno's text>").
[[noreturn]] void shm_fail(const std::string& who, const std::string& what, const std::string& name);

// Creates the object `name` (which must not exist yet) with `bytes` allocated and `unbacked` more
// bytes after them that no memory backs yet, and returns its open descriptor. If the space cannot
// be had, unlinks the name and throws; `hint` follows the message's question whether /dev/shm is
// large enough.
int create_shm_object(const std::string& who, const std::string& name, size_t bytes, const std::string& hint = "",
                      size_t unbacked = 0);

// Note [One line per call]: everything a peer needs to finish a small call sits in one cache
// line: the descriptor, the inline payload, and the last phase the rank posted during this call.
// Peers spin on that phase, so a tiny all_reduce or a barrier costs one line transfer per peer.
// RankControl::seq repeats the phase as the futex word for sleepers.
//
// Note [Migrating lines]: a rank never reads back what it stored into its own lines; it keeps a
// copy (ShmGroup::desc_, cpu_) or reads its own input. On the Zen 4 VM a line that one core wrote
// and another then read is gone from the writer's cache (the reader takes it whole, expecting to
// write it next), so the writer's read of its own line waits for the line to come back, a
// transfer as slow as the one it follows. compare() read the own descriptor from the call line
// after every wait, and every small call paid that transfer before it returned: two threads
// pinned to the two vCPUs, each storing into its line and waiting on the other's, took 0.19 us a
// call in the slow state (0.5 us round trip), 0.46 when each also read its own line back.
// chorus-bench at W=2, 30 alternating rounds, slow / fast state, before and after: barrier 0.56 /
// 0.22 -> 0.40 / 0.17 us, 8-byte all_reduce 0.65 / 0.29 -> 0.47 / 0.25, 8-byte all_gather 0.62 /
// 0.27 -> 0.43 / 0.23 (Open MPI in the slow state: 0.52, 0.69, 0.62).
//
// Note [The CPU in a line of its own]: a waiting peer reads RankControl::cpu at every wait that
// does not end at once, to decide whether to spin, and on this VM that read takes the line from
// its writer (above). In the line of seq and waiters, that read took away the line a post reads
// `waiters` from: a broadcast root, which returns once it has posted, waited there one round trip
// across the dies for its line to come back, where Open MPI's root only writes its reader's box.
// A rank writes cpu only when it moved, so in a line of its own the line stays in its readers'
// caches, and the control line in its writer's. chorus-bench at W=2 beside a CPU-bound process,
// alternating runs (16-20 of each), medians of their median / p95 in us, before and after:
// 8-byte broadcast 0.06 / 0.18 -> 0.06 / 0.08 in the slow state, 0.065 / 0.08 -> 0.06 / 0.07 in
// the fast one (Open MPI 0.07-0.18 / 0.17-0.28 and 0.07 / 0.09). The ranks that wait now poll
// their peers a round trip sooner, and the p95s of calls in which every rank waits grew a little:
// barrier 0.32 / 0.39 -> 0.31 / 0.43 slow, 0.11 / 0.15 -> 0.11 / 0.17 fast, 8-byte all_reduce
// 0.36 / 0.45 -> 0.34 / 0.47 and 0.14 / 0.16 -> 0.14 / 0.20 (Open MPI 0.41-0.46 / 0.60-0.65 and
// 0.18 / 0.24; 0.44-0.55 / 0.68-0.88 and 0.21 / 0.27).
//
// Note [Aborted in the call line]: a rank that aborts also sets kLineAborted in both of its call
// lines. A peer that reaches a call late, after the others posted it and gave up on it, finds
// every phase it waits for already posted and never looks at their state; it reads the flag in
// the line it just read the phase from, and raises as they did instead of returning a result
// its peers have disowned. (Both lines, because the aborting thread need not be the one that
// knows the current call: a peer still finishing the call before may raise too, in a group that
// is aborted either way.) Reading the flag costs nothing: the line is already in the cache.
enum CallLineFlags : uint32_t {
  kLineAborted = 1,   // this rank aborted the group
  kLineNextWay = 14,  // rank 0's: the Way of the next call of this kind and size (Note [Streaming into the slots])
};
constexpr uint32_t kLineWayShift = 1;  // the lowest bit of kLineNextWay
struct alignas(kLine) CallLine {
  CallDesc desc;
  std::atomic<uint32_t> phase;
  std::atomic<uint32_t> flags;  // CallLineFlags
  uint8_t data[kInlineBytes];   // tiny payloads ride here
};
static_assert(sizeof(CallLine) == kLine);

enum RankState : uint32_t { kAbsent = 0, kActive = 1, kLeft = 2, kAborted = 3 };

struct alignas(kLine) RankControl {
  std::atomic<uint32_t> seq;      // last phase this rank posted; peers futex-wait on it
  std::atomic<uint32_t> waiters;  // peers sleeping on seq; the poster wakes them when non-zero
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> state;  // RankState
  std::atomic<uint32_t> abort_kind;
  std::atomic<int32_t> abort_rank;  // the failed or missing rank the abort names
  std::atomic<uint32_t> fences;     // 1: this process can pair light posts (Note [Light posts])
  // Note [Single-copy collectives]: where this rank maps the segment, and a random word that a
  // peer reads through this rank's pid to prove it may read this rank's memory.
  std::atomic<uint64_t> mapped_at;
  std::atomic<uint64_t> probe_word;
  CallLine calls[2];  // by call parity
  // The CPU this rank last posted from (Note [Waiting with more ranks than cores]), in a line of
  // its own (Note [The CPU in a line of its own]).
  alignas(kLine) std::atomic<int32_t> cpu;
  char invalid_text[2][kTextBytes];  // by call parity: why this rank rejected its arguments
  char abort_text[kAbortTextBytes];
  // Followed by uint64_t counts[2][2 * W] (by call parity); see Layout::counts.
};

struct alignas(kLine) Header {
  uint64_t magic;
  uint32_t world;
  uint32_t slot_depth;  // slot_bytes / chunk_bytes (Note [Deep slots when ranks share cores])
  uint64_t slot_bytes;
  uint64_t p2p_chunk;
  std::atomic<uint32_t> attached;
  uint32_t cores;                     // rank 0's job_cores(), so that every rank picks the same algorithms
  uint32_t single_copy;               // rank 0's SingleCopyMode (Note [Single-copy collectives])
  uint64_t stage_bytes;               // Note [A staging area for large broadcasts]
  std::atomic<uint32_t> stage_state;  // StageState, set by rank 0 only
};

// Note [A staging area for large broadcasts]: besides its slots, a segment has room for
// stage_bytes (CHORUS_SHM_STAGE_BYTES, rank 0's) that no memory backs until a broadcast needs it.
// Rank 0 reserves it (posix_fallocate: /dev/shm may be too small, and a store into a page tmpfs
// cannot back is a SIGBUS) before it posts the first phase of the first broadcast that outgrows
// the ring of slots, and says in stage_state whether it could; every rank reads that after the
// call's first sync, so all agree. Reserved, it stays so while the group lives.
enum StageState : uint32_t { kStageUntried = 0, kStageReady = 1, kStageUnavailable = 2 };

struct alignas(kLine) ChannelEnd {
  std::atomic<uint32_t> counter;  // chunks written (sender end) or consumed (receiver end)
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> error;  // receiver end: set when a message did not match the recv
};

// Each p2p chunk starts with this header in its own line.
struct alignas(kLine) ChunkHeader {
  uint64_t bytes;  // whole message
  uint64_t count;
  int32_t tag;
  uint8_t dtype;
  uint8_t first;
};

// Note [Deep slots when ranks share cores]: a round of a staged call is a handoff: the ranks wait
// for each other before they go on. With a core for every rank a handoff costs a line transfer,
// and rounds of chunk_bytes (CHORUS_SHM_CHUNK_BYTES) keep a call's pipeline in the cache. With
// more ranks than cores each handoff needs every rank to have had its turn on a core, and a rank
// that loses its core to another process stalls the others at the next one: W=4 on 2 cores beside
// a CPU-bound process, a 16 MiB broadcast took 3.8-9.1 ms through slots of 512 KiB and 1.7-1.8
// through slots of 2 MiB, with half the context switches (35,000-49,000 against 21,000-23,000 for
// the same work), and the p95 of a 16 MiB all_reduce fell from 64-83 ms to 24-26. So a group with
// more ranks than cores (rank 0's job_cores()) gets slots of up to kMaxSlotDepth chunks, as long
// as they total at most kDeepSlotsBytes, and the calls whose rounds are such handoffs of the whole
// group (broadcast, all_reduce and reduce) go in rounds of a whole slot (the all_reduce's within
// kGroupRoundBytes for the whole group, so that its slots stay in cache; a large one goes as a
// ring, Note [Ring through the slots]; a broadcast larger than all the slots, a chunk per slot,
// Note [A ring the message outgrows]). Unloaded that is a trade:
// W=4's 16 MiB all_reduce took 5.6-6.4 ms in rounds of 2 MiB and 5.5-7.0 in rounds of 512 KiB in
// chorus-bench alone, but 7.4-8.0 against 5.5-6.7 in three pairs of compare.py's runs (Open MPI
// 16-23). The all_gather keeps rounds of one chunk: unloaded, its 1 MiB took 402-477 us in two
// rounds and 527-610 in one in one session, 683-697 against 729-737 in another (the writes of a
// round no longer overlap the reads of the one before). Where /dev/shm cannot hold the deep slots,
// rank 0 makes them one chunk deep.
constexpr uint32_t kMaxSlotDepth = 4;
constexpr size_t kDeepSlotsBytes = size_t(32) << 20;
uint32_t slot_depth(int world, int cores, size_t chunk_bytes);

struct Layout {
  int world = 0;
  size_t chunk_bytes = 0;  // the unit of the pipeline (CHORUS_SHM_CHUNK_BYTES, rounded)
  uint32_t depth = 1;      // chunks per slot (Note [Deep slots when ranks share cores])
  size_t slot_bytes = 0;   // chunk_bytes * depth
  size_t p2p_chunk = 0;
  size_t ctrl_stride = 0;
  size_t ctrl_offset = 0, slots_offset = 0, channels_offset = 0, channel_stride = 0;
  size_t stage_offset = 0, stage_bytes = 0;  // Note [A staging area for large broadcasts]
  size_t total = 0;
  Layout() = default;
  Layout(int world, size_t chunk_bytes, uint32_t depth, size_t stage_bytes);
};

class Segment {
 public:
  // Collective over the group: creates or maps the segment (Note [Segment lifetime]) and waits
  // until every rank has mapped it. Throws TimeoutError naming the ranks that never came. Rank 0's
  // chunk_bytes, slot depth, stage_bytes and single_copy hold for the group.
  Segment(Store& store, int rank, int world, size_t chunk_bytes, size_t stage_bytes, uint32_t single_copy,
          Clock::time_point deadline, const std::string& group_name);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const Layout& layout() const { return layout_; }
  uint8_t* base() { return base_; }  // where this rank maps the segment
  Header& header() { return *reinterpret_cast<Header*>(base_); }
  RankControl& ctrl(int r) {
    return *reinterpret_cast<RankControl*>(base_ + layout_.ctrl_offset + r * layout_.ctrl_stride);
  }
  uint64_t* counts(int r, uint64_t call) {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(&ctrl(r)) + sizeof(RankControl)) +
           (call & 1) * 2 * size_t(layout_.world);
  }
  uint8_t* slot(int r, uint32_t phase) {
    return base_ + layout_.slots_offset + (size_t(r) * 2 + (phase & 1)) * layout_.slot_bytes;
  }
  // Note [A staging area for large broadcasts]. reserve_stage() on rank 0 only, before it posts;
  // stage_ready() on any rank once rank 0 has posted since.
  void reserve_stage();
  bool stage_ready() { return header().stage_state.load(std::memory_order_acquire) == kStageReady; }
  uint8_t* stage() { return base_ + layout_.stage_offset; }
  // Ring of the ordered pair src -> dst: sender end, receiver end, then two chunks.
  uint8_t* channel(int src, int dst) {
    return base_ + layout_.channels_offset + (size_t(src) * layout_.world + dst) * layout_.channel_stride;
  }

 private:
  // After mapping: check the layout, announce this rank, wait for the others.
  void join(Store& store, int rank, int world, uint32_t single_copy, Clock::time_point deadline,
            const std::string& group_name, const std::string& name);

  Layout layout_;
  uint8_t* base_ = nullptr;
  size_t mapped_ = 0;
  int fd_ = -1;  // rank 0's, for reserve_stage()
};

}  // namespace chorus::shm
