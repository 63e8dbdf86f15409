// Memory that every rank of a group allocates together (Communicator::alloc_symmetric).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace chorus {

// Note [Symmetric memory]: one buffer per rank, of the same size, allocated together by the whole
// group (Communicator::alloc_symmetric). On the shared-memory backend every rank maps every
// rank's buffer, so a collective whose buffers lie in symmetric memory on every rank moves data
// straight between the ranks' buffers instead of staging it through the group's slots: a large
// all_reduce then reads and writes each byte once, like a memcpy. On other backends it is
// ordinary memory and collectives on it run as on any other buffer. Zero-filled.
//
// A copyable handle: the memory lives until the last copy is gone (or longer, while peers still
// map it; never less). Destroying it does not communicate.
class SymmetricMemory {
 public:
  SymmetricMemory() = default;
  SymmetricMemory(std::shared_ptr<void> owner, void* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<void> owner_;  // unmaps (and forgets) the buffer when the last copy goes
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace chorus
