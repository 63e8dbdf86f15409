// The benchmarked operations. Inputs are small integers, (i + rank + iter) % 4 and variants,
// exact in every dtype, so sums over the ranks are exact and checkable element by element.
#include "bench_ops.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>

#include "chorus/core/error.h"

namespace chorus::bench {

void Bytes::resize(size_t n) {
  if (symmetric_) {
    mem_ = symmetric_->alloc_symmetric(n);
    return;
  }
  constexpr std::align_val_t kAlign{64};
  std::shared_ptr<void> owner(::operator new(std::max<size_t>(n, 1), kAlign),
                              [kAlign](void* p) { ::operator delete(p, kAlign); });
  std::memset(owner.get(), 0, n);
  mem_ = SymmetricMemory(owner, owner.get(), n);
}

namespace {

// Element i of a dtype buffer set to the small integer k.
void put(DataType dt, void* buf, size_t i, int k) {
  auto* b = static_cast<uint8_t*>(buf);
  switch (dt) {
    case DataType::Float32: {
      float x = float(k);
      std::memcpy(b + 4 * i, &x, 4);
      return;
    }
    case DataType::Float64: {
      double x = k;
      std::memcpy(b + 8 * i, &x, 8);
      return;
    }
    case DataType::Float16: {
      _Float16 x = _Float16(float(k));
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::BFloat16: {
      uint16_t x = uint16_t(std::bit_cast<uint32_t>(float(k)) >> 16);
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::Int8:
    case DataType::UInt8: b[i] = uint8_t(k); return;
    case DataType::Bool: b[i] = k != 0; return;
    case DataType::Int16: {
      int16_t x = int16_t(k);
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::Int32: {
      int32_t x = k;
      std::memcpy(b + 4 * i, &x, 4);
      return;
    }
    case DataType::Int64: {
      int64_t x = k;
      std::memcpy(b + 8 * i, &x, 8);
      return;
    }
  }
}

bool equals(DataType dt, const void* buf, size_t i, int k) {
  uint8_t want[8];
  put(dt, want, 0, k);
  const size_t es = element_size(dt);
  return std::memcmp(static_cast<const uint8_t*>(buf) + i * es, want, es) == 0;
}

int v(int who, size_t i, int iter) { return int((i + size_t(who) + size_t(iter)) % 4); }

// Sum over ranks of v(r, i, iter) (bool: any non-zero).
int summed(DataType dt, size_t i, int iter, int world) {
  int s = 0;
  for (int r = 0; r < world; ++r) s += v(r, i, iter);
  return dt == DataType::Bool ? (s != 0) : s;
}

std::string wrong(size_t i, const char* what) { return detail::concat("element ", i, " of ", what, " is wrong"); }

// Element i (from offset) gets v(who, i, iter). The values repeat every 4 elements, so the first
// 4 are written one by one and the rest copied from them in doubling runs up to 64 KiB, then 64
// KiB at a time (copies that large go through the cache, as a kernel's stores would; memcpy
// streams larger ones past it): a fill at memcpy's speed, as mpi_tail.c's is (Note [The same fill
// on both sides], chorus_bench.cc).
void fill_with(DataType dt, Bytes& buf, size_t count, int who, int iter, size_t offset = 0) {
  constexpr size_t kRun = 64 * 1024;
  for (size_t i = 0; i < std::min<size_t>(count, 4); ++i) put(dt, buf.data(), offset + i, v(who, i, iter));
  uint8_t* base = buf.data() + offset * element_size(dt);
  const size_t bytes = count * element_size(dt);
  // A run of 64 KiB repeats the pattern too: 4 elements of up to 8 bytes divide it.
  for (size_t done = 4 * element_size(dt); done < bytes; done += std::min(done, kRun))
    std::memcpy(base + done, base, std::min({done, kRun, bytes - done}));
}

struct AllReduce : BenchOp {
  AllReduce() { name = "all_reduce"; }
  void allocate(Buffers& b, size_t n, DataType dt, int) const override {
    b.in.resize(n * element_size(dt));
    b.out.resize(n * element_size(dt));
  }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int, int iter) const override {
    fill_with(dt, b.in, n, rank, iter);
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.all_reduce(b.in.data(), b.out.data(), n, dt, ReduceOp::Sum);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int, int world, int iter) const override {
    for (size_t i = 0; i < n; ++i)
      if (!equals(dt, b.out.data(), i, summed(dt, i, iter, world))) return wrong(i, "the sum");
    return {};
  }
  double bus_factor(int w) const override { return 2.0 * (w - 1) / w; }
};

struct Reduce : AllReduce {
  Reduce() { name = "reduce"; }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.reduce(b.in.data(), b.out.data(), n, dt, ReduceOp::Sum, 0);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    return rank == 0 ? AllReduce::verify(b, n, dt, rank, world, iter) : std::string();
  }
  double bus_factor(int) const override { return 1.0; }
};

struct Broadcast : BenchOp {
  Broadcast() { name = "broadcast"; }
  void allocate(Buffers& b, size_t n, DataType dt, int) const override { b.in.resize(n * element_size(dt)); }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int, int iter) const override {
    if (rank == 0)
      fill_with(dt, b.in, n, 0, iter);
    else
      std::memset(b.in.data(), 0xff, b.in.size());
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override { c.broadcast(b.in.data(), n, dt, 0); }
  std::string verify(const Buffers& b, size_t n, DataType dt, int, int, int iter) const override {
    for (size_t i = 0; i < n; ++i)
      if (!equals(dt, b.in.data(), i, v(0, i, iter))) return wrong(i, "the broadcast");
    return {};
  }
  double bus_factor(int) const override { return 1.0; }
};

struct AllGather : BenchOp {
  AllGather() { name = "all_gather"; }
  void allocate(Buffers& b, size_t n, DataType dt, int w) const override {
    b.in.resize(n * element_size(dt));
    b.out.resize(n * size_t(w) * element_size(dt));
  }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int, int iter) const override {
    fill_with(dt, b.in, n, rank, iter);
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.all_gather(b.in.data(), b.out.data(), n, dt);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int, int world, int iter) const override {
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < n; ++i)
        if (!equals(dt, b.out.data(), size_t(r) * n + i, v(r, i, iter))) return wrong(size_t(r) * n + i, "the gather");
    return {};
  }
  double alg_bytes(size_t n, DataType dt, int w) const override { return double(n * element_size(dt)) * w; }
  double bus_factor(int w) const override { return double(w - 1) / w; }
};

struct Gather : AllGather {
  Gather() { name = "gather"; }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.gather(b.in.data(), b.out.data(), n, dt, 0);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    return rank == 0 ? AllGather::verify(b, n, dt, rank, world, iter) : std::string();
  }
};

struct Scatter : BenchOp {
  Scatter() { name = "scatter"; }
  void allocate(Buffers& b, size_t n, DataType dt, int w) const override {
    b.in.resize(n * size_t(w) * element_size(dt));
    b.out.resize(n * element_size(dt));
  }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    if (rank == 0)
      for (int q = 0; q < world; ++q) fill_with(dt, b.in, n, q, iter, size_t(q) * n);
    std::memset(b.out.data(), 0xff, b.out.size());
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.scatter(b.in.data(), b.out.data(), n, dt, 0);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int, int iter) const override {
    for (size_t i = 0; i < n; ++i)
      if (!equals(dt, b.out.data(), i, v(rank, i, iter))) return wrong(i, "the scattered block");
    return {};
  }
  double alg_bytes(size_t n, DataType dt, int w) const override { return double(n * element_size(dt)) * w; }
  double bus_factor(int w) const override { return double(w - 1) / w; }
};

struct ReduceScatter : BenchOp {
  ReduceScatter() { name = "reduce_scatter"; }
  void allocate(Buffers& b, size_t n, DataType dt, int w) const override {
    b.in.resize(n * size_t(w) * element_size(dt));
    b.out.resize(n * element_size(dt));
  }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    fill_with(dt, b.in, n * size_t(world), rank, iter);
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.reduce_scatter(b.in.data(), b.out.data(), n, dt, ReduceOp::Sum);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    for (size_t i = 0; i < n; ++i)
      if (!equals(dt, b.out.data(), i, summed(dt, size_t(rank) * n + i, iter, world)))
        return wrong(i, "the reduced block");
    return {};
  }
  double alg_bytes(size_t n, DataType dt, int w) const override { return double(n * element_size(dt)) * w; }
  double bus_factor(int w) const override { return double(w - 1) / w; }
};

struct AllToAll : BenchOp {
  AllToAll() { name = "all_to_all"; }
  size_t count_for(size_t bytes, DataType dt, int w) const override {
    return std::max<size_t>(1, bytes / element_size(dt) / size_t(w));
  }
  void allocate(Buffers& b, size_t n, DataType dt, int w) const override {
    b.in.resize(n * size_t(w) * element_size(dt));
    b.out.resize(n * size_t(w) * element_size(dt));
  }
  void fill(Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    for (int q = 0; q < world; ++q) fill_with(dt, b.in, n, rank * world + q, iter, size_t(q) * n);
  }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    c.all_to_all(b.in.data(), b.out.data(), n, dt);
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    for (int p = 0; p < world; ++p)
      for (size_t i = 0; i < n; ++i)
        if (!equals(dt, b.out.data(), size_t(p) * n + i, v(p * world + rank, i, iter))) return wrong(i, "the exchange");
    return {};
  }
  double alg_bytes(size_t n, DataType dt, int w) const override { return double(n * element_size(dt)) * w; }
  double bus_factor(int w) const override { return double(w - 1) / w; }
};

// Rank 0 sends to rank 1, which sends it back: the time is the round trip.
struct SendRecv : Broadcast {
  SendRecv() { name = "send_recv"; }
  void run(Communicator& c, Buffers& b, size_t n, DataType dt) const override {
    if (c.rank() == 0) {
      c.send(b.in.data(), n, dt, 1);
      c.recv(b.in.data(), n, dt, 1);
    } else if (c.rank() == 1) {
      c.recv(b.in.data(), n, dt, 0);
      c.send(b.in.data(), n, dt, 0);
    }
  }
  std::string verify(const Buffers& b, size_t n, DataType dt, int rank, int world, int iter) const override {
    return rank <= 1 ? Broadcast::verify(b, n, dt, rank, world, iter) : std::string();
  }
  double alg_bytes(size_t n, DataType dt, int) const override { return 2.0 * double(n * element_size(dt)); }
};

}  // namespace

size_t BenchOp::count_for(size_t bytes, DataType dt, int) const {
  return std::max<size_t>(1, bytes / element_size(dt));
}
double BenchOp::alg_bytes(size_t n, DataType dt, int) const { return double(n * element_size(dt)); }

std::vector<std::unique_ptr<BenchOp>> all_ops() {
  std::vector<std::unique_ptr<BenchOp>> ops;
  ops.push_back(std::make_unique<AllReduce>());
  ops.push_back(std::make_unique<Broadcast>());
  ops.push_back(std::make_unique<Reduce>());
  ops.push_back(std::make_unique<AllGather>());
  ops.push_back(std::make_unique<Gather>());
  ops.push_back(std::make_unique<Scatter>());
  ops.push_back(std::make_unique<ReduceScatter>());
  ops.push_back(std::make_unique<AllToAll>());
  ops.push_back(std::make_unique<SendRecv>());
  return ops;
}

}  // namespace chorus::bench
