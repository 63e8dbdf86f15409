// Every collective, swept over world size x element count x dtype x op x in-place, in real
// processes; once with a tiny slot so every algorithm runs many rounds, once with the default
// slot (inline, one-shot and pipelined paths), once with three ranks pinned to one core, and
// with large messages stored into the slots each way. Each rank checks its own result against a
// reference computed here.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "sweep.h"

namespace chorus::test {
namespace {

CommunicatorOptions options_for(const SweepConfig& config) {
  CommunicatorOptions options;
  options.backend = config.backend;
  options.shm.chunk_bytes = config.chunk_bytes;
  options.shm.stream_slots = config.stream_slots;
  options.cross.algorithm = config.cross_algorithm;
  options.timeout = std::chrono::seconds(120);
  return options;
}

// Keeps this process on the first CPU it may use (Note [Waiting with more ranks than cores]: a
// wait on a rank that last ran on the waiter's CPU does not spin).
void pin_to_first_cpu() {
  cpu_set_t set;
  RANK_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &set)) ++cpu;
  bind_to_cpu(cpu);
  RANK_CHECK(sched_getcpu() == cpu);
}

class Sweep : public ::testing::TestWithParam<SweepConfig> {};

TEST_P(Sweep, EveryCollectiveDtypeOpAndCount) {
  const SweepConfig config = GetParam();
  const CommunicatorOptions options = options_for(config);
  auto results = run_group(
      config.world,
      [&](Communicator& comm) {
        if (config.one_core) pin_to_first_cpu();
        sweep(comm, config);
      },
      options, std::chrono::seconds(800));
  expect_all_ok(results);
  EXPECT_TRUE(leftover_segments(results).empty());
}

// Under AddressSanitizer or ThreadSanitizer (scripts/test.sh's second run, scripts/tsan.sh) every
// byte checked costs ~10x: the sweep's largest counts shrink 4x there, which still takes them past
// one-shot and through several pipelined rounds. The plain build sweeps the full sizes.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr unsigned kLargeShift = 2;
#else
constexpr unsigned kLargeShift = 0;
#endif

std::vector<SweepConfig> configs() {
  std::vector<SweepConfig> out;
  for (const std::string& backend : test_backends()) {
    if (backend == "shm") {
      // One type of each width (1, 2, 4 and 8 bytes).
      const std::vector<DataType> widths = {DataType::Int8, DataType::BFloat16, DataType::Float32, DataType::Int64};
      for (int w : {1, 2, 3, 4, 7}) {
        out.push_back({"shm", w, 512, {0, 1, 17, 4099}});  // many rounds through a tiny slot
        // inline, one-shot, pipelined. Four and seven ranks take one type of each width at the
        // large count: on two cores three ranks already take every type there through the paths
        // of more ranks than cores (the ring, the deep slots).
        out.push_back({"shm", w, 0, {0, 1, 4099, (1u << (20 - kLargeShift)) + 3}});
        if (w >= 4) out.back().large_types = widths;
      }
      out.push_back({"shm", 3, 512, {0, 1, 17, 4099}, true});  // three ranks sharing one core
      // Large enough (4 MiB per rank) that the all_reduces of 2-byte types and wider, and the
      // broadcasts and gathers of 4-byte types and wider, choose how they store into the slots
      // (Note [Streaming into the slots]): streaming always, whatever rank 0 would measure.
      // (Elsewhere rank 0 measures: its first large call of each kind stores normally, its second
      // streams.) Under the sanitizers, the all_reduces of 4-byte types and wider. One type of
      // each width: what streams is bytes.
      out.push_back({"shm", 2, 0, {(kLargeShift ? 1u << 20 : 1u << 21) + 17}, false, true, "", "", widths});
      continue;
    }
    // The engines (Gloo's TCP on loopback, MPI under mpirun -np 4), whose algorithms change
    // with the message size (Gloo's ring splits large messages in segments of 1 MiB).
    for (int w : {1, 2, 3, 4}) out.push_back({backend, w, 0, {0, 1, 17, 4099, (1u << (18 - kLargeShift)) + 3}});
    if (backend != "tcp") continue;
    // chorus's own algorithms between hosts, each forced (Note [Algorithms between hosts]): on
    // a power of two of ranks and off it (where recursive doubling and halving-doubling fold
    // the extra ranks in); counts of 1 and 3 leave some ring chunks empty.
    const std::pair<const char*, const char*> forced[] = {
        {"doubling_direct_binomial", "recursive_doubling,reduce_scatter=direct,all_gather=direct,broadcast=binomial"},
        {"ring_scatter_ring", "ring,broadcast=scatter_ring"},
        {"ring_chain", "ring,broadcast=chain"},
        {"halving_doubling", "halving_doubling,reduce_scatter=ring,all_gather=direct,broadcast=scatter_ring"}};
    for (const auto& [label, algorithms] : forced)
      for (int w : {3, 4}) {
        SweepConfig c{backend, w, 0, {0, 1, 3, 17, 4099, (1u << (18 - kLargeShift)) + 3}};
        c.cross_algorithm = algorithms;
        c.label = label;
        out.push_back(c);
      }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Core, Sweep, ::testing::ValuesIn(configs()), [](const auto& info) {
  if (info.param.backend != "shm")
    return detail::concat(info.param.backend, "_W", info.param.world, info.param.label.empty() ? "" : "_",
                          info.param.label);
  const auto& stream = info.param.stream_slots;
  return detail::concat("W", info.param.world, info.param.chunk_bytes ? "_small_chunks" : "_default_chunks",
                        info.param.one_core ? "_one_core" : "",
                        stream ? (*stream ? "_streamed_slots" : "_normal_slots") : "");
});

// Symmetric memory (Note [Symmetric memory]): all_reduce between buffers in it, out of place and
// in place, at offsets that differ between ranks, and with one rank on ordinary memory (which
// sends everyone down the staged path). Each dtype gets fresh buffers, so allocations are also
// freed and made again. On the engines it is ordinary memory and must give the same results.
class Symmetric : public ::testing::TestWithParam<SweepConfig> {
 protected:
  // Runs body on every rank of the parameter's group; no segment may be left behind.
  void on_every_rank(const std::function<void(Communicator&, const SweepConfig&)>& body) {
    const SweepConfig config = GetParam();
    auto results = run_group(
        config.world, [&](Communicator& comm) { body(comm, config); }, options_for(config), std::chrono::seconds(600));
    expect_all_ok(results);
    EXPECT_TRUE(leftover_segments(results).empty());
  }
};

TEST_P(Symmetric, AllReduceBetweenSymmetricBuffers) {
  on_every_rank([&](Communicator& comm, const SweepConfig& config) {
    const int W = comm.size(), me = comm.rank();
    RANK_CHECK(comm.alloc_symmetric(0).data() == nullptr, "alloc_symmetric(0) gave memory");
    for (size_t count : config.counts)
      for (DataType dt : kAllDataTypes) {
        // The streaming size for one type of each kind of fold (floats, halves, bytes): what
        // streams there is bytes, and each type's fold is checked at the smaller size.
        if (count > (1u << 20) && dt != DataType::Float32 && dt != DataType::BFloat16 && dt != DataType::Int8) continue;
        const size_t es = element_size(dt), bytes = count * es;
        const size_t off_in = size_t(me % 3) * 64 + size_t(me % 2) * es, off_out = size_t(me % 2) * 192;
        SymmetricMemory a = comm.alloc_symmetric(bytes + 256), b = comm.alloc_symmetric(bytes + 256);
        RANK_CHECK(a.size() == bytes + 256 && reinterpret_cast<uintptr_t>(a.data()) % 64 == 0, "bad allocation");
        const auto* first = static_cast<const uint8_t*>(b.data());
        RANK_CHECK(std::all_of(first, first + b.size(), [](uint8_t x) { return x == 0; }), "not zero-filled");
        auto* in = static_cast<uint8_t*>(a.data()) + off_in;
        auto* out = static_cast<uint8_t*>(b.data()) + off_out;
        for (ReduceOp op : kAllReduceOps) {
          if (!reduce_op_problem(dt, op).empty()) continue;
          auto gen = [&](int p, size_t i) { return value(dt, op, p, i, 7 + uint64_t(op)); };
          const auto mine = make_buffer(dt, count, [&](size_t i) { return gen(me, i); });
          const auto want = reference_reduce(dt, op, W, count, gen);
          auto check = [&](const uint8_t* got, const char* how) {
            const std::string diff = compare_bytes(got, want.data(), count, dt);
            RANK_CHECK(diff.empty(), label("all_reduce", dt, count, how), " ", to_string(op), ": ", diff);
          };
          std::memcpy(in, mine.data(), bytes);
          comm.all_reduce(in, out, count, dt, op);
          check(out, " symmetric");
          comm.all_reduce(in, in, count, dt, op);
          check(in, " symmetric in place");
          auto plain = mine;  // the last rank on ordinary memory, the others symmetric
          std::memcpy(in, mine.data(), bytes);
          uint8_t* mixed = me == W - 1 ? plain.data() : in;
          comm.all_reduce(mixed, mixed, count, dt, op);
          check(mixed, " mixed in place");
        }
      }
  });
}

// The direct all_gather (every output symmetric: Note [Direct all_gather]) and reduce_scatter
// (every input symmetric: Note [Direct reduce_scatter]), even and uneven, in place and not, at
// offsets that differ between ranks; then with the last rank's buffer in ordinary memory, which
// sends everyone down the staged path.
TEST_P(Symmetric, AllGatherAndReduceScatterBetweenSymmetricBuffers) {
  on_every_rank([&](Communicator& comm, const SweepConfig& config) {
    const int W = comm.size(), me = comm.rank();
    const bool last = me == W - 1;
    for (size_t count : config.counts)
      for (DataType dt : kAllDataTypes) {
        // The streaming size once: what streams there is bytes, whatever their type.
        if (count > (1u << 20) && dt != DataType::Float32 && dt != DataType::Int8) continue;
        const size_t es = element_size(dt), off = size_t(me % 3) * 64 + size_t(me % 2) * es;
        auto gen = [&](int p, size_t i) { return value(dt, ReduceOp::Sum, p, i, 11); };
        const auto counts = uneven_counts(W, count);
        const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
        std::vector<uint8_t> want_even, want_v;
        for (int p = 0; p < W; ++p) {
          auto even = make_buffer(dt, count, [&](size_t i) { return gen(p, i); });
          auto v = make_buffer(dt, counts[size_t(p)], [&](size_t i) { return gen(p, i); });
          want_even.insert(want_even.end(), even.begin(), even.end());
          want_v.insert(want_v.end(), v.begin(), v.end());
        }
        const auto mine = make_buffer(dt, count, [&](size_t i) { return gen(me, i); });
        SymmetricMemory a = comm.alloc_symmetric(size_t(W) * (count + 7) * es + 256);
        auto* sym = static_cast<uint8_t*>(a.data()) + off;
        auto check = [&](const uint8_t* got, const std::vector<uint8_t>& want, size_t n, const char* what) {
          const std::string diff = compare_bytes(got, want.data(), n, dt);
          RANK_CHECK(diff.empty(), label(what, dt, count), ": ", diff);
        };
        for (bool mixed : {false, true}) {
          std::vector<uint8_t> plain(size_t(W) * (count + 7) * es);
          uint8_t* out = mixed && last ? plain.data() : sym;
          std::memset(out, 0xCD, size_t(W) * count * es);
          comm.all_gather(mine.data(), out, count, dt);
          check(out, want_even, size_t(W) * count, mixed ? "all_gather, mixed" : "all_gather into symmetric");
          std::memset(out, 0xCD, size_t(W) * count * es);
          std::memcpy(out + size_t(me) * count * es, mine.data(), count * es);
          comm.all_gather(out + size_t(me) * count * es, out, count, dt);
          check(out, want_even, size_t(W) * count, mixed ? "all_gather in place, mixed" : "all_gather in place");
          std::memset(out, 0xCD, total * es);
          const auto vin = make_buffer(dt, counts[size_t(me)], [&](size_t i) { return gen(me, i); });
          comm.all_gather_v(vin.data(), out, counts, dt);
          check(out, want_v, total, mixed ? "all_gather_v, mixed" : "all_gather_v into symmetric");
          for (ReduceOp op : kAllReduceOps) {
            if (!reduce_op_problem(dt, op).empty()) continue;
            auto rgen = [&](int p, size_t i) { return value(dt, op, p, i, 13 + uint64_t(op)); };
            const auto want =
                reference_reduce(dt, op, W, count, [&](int p, size_t i) { return rgen(p, i + size_t(me) * count); });
            const auto blocks = make_buffer(dt, size_t(W) * count, [&](size_t i) { return rgen(me, i); });
            uint8_t* in = mixed && last ? plain.data() : sym;
            std::memcpy(in, blocks.data(), blocks.size());
            std::vector<uint8_t> got(count * es);
            comm.reduce_scatter(in, got.data(), count, dt, op);
            check(got.data(), want, count, mixed ? "reduce_scatter, mixed" : "reduce_scatter from symmetric");
            uint8_t* own = in + size_t(me) * count * es;
            comm.reduce_scatter(in, own, count, dt, op);
            check(own, want, count, mixed ? "reduce_scatter in place, mixed" : "reduce_scatter in place");
          }
        }
      }
  });
}

std::vector<SweepConfig> symmetric_configs() {
  std::vector<SweepConfig> out;
  for (const std::string& backend : test_backends()) {
    if (backend == "shm") {
      for (int w : {1, 2, 3, 4, 7}) out.push_back({"shm", w, 0, {(1u << 18) + 3}});
      out.push_back({"shm", 2, 0, {(1u << 22) + 17}});  // streams (Note [Streaming stores])
    } else {
      out.push_back({backend, 2, 0, {(1u << 16) + 3}});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Core, Symmetric, ::testing::ValuesIn(symmetric_configs()), [](const auto& info) {
  return detail::concat(info.param.backend, "_W", info.param.world, "_n", info.param.counts[0]);
});

}  // namespace
}  // namespace chorus::test
