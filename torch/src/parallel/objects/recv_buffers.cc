#include "parallel/objects/recv_buffers.h"

#include <sys/mman.h>

#include <map>
#include <mutex>

#include "chorus/core/error.h"
#include "chorus/core/settings.h"

#include <c10/util/strides.h>

namespace chorus::detail {

namespace {

constexpr size_t kPooledFrom = size_t(1) << 20;  // smaller tensors come from the usual allocator
constexpr size_t kGranule = size_t(2) << 20;     // blocks are whole (huge) pages

class BlockCache {
 public:
  static BlockCache& get() {
    static auto* cache = new BlockCache();  // never destroyed: tensors may outlive static destruction
    return *cache;
  }

  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(concat("chorus: cannot map ", bytes, " bytes for a received tensor"));
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  }

  void give_back(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= settings().recv_cache_bytes) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    munmap(p, bytes);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

struct Block {
  void* p;
  size_t bytes;
};

void release(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  BlockCache::get().give_back(b->p, b->bytes);
  delete b;
}

}  // namespace

at::Tensor receive_buffer(at::IntArrayRef sizes, at::ScalarType type) {
  const size_t bytes = size_t(c10::multiply_integers(sizes)) * c10::elementSize(type);
  if (bytes < kPooledFrom || settings().recv_cache_bytes == 0) return at::empty(sizes, at::TensorOptions().dtype(type));
  const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
  auto* block = new Block{BlockCache::get().take(rounded), rounded};
  c10::DataPtr data(block->p, block, &release, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(type)).set_(storage, 0, sizes, c10::contiguous_strides(sizes));
}

}  // namespace chorus::detail
