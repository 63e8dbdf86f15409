#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/store.h"
#include "shm/waiter.h"

namespace chorus::shm {

namespace {
#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;  // Linux 5.14's value, where the C library's headers predate it
#endif

constexpr uint64_t kMagic = 0x63686f7275733031ull;  // "chorus01"

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

[[noreturn]] void fail(const std::string& what, const std::string& name) { shm_fail("shared memory", what, name); }

}  // namespace

void shm_fail(const std::string& who, const std::string& what, const std::string& name) {
  throw Error(detail::concat(who, ": ", what, " '", name, "': ", std::strerror(errno)));
}

int create_shm_object(const std::string& who, const std::string& name, size_t bytes, const std::string& hint,
                      size_t unbacked) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) shm_fail(who, "cannot create", name);
  int rc = posix_fallocate(fd, 0, off_t(bytes));
  if (rc == 0 && unbacked != 0 && ftruncate(fd, off_t(bytes + unbacked)) != 0) rc = errno;
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    errno = rc;
    shm_fail(who, detail::concat("cannot allocate ", bytes, " bytes (is /dev/shm large enough?", hint, ") for"), name);
  }
  return fd;
}

std::string unique_shm_name() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/chorus-%d-%08x%08x", int(getpid()), rd(), rd());
  return buf;
}

uint32_t slot_depth(int world, int cores, size_t chunk_bytes) {
  if (world <= cores) return 1;
  const size_t fit = kDeepSlotsBytes / (2 * size_t(world) * std::max<size_t>(chunk_bytes, 1));
  return uint32_t(std::clamp<size_t>(fit, 1, kMaxSlotDepth));
}

Layout::Layout(int w, size_t chunk, uint32_t d, size_t stage) : world(w), depth(std::max<uint32_t>(d, 1)) {
  chunk_bytes = round_up(std::max<size_t>(chunk, kLine * size_t(w)), kLine);
  slot_bytes = chunk_bytes * depth;
  // Rings are per ordered pair, so keep their total bounded for large groups.
  size_t pairs = size_t(w) * size_t(w);
  p2p_chunk =
      round_up(std::clamp<size_t>(std::min<size_t>(chunk_bytes, (32u << 20) / (2 * pairs)), 4096, 1u << 20), kLine);
  ctrl_stride = round_up(sizeof(RankControl) + 2 * 2 * size_t(w) * sizeof(uint64_t), kLine);
  ctrl_offset = round_up(sizeof(Header), kLine);
  slots_offset = round_up(ctrl_offset + ctrl_stride * size_t(w), 4096);
  channels_offset = round_up(slots_offset + size_t(w) * 2 * slot_bytes, 4096);
  channel_stride = 2 * sizeof(ChannelEnd) + 2 * (sizeof(ChunkHeader) + p2p_chunk);
  stage_offset = round_up(channels_offset + pairs * channel_stride, 4096);
  stage_bytes = round_up(stage, 4096);
  total = stage_offset + stage_bytes;
}

Segment::Segment(Store& store, int rank, int world, size_t chunk_bytes, size_t stage_bytes, uint32_t single_copy,
                 Clock::time_point deadline, const std::string& group_name)
    : layout_(world, chunk_bytes, 1, stage_bytes) {
  std::string name;
  int fd = -1;
  if (rank == 0) {
    // Note [Deep slots when ranks share cores]; one chunk deep where /dev/shm has no room for more.
    layout_ = Layout(world, chunk_bytes, slot_depth(world, job_cores(), chunk_bytes), stage_bytes);
    for (;;) {
      name = unique_shm_name();
      try {
        // The staging area is backed only when a broadcast needs it (reserve_stage()).
        fd = create_shm_object("shared memory", name, layout_.stage_offset,
                               " a smaller CHORUS_SHM_CHUNK_BYTES needs less", layout_.stage_bytes);
        break;
      } catch (const Error&) {
        if (layout_.depth == 1) throw;
        layout_ = Layout(world, chunk_bytes, 1, stage_bytes);
      }
    }
  } else {
    name = store.get("shm_name");
    fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot open (did rank 0 of group '" + group_name + "' exit?)", name);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    fail("cannot stat", name);
  }
  void* p = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (rank == 0 && p != MAP_FAILED && layout_.stage_bytes != 0)
    fd_ = fd;  // reserve_stage() backs the staging area later; the name is gone by then
  else
    close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    fail("cannot map", name);
  }
  base_ = static_cast<uint8_t*>(p);
  mapped_ = size_t(st.st_size);
  try {
    join(store, rank, world, single_copy, deadline, group_name, name);
  } catch (...) {
    munmap(base_, mapped_);  // the destructor does not run for a constructor that throws
    if (fd_ >= 0) close(fd_);
    throw;
  }
  // Note [Slots mapped up front]: a process maps a page of the segment on its first touch, a minor
  // fault, and a call writes the slot of its parity, so the first two calls of a size meet pages
  // not mapped yet. Rank 0's way choice counts a way's calls from the second (Note [Streaming into
  // the slots]), and so judged normal stores on their faults: on the Xeon VM (model 167), W=4, a 1
  // MiB broadcast's second call took 480-510 us with normal stores into a slot of 2 MiB never
  // touched, 52-65 once mapped; streaming stores, timed on warm slots, took 94-98, and were kept
  // for good. So every rank maps the whole ring of slots when it joins (MADV_POPULATE_WRITE, which
  // writes nothing; on kernels before 5.14 the first calls pay as before).
  madvise(base_ + layout_.slots_offset, layout_.channels_offset - layout_.slots_offset, kPopulateWrite);
}

void Segment::join(Store& store, int rank, int world, uint32_t single_copy, Clock::time_point deadline,
                   const std::string& group_name, const std::string& name) {
  if (rank == 0) {
    Header& h = header();
    h.world = uint32_t(world);
    h.slot_bytes = layout_.slot_bytes;
    h.slot_depth = layout_.depth;
    h.p2p_chunk = layout_.p2p_chunk;
    h.cores = uint32_t(job_cores());
    h.single_copy = single_copy;
    h.stage_bytes = layout_.stage_bytes;
    h.stage_state.store(layout_.stage_bytes ? kStageUntried : kStageUnavailable);
    h.magic = kMagic;
    store.set("shm_name", name);
  } else {
    // The group runs on rank 0's slots, whatever this rank's settings say.
    if (header().magic == kMagic && header().world == uint32_t(world) && header().slot_depth >= 1)
      layout_ = Layout(world, header().slot_bytes / header().slot_depth, header().slot_depth, header().stage_bytes);
    if (header().magic != kMagic || header().world != uint32_t(world) || layout_.total != mapped_) {
      const std::string why =
          detail::concat("group '", group_name, "': rank 0 made the group for ", header().world, " ranks but rank ",
                         rank, " was told ", world, ": every rank must pass the same world size");
      store.set("shm_error", why);  // so the ranks already waiting fail now, not at the deadline
      shm_unlink(name.c_str());
      throw InvalidArgument(why);
    }
  }
  ctrl(rank).pid.store(getpid());
  ctrl(rank).mapped_at.store(reinterpret_cast<uint64_t>(base_));
  std::random_device random;
  ctrl(rank).probe_word.store(uint64_t(random()) << 32 | random());
  ctrl(rank).fences.store(asymmetric_fences() ? 1 : 0);
  ctrl(rank).state.store(kActive);
  if (header().attached.fetch_add(1) + 1 == uint32_t(world)) shm_unlink(name.c_str());

  // Wait for everyone to map it (Note [Segment lifetime]).
  auto next_store_check = Clock::now();
  while (header().attached.load() < uint32_t(world)) {
    if (Clock::now() > next_store_check) {
      next_store_check = Clock::now() + std::chrono::milliseconds(50);
      if (store.check({"shm_error"})) {
        shm_unlink(name.c_str());
        throw InvalidArgument(store.get("shm_error"));
      }
    }
    if (Clock::now() > deadline) {
      shm_unlink(name.c_str());
      std::vector<int> missing;
      std::string list;
      for (int r = 0; r < world; ++r)
        if (ctrl(r).state.load() == kAbsent) {
          missing.push_back(r);
          list += (list.empty() ? "" : ", ") + std::to_string(r);
        }
      throw TimeoutError(
          detail::concat("group '", group_name, "': ranks ", list, " never joined the shared-memory rendezvous"),
          missing, "init");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Segment::~Segment() {
  if (base_) munmap(base_, mapped_);
  if (fd_ >= 0) close(fd_);
}

void Segment::reserve_stage() {
  Header& h = header();
  if (h.stage_state.load(std::memory_order_relaxed) != kStageUntried) return;
  // Where /dev/shm has no room the group goes on through its slots, as it would with no staging.
  const bool ok = fd_ >= 0 && posix_fallocate(fd_, off_t(layout_.stage_offset), off_t(layout_.stage_bytes)) == 0;
  h.stage_state.store(ok ? kStageReady : kStageUnavailable, std::memory_order_release);
}

}  // namespace chorus::shm
