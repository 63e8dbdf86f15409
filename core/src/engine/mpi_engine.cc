// The MPI engine: the MPI library's own algorithms (Open MPI's tuned collectives, shared memory
// and TCP transports) on a communicator of the group's ranks.
//
// Every call is nonblocking and polled with MPI_Test, so that it can give up at its deadline or
// when the group is aborted (interrupt()). What MPI cannot do, and chorus therefore cannot:
//   - cancel a collective it gave up on: the request is left pending, and if the missing rank
//     arrives later, MPI still writes into that call's buffers (EngineBackend keeps its own
//     buffers alive; the caller's buffers of a failed call should outlive the communicator);
//   - survive a dead rank: mpirun ends the whole job when one of its processes dies (Open MPI
//     has no fault tolerance), usually before chorus's heartbeats name the rank.
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings need their own library
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/core/store.h"
#include "engine/engine.h"
#include "reduce/reduce_kernels.h"

namespace chorus {
namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return detail::concat("MPI error ", code);
  return std::string(text, size_t(len));
}

// MPI with every thread allowed to call it: chorus calls it from the async executor and from
// point-to-point threads as well as from the caller's.
void ensure_mpi() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw Error("backend 'mpi': MPI was finalized already; create communicators before MPI_Finalize");
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS)
      throw Error(detail::concat("backend 'mpi': MPI_Init_thread failed: ", mpi_error(rc)));
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error(detail::concat(
        "backend 'mpi' needs MPI_THREAD_MULTIPLE, but MPI provides thread level ", provided,
        initialized ? " (the program initialized MPI: use MPI_Init_thread with MPI_THREAD_MULTIPLE)" : ""));
}

// One MPI user function per (dtype, op), each calling chorus's kernels, so that every backend
// reduces with the same arithmetic (bools, wrapping integers, fixed order).
constexpr size_t kDtypes = size_t(DataType::Bool) + 1, kOps = size_t(ReduceOp::BitwiseXor) + 1;
using UserFn = void (*)(void*, void*, int*, MPI_Datatype*);

template <size_t I>
void apply(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {in, inout};
  reduce::reduce(DataType(I / kOps), ReduceOp(I % kOps), srcs, 2, inout, size_t(*len));
}
template <size_t... I>
constexpr std::array<UserFn, sizeof...(I)> user_functions(std::index_sequence<I...>) {
  return {&apply<I>...};
}

MPI_Op op_for(const Reduction& r) {
  static constexpr auto fns = user_functions(std::make_index_sequence<kDtypes * kOps>());
  static std::mutex mu;
  static std::array<MPI_Op, kDtypes * kOps> ops;
  static std::array<bool, kDtypes * kOps> made{};
  const size_t i = size_t(r.dtype) * kOps + size_t(r.op);
  std::lock_guard<std::mutex> lock(mu);
  if (!made[i]) {
    MPI_Op_create(fns[i], /*commute=*/1, &ops[i]);
    made[i] = true;
  }
  return ops[i];
}

// Elements of this size as an MPI type the user functions receive whole.
MPI_Datatype element_type(size_t elem) {
  switch (elem) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

// MPI counts and displacements are ints: byte sizes that do not fit travel as blocks of a
// contiguous type, the smallest power of two that divides them all and brings them under 2^31.
class ByteBlocks {
 public:
  explicit ByteBlocks(const std::vector<size_t>& sizes) {
    size_t total = 0, bits = 0;
    for (size_t s : sizes) total += s, bits |= s;
    while (total / unit_ > size_t(INT_MAX)) {
      if ((bits & unit_) || unit_ >= (size_t(1) << 30))
        throw EngineFailure(detail::concat("mpi: ", total, " bytes cannot be expressed in MPI's int counts"));
      unit_ *= 2;
    }
    if (unit_ > 1) {
      MPI_Type_contiguous(int(unit_), MPI_BYTE, &type_);
      MPI_Type_commit(&type_);
    }
  }
  ~ByteBlocks() {
    if (unit_ > 1) MPI_Type_free(&type_);
  }
  ByteBlocks(const ByteBlocks&) = delete;
  MPI_Datatype type() const { return type_; }
  int count(size_t bytes) const { return int(bytes / unit_); }
  // Counts and displacements of consecutive blocks of these sizes.
  std::pair<std::vector<int>, std::vector<int>> layout(const std::vector<size_t>& sizes) const {
    std::vector<int> counts, displs;
    size_t at = 0;
    for (size_t s : sizes) {
      counts.push_back(count(s));
      displs.push_back(count(at));
      at += s;
    }
    return {counts, displs};
  }

 private:
  size_t unit_ = 1;
  MPI_Datatype type_ = MPI_BYTE;
};

constexpr size_t kMaxCount = size_t(1) << 30;  // elements per call of the chunked reductions
constexpr int kDataTag = 0, kAckTag = 1;

class MpiEngine : public Engine {
 public:
  MpiEngine(Store& store, int rank, int size, const std::string& group, Millis left) : rank_(rank), size_(size) {
    ensure_mpi();
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (size > world_size)
      throw InvalidArgument(detail::concat("group '", group, "': backend 'mpi' needs its ", size,
                                           " ranks started by one mpirun, but this process's MPI world has ",
                                           world_size,
                                           world_size == 1 ? " rank (was it started by mpirun?)" : " ranks"));
    // Which MPI rank each member is: the members make their own communicator.
    store.set(detail::concat("mpi/", rank), std::to_string(world_rank));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(detail::concat("mpi/", r));
    store.wait(keys, left);
    std::vector<int> members;
    for (int r = 0; r < size; ++r) {
      members.push_back(std::stoi(store.get(keys[size_t(r)])));
      for (int q = 0; q < r; ++q)
        if (members[size_t(q)] == members.back())
          throw InvalidArgument(detail::concat("group '", group, "': ranks ", q, " and ", r, " are both MPI rank ",
                                               members.back(), ": backend 'mpi' needs ranks started by one mpirun"));
    }
    MPI_Group world_group, members_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, size, members.data(), &members_group);
    // The tag tells apart groups that threads of the same processes create at the same time.
    const int tag = int(std::hash<std::string>()(group) % 32768);
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, members_group, tag, &comm_);
    MPI_Group_free(&members_group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS)
      throw Error(detail::concat("group '", group, "': MPI_Comm_create_group failed: ", mpi_error(rc)));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiEngine() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // requests given up on keep their own reference
  }

  std::string name() const override { return "mpi"; }

  void barrier(Millis left) override {
    const auto deadline = Clock::now() + left;
    finish("barrier", deadline, [&](MPI_Request* q) { return MPI_Ibarrier(comm_, q); });
  }

  void all_reduce(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    chunked_reduction("all_reduce", in, out, count, r, left, [&](const void* i, void* o, int n, MPI_Request* q) {
      return MPI_Iallreduce(i == o ? MPI_IN_PLACE : i, o, n, element_type(r.elem()), op_for(r), comm_, q);
    });
  }

  void reduce(const void* in, void* out, size_t count, const Reduction& r, int root, Millis left) override {
    chunked_reduction("reduce", in, out, count, r, left, [&](const void* i, void* o, int n, MPI_Request* q) {
      const void* send = rank_ == root && i == o ? MPI_IN_PLACE : i;
      return MPI_Ireduce(send, o, n, element_type(r.elem()), op_for(r), root, comm_, q);
    });
  }

  void reduce_scatter(const void* in, void* out, size_t count, const Reduction& r, Millis left) override {
    if (count * size_t(size_) > size_t(INT_MAX)) {  // too big for one call: reduce in chunks, keep a block
      std::vector<uint8_t> all(count * size_t(size_) * r.elem());
      all_reduce(in, all.data(), count * size_t(size_), r, left);
      std::memcpy(out, all.data() + size_t(rank_) * count * r.elem(), count * r.elem());
      return;
    }
    finish("reduce_scatter", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Ireduce_scatter_block(in, out, int(count), element_type(r.elem()), op_for(r), comm_, q);
    });
  }

  void broadcast(void* buf, size_t bytes, int root, Millis left) override {
    const auto deadline = Clock::now() + left;
    for (size_t at = 0; at < bytes; at += kMaxCount) {
      const int n = int(std::min(kMaxCount, bytes - at));
      finish("broadcast", deadline,
             [&](MPI_Request* q) { return MPI_Ibcast(static_cast<uint8_t*>(buf) + at, n, MPI_BYTE, root, comm_, q); });
    }
  }

  void all_gather(const void* in, void* out, size_t bytes, Millis left) override {
    const ByteBlocks b(std::vector<size_t>(size_t(size_), bytes));
    finish("all_gather", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Iallgather(in, b.count(bytes), b.type(), out, b.count(bytes), b.type(), comm_, q);
    });
  }

  void all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes, Millis left) override {
    const ByteBlocks b(bytes);
    const auto [counts, displs] = b.layout(bytes);
    finish("all_gather_v", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Iallgatherv(in, counts[size_t(rank_)], b.type(), out, counts.data(), displs.data(), b.type(), comm_,
                             q);
    });
  }

  void gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root, Millis left) override {
    const ByteBlocks b(bytes);
    const auto [counts, displs] = b.layout(bytes);
    finish("gather", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Igatherv(in, counts[size_t(rank_)], b.type(), out, counts.data(), displs.data(), b.type(), root, comm_,
                          q);
    });
  }

  void scatter(const void* in, void* out, size_t bytes, int root, Millis left) override {
    const ByteBlocks b(std::vector<size_t>(size_t(size_), bytes));
    finish("scatter", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Iscatter(in, b.count(bytes), b.type(), out, b.count(bytes), b.type(), root, comm_, q);
    });
  }

  void all_to_all_v(const void* in, const std::vector<size_t>& send_bytes, void* out,
                    const std::vector<size_t>& recv_bytes, Millis left) override {
    const ByteBlocks sb(send_bytes), rb(recv_bytes);
    const auto [scounts, sdispls] = sb.layout(send_bytes);
    const auto [rcounts, rdispls] = rb.layout(recv_bytes);
    finish("all_to_all_v", Clock::now() + left, [&](MPI_Request* q) {
      return MPI_Ialltoallv(in, scounts.data(), sdispls.data(), sb.type(), out, rcounts.data(), rdispls.data(),
                            rb.type(), comm_, q);
    });
  }

  void send(const void* buf, size_t bytes, int dst, bool ack, Millis left) override {
    const auto deadline = Clock::now() + left;
    const auto* p = static_cast<const uint8_t*>(buf);
    for (size_t at = 0; at == 0 || at < bytes; at += kMaxCount) {  // MPI keeps a pair's messages in order
      const int n = int(std::min(kMaxCount, bytes - at));
      finish(
          "send", deadline,
          [&](MPI_Request* q) { return MPI_Isend(p + at, n, MPI_BYTE, dst, ack ? kAckTag : kDataTag, comm_, q); },
          Kind::Send);
    }
  }

  void recv(void* buf, size_t bytes, int src, bool ack, Millis left) override {
    const auto deadline = Clock::now() + left;
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t at = 0; at == 0 || at < bytes; at += kMaxCount) {
      const int n = int(std::min(kMaxCount, bytes - at));
      finish(
          "recv", deadline,
          [&](MPI_Request* q) { return MPI_Irecv(p + at, n, MPI_BYTE, src, ack ? kAckTag : kDataTag, comm_, q); },
          Kind::Recv);
    }
  }

  int recv_any(void* buf, size_t bytes, Millis left) override {
    const auto deadline = Clock::now() + left;
    auto* p = static_cast<uint8_t*>(buf);
    MPI_Status status{};
    const int n = int(std::min(kMaxCount, bytes));
    finish(
        "recv", deadline, [&](MPI_Request* q) { return MPI_Irecv(p, n, MPI_BYTE, MPI_ANY_SOURCE, kDataTag, comm_, q); },
        Kind::Recv, &status);
    const int from = status.MPI_SOURCE;
    if (bytes > size_t(n)) recv(p + n, bytes - size_t(n), from, false, left_until(deadline));  // the rest, in order
    return from;
  }

  void interrupt() override { interrupted_.store(true, std::memory_order_release); }
  bool can_interrupt() const override { return true; }

 private:
  template <class Start>
  void chunked_reduction(const char* what, const void* in, void* out, size_t count, const Reduction& r, Millis left,
                         Start&& start) {
    const auto deadline = Clock::now() + left;
    const size_t es = r.elem();
    for (size_t at = 0; at < count; at += kMaxCount) {
      const int n = int(std::min(kMaxCount, count - at));
      const void* i = static_cast<const uint8_t*>(in) + at * es;
      void* o = out ? static_cast<uint8_t*>(out) + at * es : nullptr;
      finish(what, deadline, [&](MPI_Request* q) { return start(in == out ? o : i, o, n, q); });
    }
  }

  // Starts one nonblocking call and polls it until it completes, the deadline passes or the
  // group is aborted. Polling backs off from spinning to yielding to short sleeps, so that
  // waiting ranks leave the cores to the ones still working when ranks outnumber cores.
  enum class Kind { Collective, Send, Recv };

  // `status`, when given, receives the completed request's status (the source of an
  // MPI_ANY_SOURCE receive).
  template <class Start>
  void finish(const char* what, Clock::time_point deadline, Start&& start, Kind kind = Kind::Collective,
              MPI_Status* status = MPI_STATUS_IGNORE) {
    if (interrupted_.load(std::memory_order_acquire))
      throw EngineFailure(detail::concat("mpi ", what, ": the group is being aborted"));
    MPI_Request request = MPI_REQUEST_NULL;
    if (int rc = start(&request); rc != MPI_SUCCESS)
      throw EngineFailure(detail::concat("mpi ", what, ": ", mpi_error(rc)));
    for (uint64_t polls = 0;; ++polls) {
      int done = 0;
      if (int rc = MPI_Test(&request, &done, status); rc != MPI_SUCCESS)
        throw EngineFailure(detail::concat("mpi ", what, ": ", mpi_error(rc)));
      if (done) return;
      const bool aborted = interrupted_.load(std::memory_order_acquire);
      if (aborted || ((polls & 63) == 0 && Clock::now() >= deadline)) {
        give_up(request, kind);
        throw EngineFailure(
            detail::concat("mpi ", what, aborted ? ": the group is being aborted" : ": deadline passed"));
      }
      if (polls > 20000)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (polls > 2000)
        std::this_thread::yield();
    }
  }

  // A receive is cancelled and a send let go; a collective can be neither, and stays pending
  // (calls on a group come one at a time, so no lock is needed here).
  void give_up(MPI_Request& request, Kind kind) {
    if (kind == Kind::Collective) return given_up_.push_back(request);
    if (kind == Kind::Recv) MPI_Cancel(&request);
    MPI_Request_free(&request);
  }

  const int rank_, size_;
  std::vector<MPI_Request> given_up_;  // collectives MPI cannot cancel
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::atomic<bool> interrupted_{false};
};

}  // namespace

std::unique_ptr<Engine> make_mpi_engine(Store& store, int rank, int size, const std::string& group, Millis left) {
  return std::make_unique<MpiEngine>(store, rank, size, group, left);
}

}  // namespace chorus
