// Starting and watching worker processes: what chorusrun, Fabric::launch and chorus-bench share.
//
// Workers run in their own process groups and die with the supervising process (even when it is
// SIGKILLed: PR_SET_PDEATHSIG). Their output can be forwarded whole line by whole line, prefixed
// with "[rank N] ", and copied to one log file per rank. When one fails, the others are stopped
// (SIGTERM, then SIGKILL after a grace period), and the shared-memory segments they created are
// removed.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/environment.h"

namespace chorus {

// What wait()'s periodic check wants: go on waiting, stop the workers and return, or return
// leaving them running.
enum class WaitCheck { Continue, Stop, Return };

struct WorkerSpec {
  int rank = 0;                                          // how output and messages name the worker
  std::vector<std::string> argv;                         // argv[0]: a path, or a name looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // set on top of this process's environment
  std::vector<int> cpus;                                 // non-empty: the worker runs on these CPUs only
};

// The variables a chorus launcher gives a worker standing at `place` (master_addr/master_port:
// the store the launcher hosts; job_id: the run id): torchrun's (RANK LOCAL_RANK WORLD_SIZE
// LOCAL_WORLD_SIZE GROUP_RANK NODE_RANK GROUP_WORLD_SIZE ROLE_* MASTER_ADDR MASTER_PORT
// TORCHELASTIC_*) and their CHORUS_* equivalents, with CHORUS_LAUNCHER=chorusrun, so that
// Environment::detect() in the worker gives `place` back.
std::vector<std::pair<std::string, std::string>> launcher_environment(const Environment& place, int max_restarts = 0);

// Note [Threads of ranks that share the cores]: what a launcher sets for the OpenMP threads of
// `nproc` workers on one machine, where this process's environment does not say (torchrun's
// convention, extended): OMP_NUM_THREADS=1, so that ranks rather than threads share the cores,
// and OMP_WAIT_POLICY=PASSIVE (unless OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME is set).
// A program that raises its thread count (torch.set_num_threads) still runs more threads than
// cores, and by default an OpenMP runtime's idle threads keep polling for milliseconds after each
// parallel region (libgomp, which torch's CPU wheels bundle, for 300,000 rounds): they hold the
// cores the other ranks need to reach and finish their collectives, and a collective then waits
// for the scheduler's tick. Passive threads sleep at once; the price is a futex wake-up when the
// next parallel region starts. Measured in docs/performance.md (bench/compare.py --load matmul).
std::vector<std::pair<std::string, std::string>> worker_thread_environment(int nproc);

// Note [A core for every rank]: the CPUs a launcher binds worker `local` of `nproc` on this machine
// to: an equal share of this process's CPUs, consecutive, none shared with another worker. Empty
// (the worker runs where the scheduler puts it) for one worker, for more workers than CPUs, and
// under CHORUS_BIND_TO=none; CHORUS_BIND_TO=cores (or core), the default, binds.
// Unbound ranks that have as many cores as they are do not keep them: beside another busy process
// the scheduler puts two ranks that take turns waiting for each other on one core (their load
// together is one core's), and every call of theirs then hands that core over between them. W=2
// on 2 cores beside a CPU-bound process (chorus-bench, median): barrier 3.4-3.6 us unbound, 0.17
// bound; Open MPI, whose mpirun binds 2 ranks to cores, 0.21. A rank's own threads (torch's
// intra-op pool, OMP_NUM_THREADS per worker_thread_environment) stay on its share. Groups count
// the CPUs of all their ranks, so a bound rank still knows it has a core of its own (Note [Ranks
// sharing the cores]). Throws InvalidArgument for another value of CHORUS_BIND_TO.
std::vector<int> worker_cpus(int local, int nproc);

// What binding the workers means, for a launcher to say ("" where worker_cpus binds none); `unbind`:
// how to turn it off in that launcher.
std::string describe_binding(int nproc, const std::string& unbind);

struct SupervisorOptions {
  bool capture_output = true;  // forward stdout/stderr line by line (false: workers inherit them)
  bool prefix = true;          // "[rank N] " before each forwarded line
  std::string log_dir;         // non-empty: also append each rank's lines to <log_dir>/rank_N.log
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // SIGTERM to SIGKILL when stopping
  std::string name = "chorus";                                // prefix of the supervisor's own messages
};

struct WorkerExit {
  static constexpr int kInterrupted = -1;  // wait() returned because interrupt_fd was readable
  static constexpr int kStopped = -2;      // wait() returned because `check` said Stop
  static constexpr int kPaused = -3;       // wait() returned because `check` said Return; workers run on
  int rank = kInterrupted;
  int pid = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it
  bool ok() const { return signal == 0 && exit_code == 0; }
  // "rank 2 (pid 1234) was killed by SIGSEGV" / "rank 2 (pid 1234) exited with code 3"
  std::string describe() const;
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options = {});
  ~Supervisor();  // stops the workers still running
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the workers (not blocking). Throws Error naming a worker that cannot be started
  // (program not found, fork failure), after stopping the ones already started.
  void start(const std::vector<WorkerSpec>& workers);

  // Blocks, forwarding output, until every worker exited: nullopt when all succeeded, else the
  // first failure. Workers that fail within a moment of it (often the cause: a rank whose exit
  // was slowed by its own teardown, while its peers gave up at once) are collected too, see
  // failures(); then the others are stopped. Also returns when `interrupt_fd` (if >= 0) becomes
  // readable (rank kInterrupted: every worker stopped first), or when `check` (asked about every
  // 100 ms) says Stop (rank kStopped, every worker stopped first) or Return (rank kPaused, the
  // workers still running: wait() may be called again for them).
  std::optional<WorkerExit> wait(int interrupt_fd = -1, const std::function<WaitCheck()>& check = {});
  // The failures the last wait() saw, in the order they exited.
  const std::vector<WorkerExit>& failures() const;
  // "rank 1 (pid 7) exited with code 9; rank 2 (pid 8) exited with code 5"
  std::string describe_failures() const;

  // SIGTERM to every running worker's process group, SIGKILL to those left after the grace
  // period; reaps them and removes their shared-memory segments.
  void stop();

  std::vector<int> pids() const;

 private:
  void settle();
  struct State;
  std::unique_ptr<State> s_;
};

// A signal's name: "SIGSEGV" (or "signal 77").
std::string signal_name(int signal);

}  // namespace chorus
