// chorusrun: starts and supervises the worker processes of a chorus (or torch.distributed-style)
// program, like torchrun: every worker gets torchrun's environment variables plus CHORUS_*
// ones, node 0 hosts the rendezvous store, output is forwarded line by line with a [rank N]
// prefix, and a failing worker stops the group (and restarts it, up to --max-restarts).
// Never links LibTorch.
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/supervisor.h"
#include "chorus/core/tcp_store.h"

namespace {

using chorus::detail::concat;

struct Options {
  std::string nproc = "1";
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;
  bool no_prefix = false;
  std::string run_id;
  double stop_timeout = 5;
};

int cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

void say(const std::string& what) { std::fprintf(stderr, "chorusrun: %s\n", what.c_str()); }

// A port nobody listens on now, for the program's own store (torch.distributed's env:// makes
// rank 0 serve MASTER_PORT); 0 when none can be had.
int free_port(const std::string& addr) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr.c_str(), "0", &hints, &found) != 0) return 0;
  int port = 0;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0)
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return port;
}

// Note [Two ports]: chorus programs meet on chorusrun's store (CHORUS_STORE_ADDR/PORT). MASTER_PORT
// is another port, left free for a program that serves its own store there, as
// torch.distributed's env:// does on rank 0 (torchrun lets it use its agent's store instead,
// which speaks torch's protocol; chorusrun's does not): any free port on one node, the store's
// port + 1 across nodes, where every node must agree without asking.
int program_port(const Options& o, int store_port) {
  if (o.nnodes > 1) return store_port + 1;
  const int port = free_port(o.master_addr);
  return port ? port : store_port + 1;
}

std::vector<std::pair<std::string, std::string>> worker_env(const Options& o, int nproc, int local, int port,
                                                            int master_port, int restart, const std::string& run_id) {
  chorus::Environment place;
  place.launcher = chorus::Launcher::Chorusrun;
  place.rank = o.node_rank * nproc + local;
  place.local_rank = local;
  place.world_size = o.nnodes * nproc;
  place.local_world_size = nproc;
  place.node_rank = o.node_rank;
  place.num_nodes = o.nnodes;
  place.master_addr = o.master_addr;
  place.master_port = port;
  place.store_hosted = true;
  place.restart_count = restart;
  place.job_id = run_id;
  auto env = chorus::launcher_environment(place, o.max_restarts);
  for (auto& [name, value] : env)
    if (name == "MASTER_PORT") value = concat(master_port);  // Note [Two ports]
  if (nproc > 1 && !std::getenv("OMP_NUM_THREADS")) env.emplace_back("OMP_NUM_THREADS", "1");
  return env;
}

int run(const Options& o, const std::vector<std::string>& program) {
  const int nproc = o.nproc == "auto" ? cores() : std::stoi(o.nproc);
  if (nproc < 1) throw chorus::InvalidArgument("--nproc-per-node must be >= 1 (or auto)");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw chorus::InvalidArgument(concat("--node-rank ", o.node_rank, " is not in [0, ", o.nnodes, ")"));
  if (o.master_port == 0 && o.nnodes > 1)
    throw chorus::InvalidArgument(
        "--master-port 0 (any free port) works with one node only: the other nodes must "
        "know the port");
  if (!o.log_dir.empty()) mkdir(o.log_dir.c_str(), 0755);
  if (nproc > 1 && !std::getenv("OMP_NUM_THREADS"))
    say(concat("setting OMP_NUM_THREADS=1 for each of the ", nproc,
               " workers so they do not oversubscribe the cores; set it yourself to choose another value"));

  // SIGINT, SIGTERM and SIGHUP stop the workers first; SIGKILL takes them down through
  // PR_SET_PDEATHSIG. A closed stdout (chorusrun ... | head) must not end the supervision.
  signal(SIGPIPE, SIG_IGN);
  sigset_t stops;
  sigemptyset(&stops);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, s);
  sigprocmask(SIG_BLOCK, &stops, nullptr);
  const int sigfd = signalfd(-1, &stops, SFD_CLOEXEC);

  std::unique_ptr<chorus::TcpStoreServer> store;
  int port = o.master_port;
  if (o.node_rank == 0) {
    store = std::make_unique<chorus::TcpStoreServer>(o.master_addr, o.master_port);
    port = store->port();
  }
  const std::string run_id = o.run_id.empty() ? concat("chorusrun-", o.master_addr, "-", port) : o.run_id;
  const int for_program = program_port(o, port);

  chorus::SupervisorOptions so;
  so.prefix = !o.no_prefix;
  so.log_dir = o.log_dir;
  so.grace = std::chrono::milliseconds(int64_t(o.stop_timeout * 1000));
  so.name = "chorusrun";
  chorus::Supervisor supervisor(so);
  for (int attempt = 0;; ++attempt) {
    std::vector<chorus::WorkerSpec> specs;
    for (int local = 0; local < nproc; ++local)
      specs.push_back(
          {o.node_rank * nproc + local, program, worker_env(o, nproc, local, port, for_program, attempt, run_id)});
    supervisor.start(specs);
    auto failure = supervisor.wait(sigfd);
    if (!failure) return 0;
    if (failure->rank < 0) {
      signalfd_siginfo info{};
      (void)!read(sigfd, &info, sizeof(info));
      say(concat("received ", chorus::signal_name(int(info.ssi_signo)), ": stopped the workers"));
      return 128 + int(info.ssi_signo);
    }
    say(supervisor.describe_failures() + "; the other workers were stopped");
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0) say(concat("giving up after ", o.max_restarts, " restart(s)"));
      return 1;
    }
    say(concat("restarting the workers (restart ", attempt + 1, " of ", o.max_restarts, ")"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "chorusrun: start N worker processes of a program on this node and supervise them (torchrun-compatible).\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, ROLE_RANK,\n"
      "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID\n"
      "and CHORUS_* equivalents. Node 0 hosts the rendezvous store at --master-addr:--master-port\n"
      "(CHORUS_STORE_ADDR/PORT); MASTER_PORT is left free for a program's own store, as torch.distributed's\n"
      "env:// serves one on rank 0 (any free port on one node, the store's port + 1 across nodes).\n\n"
      "  chorusrun --nproc-per-node 4 ./train --epochs 3",
      "chorusrun"};
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc, "workers on this node: a number, or auto (one per core)")
      ->capture_default_str();
  app.add_option("--nnodes", o.nnodes, "nodes in the job (same --nproc-per-node on each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's rank in [0, nnodes)")->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr, "address of node 0, where the store listens")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", o.master_port, "port of the store on node 0 (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_flag("--standalone", o.standalone, "single node, store on any free local port");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts, "restart the workers this many times after a failure")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", o.log_dir, "also write each rank's output to <dir>/rank_N.log");
  app.add_flag("--no-prefix,--no_prefix", o.no_prefix, "forward output lines without the [rank N] prefix");
  app.add_option("--run-id,--rdzv-id,--rdzv_id", o.run_id, "job id given to the workers (TORCHELASTIC_RUN_ID)");
  app.add_option("--stop-timeout", o.stop_timeout, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.prefix_command();
  app.footer("The program and its arguments follow the options.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<std::string> program = app.remaining();
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  if (program.empty()) {
    std::fprintf(stderr, "chorusrun: no program given\n%s", app.help().c_str());
    return 2;
  }
  if (o.standalone) {
    o.nnodes = 1;
    o.node_rank = 0;
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  try {
    return run(o, program);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
