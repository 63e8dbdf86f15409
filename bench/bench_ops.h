// One benchmarked operation: how to size its buffers, run it, fill and verify its data, and
// turn a time into nccl-tests' algbw/busbw.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "chorus/core/communicator.h"

namespace chorus::bench {

// One buffer of a benchmarked call: ordinary memory on 64-byte boundaries (as torch's CPU
// allocator gives tensors), or the group's symmetric memory (--symmetric; Note [Symmetric memory]).
class Bytes {
 public:
  explicit Bytes(Communicator* symmetric) : symmetric_(symmetric) {}
  uint8_t* data() const { return static_cast<uint8_t*>(mem_.data()); }
  size_t size() const { return mem_.size(); }
  // n zero bytes. With symmetric memory this is collective: every rank resizes alike.
  void resize(size_t n);

 private:
  Communicator* symmetric_;
  SymmetricMemory mem_;
};

struct Buffers {
  explicit Buffers(Communicator* symmetric) : in(symmetric), out(symmetric) {}
  Bytes in, out;
};

struct BenchOp {
  std::string name;
  // Elements per rank for a message of `bytes` (nccl-tests' per-rank size for this op).
  virtual size_t count_for(size_t bytes, DataType dt, int world) const;
  virtual void allocate(Buffers& b, size_t count, DataType dt, int world) const = 0;
  // Writes iteration-dependent input, so no run sees the previous run's data.
  virtual void fill(Buffers& b, size_t count, DataType dt, int rank, int world, int iter) const = 0;
  virtual void run(Communicator& comm, Buffers& b, size_t count, DataType dt) const = 0;
  // Empty when the output is right for `iter`, else what is wrong.
  virtual std::string verify(const Buffers& b, size_t count, DataType dt, int rank, int world, int iter) const = 0;
  // Bytes moved per rank as nccl-tests counts them, and its bus factor.
  virtual double alg_bytes(size_t count, DataType dt, int world) const;
  virtual double bus_factor(int world) const = 0;
  virtual ~BenchOp() = default;
};

// Every op chorus-bench knows, in table order.
std::vector<std::unique_ptr<BenchOp>> all_ops();

}  // namespace chorus::bench
