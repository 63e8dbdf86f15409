#include "shm/symmetric.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "chorus/core/error.h"
#include "shm/shm_group.h"

namespace chorus::shm {

SymmetricRegion::~SymmetricRegion() {
  for (uint8_t* base : bases)
    if (base) munmap(base, bytes);
}

void SymmetricRegistry::add(std::shared_ptr<SymmetricRegion> region) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.push_back(std::move(region));
}

void SymmetricRegistry::remove(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(regions_, [&](const auto& r) { return r->id == id; });
}

std::shared_ptr<SymmetricRegion> SymmetricRegistry::find(int rank, const void* p, size_t n, uint64_t* offset) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : regions_) {
    const auto base = reinterpret_cast<uintptr_t>(r->bases[size_t(rank)]);
    if (at >= base && at - base <= r->bytes && n <= r->bytes - (at - base)) {
      *offset = at - base;
      return r;
    }
  }
  return nullptr;
}

bool DirectBuffers::exchange(ShmGroup& g, const void* in, const void* out, size_t bytes_in, size_t bytes_out,
                             std::initializer_list<Buffer> needed) {
  const int world = g.world(), me = g.rank();
  SymmetricRef mine[2];
  region_[kIn] = g.symmetric()->find(me, in, bytes_in, &mine[kIn].offset);
  region_[kOut] = g.symmetric()->find(me, out, bytes_out, &mine[kOut].offset);
  for (Buffer b : {kIn, kOut}) mine[b].id = region_[b] ? region_[b]->id : 0;
  static_assert(sizeof(mine) <= kInlineBytes);
  std::memcpy(g.my_inline(), mine, sizeof(mine));
  g.sync();
  refs_.resize(2 * size_t(world));
  for (int p = 0; p < world; ++p) std::memcpy(&refs_[2 * size_t(p)], g.inline_of(p), sizeof(mine));
  // The same ids everywhere, and this rank holds the allocations: it maps every rank's buffer.
  for (Buffer b : needed)
    for (int p = 0; p < world; ++p)
      if (ref(p, b).id == 0 || ref(p, b).id != mine[b].id) return false;
  return true;
}

namespace {

constexpr size_t kNameBytes = 64;

[[noreturn]] void fail(const std::string& what, const std::string& name) { shm_fail("alloc_symmetric", what, name); }

// A rank's own buffer is populated now (its memory exists from here on, and the first collective
// takes no faults on it). A peer's is mapped as it is touched: a rank's resident set then counts
// only the parts of its peers' buffers it reads or writes (a direct all_reduce touches 1/W of
// each), not every peer's whole buffer again, and the pages exist already, so a fault costs no
// zeroing.
uint8_t* map_object(int fd, size_t bytes, const std::string& name, bool own) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (own ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    fail(detail::concat("cannot map ", bytes, " bytes of"), name);
  }
  close(fd);
  return static_cast<uint8_t*>(p);
}

// Unlinks this rank's name when the call ends, however it ends.
struct Unlink {
  std::string name;
  ~Unlink() {
    if (!name.empty()) shm_unlink(name.c_str());
  }
};

// Frees this rank's view of a region when the user's last handle goes.
struct Owner {
  std::shared_ptr<SymmetricRegion> region;
  std::weak_ptr<SymmetricRegistry> registry;
  ~Owner() {
    if (auto r = registry.lock(); r && region) r->remove(region->id);
  }
};

}  // namespace

SymmetricMemory alloc_symmetric(ShmGroup& g, const Call& c) {
  const int world = g.world(), me = g.rank();
  g.start(c);
  const size_t bytes = size_t(c.count);
  auto region = std::make_shared<SymmetricRegion>();
  region->id = g.next_symmetric_id();
  region->bytes = bytes;
  region->bases.assign(size_t(world), nullptr);
  if (bytes == 0) {
    g.sync();
    return {};
  }

  Unlink mine{unique_shm_name()};
  int fd = create_shm_object("alloc_symmetric", mine.name, bytes);
  region->bases[size_t(me)] = map_object(fd, bytes, mine.name, true);
  std::memset(g.write_slot(), 0, kNameBytes);
  std::memcpy(g.write_slot(), mine.name.data(), std::min(mine.name.size(), kNameBytes - 1));
  g.sync();  // every rank's buffer exists (and the call is checked)

  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    const auto* text = reinterpret_cast<const char*>(g.read_slot(p));
    const std::string name(text, strnlen(text, kNameBytes - 1));
    fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) fail(detail::concat("cannot open rank ", p, "'s buffer"), name);
    struct stat st {};
    if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes) {
      close(fd);
      errno = EINVAL;
      fail(detail::concat("rank ", p, "'s buffer is not ", bytes, " bytes"), name);
    }
    region->bases[size_t(p)] = map_object(fd, bytes, name, false);
  }
  g.sync();  // everyone maps everything: the names can go (mine when this returns)

  g.symmetric()->add(region);
  void* data = region->bases[size_t(me)];
  auto owner = std::make_shared<Owner>();
  owner->region = region;
  owner->registry = g.symmetric();
  return SymmetricMemory(owner, data, bytes);
}

}  // namespace chorus::shm
