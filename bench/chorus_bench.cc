// chorus-bench: every collective over a size sweep, nccl-tests style. Without a launcher it
// starts its own ranks (re-executing itself with torchrun-style variables and a store it
// hosts); under chorusrun, torchrun or mpirun it runs as one of the ranks.
//
// Each measurement: warm-up runs, then per iteration fresh input (values depend on the
// iteration), a barrier, the timed call, a barrier, and a check of the output against the exact
// expected values (outside the timed region; with --check-last, of each size's last call only).
// Reported: rank 0's median, p95 and mean in microseconds, and algbw/busbw in GB/s with
// nccl-tests' factors.
// The mean is what a loop of calls pays per call, and it holds where the median does not: with
// more ranks than cores each core changes hands once per barrier, and rank 0's barriers split
// into those it reached last (through at once) and those in which it gave up its core and waited
// for it to come back (W=4 on 2 cores: 45% at 0.1 us, the rest at 4.5); the median then lands in
// either group by chance.
//
// Note [Quiet between calls]: with more ranks than cores, a rank that has finished the call and
// starts filling or checking buffers (milliseconds of work at 1 MiB) holds a core that a peer
// still inside the call may need: the peer, and with it rank 0's clock, waits out the busy
// rank's time slice. The measurement would then time the bench's own checking, not the call
// (seen: 1 MiB all_reduce at W=4, median 2.1 ms with it, 0.25 ms without). So every rank waits
// for the others to leave the call before it does any work of its own, as the peers' benchmarks
// do by doing no work between calls at all.
// The check itself is work between calls that bench/mpi_tail.c (Open MPI on the same workload)
// does not do, and with more ranks than cores the calls after it are slower for it (W=4 on 2
// cores, three interleaved runs, median checking every call against --check-last: 1 MiB
// all_gather 781-797 against 462-693 us, 1 MiB all_reduce 198-402 against 153-224).
// bench/compare.py passes --check-last, so that both do the same work between calls and every
// size's result is still checked.
//
// Note [The same fill on both sides]: the fill before each call is work between calls too, and
// beside a CPU-bound process its length decides how many time slices a measurement spans. W=2 on
// 2 cores, each rank bound to a core, the CPU-bound process sharing rank 1's: rank 1 is preempted
// for a time slice (3.5-4 ms) about every 8 ms, mostly while it waits in the barrier for rank 0
// to finish its fill, and rank 0 meets the stall at its next wait, inside the timed call. Rank
// 0's times of a 1 MiB broadcast (200 calls, two runs) held 24 and 33 such calls, one every 5 to
// 9, and the wait could not move them: spinning without end left 6 and 21, sleeping after a 10
// or 50 us spin made even the median a slice in 5 runs of 6, and 100 us slices asked of the
// scheduler (sched_setattr) kept the p95 at one (3.0-3.9 ms). Open MPI's p95 was a slice in 4 of
// 4 runs beside chorus's. So a p95 over 50 calls is a slice whenever the calls and their fills
// span three slices or more, and a longer fill makes that likelier: chorus-bench's, one element
// at a time through a switch on the dtype, took about 380 us per MiB of floats, mpi_tail.c's loop
// about 260. Both now write the first 4 values (the pattern repeats every 4) and copy them in
// runs of up to 64 KiB, the same code on both sides: 25-30 us per MiB, through the cache (one
// doubling memcpy of 32 MiB would stream past it, unlike the stores of a kernel writing a tensor).
// Beside the CPU-bound process chorus's 1 MiB broadcast then kept its p95 clear of a slice in 4
// runs of 4 (65-73 us, against 3.7-3.8 ms in 2 of 2 with the old fills); Open MPI's, 2-4 times
// slower a call, was one in 2 of the 4 (2026-11-28; the table is in docs/performance.md's history).
//
// Note [Warm buffers]: memory a process has not used for a while is slow on these VMs for its
// first milliseconds of use, whoever uses it. One process copying 1 MiB between two fresh
// buffers, over and over (a memcpy, no chorus): 59-75 us a copy over the first 30 copies, 30-36
// from the 120th on; 16 MiB, 3.1 ms over the first 4 and 2.2-2.6 from the 13th. Every size here
// runs on buffers of its own, and three untimed calls left most of a 1 MiB measurement on such
// pages: W=2, 1 MiB all_gather (normal stores), means of 20 calls in one run, 215 164 159 138 ...
// 103-122 us.
// It struck the benchmarks unevenly: bench/mpi_tail.c timed every op of a size before the next
// size, on one input, so its all_gather ran on an input that 53 all_reduce calls had already
// warmed; chorus-bench, op by op, met it fresh. Same session, 3 untimed calls against 100, W=2,
// 1 MiB, median us, three interleaved runs: chorus's all_gather 182-256 against 114-129, Open
// MPI's 193-209 against 169-178; all_reduce 149-207 against 95-99 (Open MPI 270-273 against
// 207-218 in its fast state). So both take as many untimed calls as timed ones up to 16 MiB
// (default_warmup(); the larger sizes take a few ms a call and are past it after the first
// three), and measure the calls a training loop makes, on buffers it keeps. Buffers keep warming
// for 50-90 calls of 1 MiB, past those 50 untimed ones, so mpi_tail now runs op by op too, each
// size on buffers of its own.
//
// Note [A p95 beside busy cores]: beside a CPU-bound process the rank that shares its core is
// preempted for a time slice (3.5-4 ms) every 8 ms or so (Note [The same fill on both sides]),
// and a call that meets one takes the slice. 50 calls of 1 MiB (about 0.3 ms a loop each, fill
// and barriers included) span two or three slices, so their p95, the third slowest call, is a
// slice or not by whether a third call met one: in three compare.py --load runs over two sessions,
// chorus's 1 MiB all_gather's p95 was a slice in 7 runs of 9 and Open MPI's in 3 of 9, while the
// two sides' means were alike (292-843 us against 319-698). With --tail both benchmarks time 400
// calls up to 1 MiB, a p95 of 20 calls, which says what share of calls the slices catch, and 40
// beyond, where a call of several ms spans slices by itself, after as many untimed ones: a p95 of
// the calls a training loop makes, past the first calls of a size, in which chorus's rank 0 tries
// its ways (Note [Streaming into the slots]: after 10 untimed calls, the 40 timed calls of 16 MiB
// held its first trials, the slowest of them). W=2, 1 MiB all_gather, 400 calls, three alternating
// runs beside the same process: chorus's p95 0.37-0.51 ms (means 289-384 us), Open MPI's 4.37,
// 4.56 and 0.46 ms (means 351-915). compare.py --load passes --tail to both.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>

#include "bench_ops.h"
#include "chorus/core/environment.h"
#include "chorus/core/error.h"
#include "chorus/core/rendezvous.h"
#include "chorus/core/supervisor.h"
#include "chorus/core/tcp_store.h"
#ifdef CHORUS_BENCH_STEP_LOAD
#include "step_load.h"
#endif

namespace chorus::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int np = 2;
  std::string ops = "barrier,all_reduce,broadcast,reduce,all_gather,gather,scatter,reduce_scatter,all_to_all,send_recv";
  std::string min_bytes = "8", max_bytes = "64M", sizes;
  double factor = 2;
  std::string dtype = "f32";
  int iters = 0, warmup = -1;  // -1: default_warmup()
  size_t chunk_bytes = 0;
  bool check = true;
  bool check_last = false;  // only each size's last call
  bool tail = false;        // Note [A p95 beside busy cores]
  bool csv = false;
  bool symmetric = false;
  bool last_rank = false;                 // each call's time is its slowest rank's
  int step_matmul = 0, step_threads = 2;  // a step's compute before every call (bench/step_load.cc)
};

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k" || unit == "KiB")
    v *= 1024;
  else if (unit == "M" || unit == "MiB")
    v *= 1024 * 1024;
  else if (unit == "G" || unit == "GiB")
    v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw InvalidArgument("bad size '" + s + "': use a number with K, M or G");
  return size_t(v);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

DataType parse_dtype(const std::string& s) {
  for (DataType dt : kAllDataTypes)
    if (to_string(dt) == s) return dt;
  throw InvalidArgument("unknown dtype '" + s + "': use f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool");
}

// With `tail`, enough calls for a p95 that one time slice does not decide (Note [A p95 beside busy cores]).
int default_iters(size_t bytes, bool tail = false) {
  if (tail) return bytes <= (1u << 20) ? 400 : 40;
  return bytes <= 65536 ? 200 : bytes <= (1u << 20) ? 50 : 10;
}
// Note [Warm buffers]: as many untimed calls as timed ones up to 16 MiB, then 3 (bench/mpi_tail.c's rule too).
int default_warmup(size_t bytes, bool tail) { return bytes <= (16u << 20) ? default_iters(bytes, tail) : 3; }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

// A training step's compute before a call (--step-matmul): bench/step_load.cc.
void step(const Options& o) {
#ifdef CHORUS_BENCH_STEP_LOAD
  if (o.step_matmul) chorus_step_load_run();
#else
  (void)o;
#endif
}

int worker(const Options& o) {
  const Environment env = Environment::detect();
#ifdef CHORUS_BENCH_STEP_LOAD
  if (o.step_matmul) chorus_step_load_init(o.step_threads, o.step_matmul);
#else
  if (o.step_matmul) throw InvalidArgument("--step-matmul needs the torch layer, and this build has none");
#endif
  CommunicatorOptions co;
  co.name = "bench";
  co.shm.chunk_bytes = o.chunk_bytes;
  co.timeout = std::chrono::minutes(5);
  auto comm = Communicator::create(connect_store(env), env.rank, env.world_size, co);
  const int rank = comm->rank(), world = comm->size();
  const DataType dt = parse_dtype(o.dtype);

  std::vector<size_t> sizes;
  if (!o.sizes.empty()) {
    for (const auto& s : split(o.sizes)) sizes.push_back(parse_size(s));
  } else {
    for (double b = double(parse_size(o.min_bytes)); b <= double(parse_size(o.max_bytes)); b *= o.factor)
      sizes.push_back(size_t(b));
  }
  auto ops = all_ops();
  std::map<std::string, BenchOp*> by_name;
  for (auto& op : ops) by_name[op->name] = op.get();

  if (rank == 0) {
    std::printf("# chorus-bench: %d ranks, backend %s, dtype %s, %s buffers, rank 0's times\n", world,
                comm->backend_name().c_str(), o.dtype.c_str(), o.symmetric ? "symmetric" : "ordinary");
    if (o.csv)
      std::printf("op,bytes,median_us,p95_us,mean_us,algbw_GBps,busbw_GBps,check\n");
    else
      std::printf("%-14s %12s %12s %12s %12s %10s %10s %6s\n", "op", "bytes", "median_us", "p95_us", "mean_us",
                  "algbw_GBps", "busbw_GBps", "check");
    std::fflush(stdout);
  }
  auto report = [&](const std::string& name, size_t bytes, const std::vector<double>& us, double alg, double bus_factor,
                    bool ok) {
    if (rank != 0) return;
    const double med = percentile(us, 0.5), p95 = percentile(us, 0.95);
    const double mean = us.empty() ? 0 : std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
    const double algbw = med > 0 ? alg / (med * 1e-6) / 1e9 : 0;
    const char* check = !o.check ? "-" : ok ? "OK" : "FAIL";
    if (o.csv)
      std::printf("%s,%zu,%.2f,%.2f,%.2f,%.3f,%.3f,%s\n", name.c_str(), bytes, med, p95, mean, algbw,
                  algbw * bus_factor, check);
    else
      std::printf("%-14s %12zu %12.2f %12.2f %12.2f %10.3f %10.3f %6s\n", name.c_str(), bytes, med, p95, mean, algbw,
                  algbw * bus_factor, check);
    std::fflush(stdout);
  };

  bool all_ok = true;
  for (const auto& name : split(o.ops)) {
    if (name == "barrier") {
      const int iters = o.iters ? o.iters : 1000;
      for (int i = 0; i < (o.warmup >= 0 ? o.warmup : 10); ++i) comm->barrier();  // as bench/mpi_tail.c's
      std::vector<double> us;
      for (int i = 0; i < iters; ++i) {
        auto t0 = Clock::now();
        comm->barrier();
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      report("barrier", 0, us, 0, 0, true);
      continue;
    }
    auto it = by_name.find(name);
    if (it == by_name.end()) throw InvalidArgument("unknown op '" + name + "'");
    const BenchOp& op = *it->second;
    if (name == "send_recv" && world < 2) continue;
    for (size_t bytes : sizes) {
      const size_t count = op.count_for(bytes, dt, world);
      Buffers b(o.symmetric ? comm.get() : nullptr);
      op.allocate(b, count, dt, world);
      const int iters = o.iters ? o.iters : default_iters(bytes, o.tail);
      const int warmup = o.warmup >= 0 ? o.warmup : default_warmup(bytes, o.tail);
      std::vector<double> us;
      bool ok = true;
      for (int i = -warmup; i < iters; ++i) {
        op.fill(b, count, dt, rank, world, i + warmup);
        step(o);
        comm->barrier();
        auto t0 = Clock::now();
        op.run(*comm, b, count, dt);
        auto t1 = Clock::now();
        if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        comm->barrier();  // Note [Quiet between calls]
        if (o.check && (!o.check_last || i + 1 == iters)) {
          std::string why = op.verify(b, count, dt, rank, world, i + warmup);
          if (!why.empty()) {
            std::fprintf(stderr, "chorus-bench: rank %d: %s of %zu bytes: %s\n", rank, name.c_str(), bytes,
                         why.c_str());
            ok = false;
          }
        }
      }
      // A call is done when its last rank is: a broadcast's root may leave long before its readers.
      if (o.last_rank && !us.empty())
        comm->all_reduce(us.data(), us.data(), us.size(), DataType::Float64, ReduceOp::Max);
      // Every rank's verdict counts.
      int32_t bad = ok ? 0 : 1;
      comm->all_reduce(&bad, &bad, 1, DataType::Int32, ReduceOp::Sum);
      all_ok = all_ok && bad == 0;
      report(name, bytes, us, op.alg_bytes(count, dt, world), op.bus_factor(world), bad == 0);
    }
  }
  comm->barrier();
  return all_ok ? 0 : 3;
}

// Starts np copies of this program as ranks, hosting their store; returns the exit code.
int spawn(int np, char** argv) {
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> args = {"/proc/self/exe"};
  for (char** a = argv + 1; *a; ++a) args.emplace_back(*a);
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < np; ++r) {
    specs.push_back(
        {r, args, launcher_environment(single_node(r, np, server.port(), "chorus-bench")), worker_cpus(r, np)});
    for (auto& var : worker_thread_environment(np)) specs.back().env.push_back(var);
  }
  SupervisorOptions options;
  options.capture_output = false;
  options.name = "chorus-bench";
  Supervisor supervisor(options);
  supervisor.start(specs);
  if (!supervisor.wait()) return 0;
  std::fprintf(stderr, "chorus-bench: %s\n", supervisor.describe_failures().c_str());
  return 1;
}

}  // namespace
}  // namespace chorus::bench

int main(int argc, char** argv) {
  using namespace chorus::bench;
  Options o;
  CLI::App app{
      "chorus-bench: collectives over a size sweep, nccl-tests style (op, bytes, median/p95/mean us, algbw, busbw)"};
  app.add_option("-n,--np", o.np, "ranks to start when no launcher started this program")->check(CLI::Range(1, 1024));
  app.add_option("--ops", o.ops,
                 "comma-separated ops: barrier all_reduce broadcast reduce all_gather gather scatter "
                 "reduce_scatter all_to_all send_recv");
  app.add_option("-b,--min-bytes", o.min_bytes, "smallest message (per rank), e.g. 8, 1K, 4M");
  app.add_option("-e,--max-bytes", o.max_bytes, "largest message");
  app.add_option("-f,--step-factor", o.factor, "multiply the size by this between steps")->check(CLI::Range(1.01, 1e9));
  app.add_option("--sizes", o.sizes, "explicit comma-separated sizes instead of the sweep");
  app.add_option("-d,--dtype", o.dtype, "f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool");
  app.add_option("--iters", o.iters,
                 "timed iterations per size (default: 200 up to 64K, 50 up to 1M, then 10; with --tail 400 up to 1M, "
                 "then 40)");
  app.add_option("-w,--warmup", o.warmup,
                 "untimed iterations first (default: as many as --iters' default up to 16M, then 3; 10 barriers)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chunk-bytes", o.chunk_bytes, "shared-memory slot size (default: CHORUS_SHM_CHUNK_BYTES or 512K)");
  app.add_option("--step-matmul", o.step_matmul,
                 "before every call, an N x N float matmul on --step-threads intra-op threads, as a training "
                 "step's compute (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-threads", o.step_threads, "torch.set_num_threads for --step-matmul")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-check", o.check, "skip verifying results");
  app.add_flag("--check-last", o.check_last,
               "verify only each size's last call (no work between the timed calls but the fresh input, as in "
               "bench/mpi_tail.c)");
  app.add_flag("--tail", o.tail,
               "time enough calls for a p95 that one time slice of a busy core does not decide (400 up to 1M, then "
               "40; as bench/mpi_tail.c --tail)");
  app.add_flag("--last-rank", o.last_rank,
               "time each call on the rank that finished it last (default: rank 0's time; a broadcast's root may "
               "return before the others have the data)");
  app.add_flag("--csv", o.csv, "CSV output");
  app.add_flag("--symmetric", o.symmetric,
               "buffers in the group's symmetric memory (Communicator::alloc_symmetric) instead of ordinary memory");
  CLI11_PARSE(app, argc, argv);
  try {
    const bool launched = chorus::Environment::detect().launcher != chorus::Launcher::Single;
    return launched ? worker(o) : spawn(o.np, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-bench: %s\n", e.what());
    return 2;
  }
}
