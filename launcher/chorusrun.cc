// chorusrun: starts and supervises the worker processes of a chorus (or torch.distributed-style)
// program, like torchrun: every worker gets torchrun's environment variables plus CHORUS_*
// ones, node 0 hosts the rendezvous store, output is forwarded line by line with a [rank N]
// prefix, and a failing worker stops the group (and restarts it, up to --max-restarts).
// Never links LibTorch.
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <sstream>
#include <thread>

#include "chorus/core/elastic.h"
#include "chorus/core/elastic_agent.h"
#include "chorus/core/error.h"
#include "chorus/core/supervisor.h"
#include "chorus/core/tcp_store.h"

namespace {

using chorus::detail::concat;

struct Options {
  std::string nproc = "1";
  std::string nnodes_arg = "1";  // N or MIN:MAX
  int nnodes = 1;
  int min_nodes = 1, max_nodes = 1;
  std::string rdzv_backend = "static", rdzv_endpoint, rdzv_conf, local_addr;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;
  bool no_prefix = false;
  std::string run_id;
  double stop_timeout = 5;
  std::string bind_to;  // --bind-to: CHORUS_BIND_TO for worker_cpus
};

int cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

void say(const std::string& what) {
  std::fprintf(stderr, "chorusrun: %s%s\n", chorus::elastic::trace_stamp().c_str(), what.c_str());
}

// Note [Two ports]: chorus programs meet on chorusrun's store (CHORUS_STORE_ADDR/PORT). MASTER_PORT
// is another port, left free for a program that serves its own store there, as
// torch.distributed's env:// does on rank 0 (torchrun lets it use its agent's store instead,
// which speaks torch's protocol; chorusrun's does not): any free port on one node, the store's
// port + 1 across nodes, where every node must agree without asking.
int program_port(const Options& o, int store_port) {
  if (o.nnodes > 1) return store_port + 1;
  const int port = chorus::free_port(o.master_addr);
  return port ? port : store_port + 1;
}

// The variables of worker `local` of node `node_rank` of `nnodes`, meeting on the store at
// store_addr:port.
using WorkerEnv = std::vector<std::pair<std::string, std::string>>;

WorkerEnv worker_env(const Options& o, int nproc, int local, int node_rank, int nnodes, const std::string& store_addr,
                     int port, int master_port, int restart, const std::string& run_id) {
  chorus::Environment place;
  place.launcher = chorus::Launcher::Chorusrun;
  place.rank = node_rank * nproc + local;
  place.local_rank = local;
  place.world_size = nnodes * nproc;
  place.local_world_size = nproc;
  place.node_rank = node_rank;
  place.num_nodes = nnodes;
  place.master_addr = store_addr;
  place.master_port = port;
  place.store_hosted = true;
  place.restart_count = restart;
  place.job_id = run_id;
  auto env = chorus::launcher_environment(place, o.max_restarts);
  for (auto& [name, value] : env)
    if (name == "MASTER_PORT") value = concat(master_port);  // Note [Two ports]
  for (auto& var : chorus::worker_thread_environment(nproc))
    env.push_back(var);  // Note [Threads of ranks that share the cores]
  return env;
}

int parse_nproc(const Options& o) {
  const int nproc = o.nproc == "auto" ? cores() : std::stoi(o.nproc);
  if (nproc < 1) throw chorus::InvalidArgument("--nproc-per-node must be >= 1 (or auto)");
  return nproc;
}

// SIGINT, SIGTERM and SIGHUP stop the workers first; SIGKILL takes them down through
// PR_SET_PDEATHSIG. A closed stdout (chorusrun ... | head) must not end the supervision.
// Returns a signalfd that becomes readable on those signals.
int catch_stop_signals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t stops;
  sigemptyset(&stops);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, s);
  sigprocmask(SIG_BLOCK, &stops, nullptr);
  return signalfd(-1, &stops, SFD_CLOEXEC);
}

int stopped_by_signal(int sigfd) {
  signalfd_siginfo info{};
  (void)!read(sigfd, &info, sizeof(info));
  say(concat("received ", chorus::signal_name(int(info.ssi_signo)), ": stopped the workers"));
  return 128 + int(info.ssi_signo);
}

// What chorusrun sets for the workers' threads and cores where the user did not say.
void warn_omp(int nproc) {
  std::string set;
  for (auto& [name, value] : chorus::worker_thread_environment(nproc))
    set += (set.empty() ? "" : " ") + name + "=" + value;
  if (!set.empty())
    say(concat("setting ", set, " for each of the ", nproc,
               " workers so that their threads do not crowd the cores; set them yourself to choose otherwise"));
  const std::string binding = chorus::describe_binding(nproc, "--bind-to none");
  if (!binding.empty()) say(binding);
}

// The workers of this node, `first` being the rank of local worker 0.
std::vector<chorus::WorkerSpec> worker_specs(const std::vector<std::string>& program, int nproc, int first,
                                             const std::function<WorkerEnv(int)>& env_of) {
  std::vector<chorus::WorkerSpec> specs;
  for (int local = 0; local < nproc; ++local)
    specs.push_back({first + local, program, env_of(local), chorus::worker_cpus(local, nproc)});
  return specs;
}

chorus::SupervisorOptions supervisor_options(const Options& o) {
  chorus::SupervisorOptions so;
  so.prefix = !o.no_prefix;
  so.log_dir = o.log_dir;
  so.grace = std::chrono::milliseconds(int64_t(o.stop_timeout * 1000));
  so.name = "chorusrun";
  return so;
}

// --rdzv-conf key=value,...: torchrun's keys that mean something here.
void apply_rdzv_conf(const std::string& conf, chorus::ElasticOptions& eo) {
  std::stringstream in(conf);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    double secs = 0;
    try {
      secs = std::stod(value);
    } catch (const std::exception&) {
      throw chorus::InvalidArgument(concat("--rdzv-conf: '", item, "' is not key=seconds"));
    }
    if (secs < 0) throw chorus::InvalidArgument(concat("--rdzv-conf: ", key, " must not be negative"));
    const auto ms = std::chrono::milliseconds(int64_t(secs * 1000));
    if (key == "join_timeout")
      eo.join_timeout = ms;
    else if (key == "last_call_timeout")
      eo.last_call = ms;
    else if (key == "heartbeat_timeout")
      eo.dead_after = ms;
    else if (key == "keep_alive_interval")
      eo.heartbeat = ms;
    else if (key != "read_timeout" && key != "close_timeout")
      throw chorus::InvalidArgument(concat("--rdzv-conf: unknown key '", key,
                                           "' (known: join_timeout, last_call_timeout, heartbeat_timeout, "
                                           "keep_alive_interval)"));
  }
}

// Note [Elastic chorusrun]: one agent per node; rounds are agreed by the agents themselves
// (Note [Elastic rendezvous]). In each round the workers get dense ranks (node rank * nproc +
// local rank), a store served for this round only by node 0's agent, and MASTER_ADDR/PORT
// there. A round ends when a worker fails (a restart, counted job-wide against --max-restarts),
// a node is lost, or nodes wait to join: workers that watch (chorus::elastic::nodes_waiting)
// leave at a step boundary, others are stopped at once, as torchrun does.
int run_elastic(const Options& o, const std::vector<std::string>& program) {
  const int nproc = parse_nproc(o);
  chorus::ElasticOptions eo;
  eo.run_id = o.run_id.empty() ? "none" : o.run_id;
  eo.min_nodes = o.min_nodes;
  eo.max_nodes = o.max_nodes;
  eo.nproc_per_node = nproc;
  eo.max_restarts = o.max_restarts;
  eo.endpoints = chorus::parse_endpoints(o.rdzv_endpoint.empty() ? o.master_addr : o.rdzv_endpoint, 29400);
  eo.local_addr = o.local_addr;
  if (const char* secret = std::getenv("CHORUS_RDZV_SECRET")) eo.secret = secret;
  apply_rdzv_conf(o.rdzv_conf, eo);
  if (!o.log_dir.empty()) mkdir(o.log_dir.c_str(), 0755);
  warn_omp(nproc);
  const int sigfd = catch_stop_signals();
  chorus::ElasticAgent agent(eo);
  const auto& me = agent.self();
  say(concat("node ", me.name(), ": elastic agent at ", me.addr, ":", me.port, ", run '", eo.run_id, "', ", o.min_nodes,
             " to ", o.max_nodes, " nodes of ", nproc, " worker(s)"));
  chorus::Supervisor supervisor(supervisor_options(o));
  using Cause = chorus::ElasticAgent::Cause;
  auto env_of = [&](const chorus::Round& round, int local) {
    const int node_rank = round.node_rank_of(me.id), nnodes = int(round.members.size());
    auto env = worker_env(o, nproc, local, node_rank, nnodes, round.members[0].addr, round.store_port,
                          round.program_port, int(round.number), eo.run_id);
    env.emplace_back("CHORUS_ELASTIC", "1");
    env.emplace_back("CHORUS_AGENT_ADDR", me.addr);
    env.emplace_back("CHORUS_AGENT_PORT", concat(me.port));
    return env;
  };
  chorus::Round round;
  auto next = [&](Cause cause) {
    try {
      round = agent.next_round(cause);
      return true;
    } catch (const chorus::ElasticError& e) {
      say(e.what());
      return false;
    }
  };
  if (!next(Cause::Start)) return 1;
  bool fresh = true;  // start new workers for the round (else tell the running ones their place)
  for (;;) {
    const int node_rank = round.node_rank_of(me.id), nnodes = int(round.members.size());
    std::string nodes;
    for (const auto& m : round.members) nodes += (nodes.empty() ? "" : ", ") + m.name();
    say(concat("round ", round.number, ": ", nnodes, " node(s) (", nodes, "); this is node ", node_rank, ", ranks ",
               node_rank * nproc, "-", node_rank * nproc + nproc - 1, " of ", nnodes * nproc,
               fresh ? "" : "; the workers go on in their processes"));
    if (fresh) {
      supervisor.start(
          worker_specs(program, nproc, node_rank * nproc, [&](int local) { return env_of(round, local); }));
    } else {
      for (int local = 0; local < nproc; ++local) agent.publish_worker_env(local, env_of(round, local));
    }
    std::string stop_reason;
    Cause cause = Cause::Failure;
    using chorus::WaitCheck;
    auto failure = supervisor.wait(sigfd, [&] {
      if (auto why = agent.check()) {
        stop_reason = *why;
        cause = stop_reason.rfind("a new round", 0) == 0 ? Cause::Membership : Cause::Failure;
        if (stop_reason.rfind("the job failed", 0) == 0) return WaitCheck::Stop;
        return agent.workers_in_process() ? WaitCheck::Return : WaitCheck::Stop;
      }
      if (agent.round_requested()) {
        stop_reason = "a worker's group failed";
        cause = Cause::Failure;
        return WaitCheck::Return;
      }
      if (agent.nodes_waiting() == 0) return WaitCheck::Continue;
      stop_reason = concat(agent.nodes_waiting(), " node(s) wait to join");
      cause = Cause::Membership;
      if (agent.workers_in_process()) return agent.reform_requested() ? WaitCheck::Return : WaitCheck::Continue;
      if (agent.workers_watch()) return WaitCheck::Continue;
      stop_reason += " and the workers do not watch for them";
      return WaitCheck::Stop;
    });
    if (!failure) {
      if (agent.reform_requested()) {
        say("the workers left for a new round (nodes are waiting to join)");
        if (!next(Cause::Membership)) return 1;
        fresh = true;
        continue;
      }
      agent.finish();
      return 0;
    }
    if (failure->rank == chorus::WorkerExit::kInterrupted) return stopped_by_signal(sigfd);
    if (failure->rank == chorus::WorkerExit::kPaused) {
      say(concat("forming a new round, the workers waiting in their processes: ", stop_reason));
      if (!next(cause)) return 1;
      fresh = false;
      continue;
    }
    if (failure->rank == chorus::WorkerExit::kStopped) {
      say(concat("stopped the workers: ", stop_reason));
      if (stop_reason.rfind("the job failed", 0) == 0) return 1;
    } else {
      say(supervisor.describe_failures() + "; the other workers were stopped");
      cause = Cause::Failure;
    }
    if (!next(cause)) return 1;
    fresh = true;
  }
}

int run(const Options& o, const std::vector<std::string>& program) {
  const int nproc = parse_nproc(o);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw chorus::InvalidArgument(concat("--node-rank ", o.node_rank, " is not in [0, ", o.nnodes, ")"));
  if (o.master_port == 0 && o.nnodes > 1)
    throw chorus::InvalidArgument(
        "--master-port 0 (any free port) works with one node only: the other nodes must "
        "know the port");
  if (!o.log_dir.empty()) mkdir(o.log_dir.c_str(), 0755);
  warn_omp(nproc);
  const int sigfd = catch_stop_signals();

  std::unique_ptr<chorus::TcpStoreServer> store;
  int port = o.master_port;
  if (o.node_rank == 0) {
    const char* secret = std::getenv("CHORUS_RDZV_SECRET");
    store = std::make_unique<chorus::TcpStoreServer>(o.master_addr, o.master_port, secret ? secret : "");
    port = store->port();
  }
  const std::string run_id = o.run_id.empty() ? concat("chorusrun-", o.master_addr, "-", port) : o.run_id;
  const int for_program = program_port(o, port);

  chorus::Supervisor supervisor(supervisor_options(o));
  for (int attempt = 0;; ++attempt) {
    supervisor.start(worker_specs(program, nproc, o.node_rank * nproc, [&](int local) {
      return worker_env(o, nproc, local, o.node_rank, o.nnodes, o.master_addr, port, for_program, attempt, run_id);
    }));
    auto failure = supervisor.wait(sigfd);
    if (!failure) return 0;
    if (failure->rank == chorus::WorkerExit::kInterrupted) return stopped_by_signal(sigfd);
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
  app.add_option("--nnodes", o.nnodes_arg,
                 "nodes in the job (same --nproc-per-node on each): N, or MIN:MAX for an elastic job")
      ->capture_default_str();
  app.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                 "static (fixed nodes, --node-rank), or c10d / chorus: elastic, the agents agree on the nodes")
      ->check(CLI::IsMember({"static", "c10d", "chorus"}))
      ->capture_default_str();
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                 "elastic: host[:port] of the agents that may serve the rendezvous, comma-separated (port "
                 "29400 when left out); list several so that none is needed once the job runs");
  app.add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf,
                 "elastic: join_timeout=600,last_call_timeout=3,heartbeat_timeout=2.5,keep_alive_interval=0.5 "
                 "(seconds)");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "elastic: the address this node's agent listens on (default: the one that reaches the endpoints)");
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
  app.add_option("--bind-to,--bind_to", o.bind_to,
                 "cores: each worker on CPUs of its own, when there are at least as many CPUs as workers (more "
                 "workers start spread over the CPUs, unbound); none: where the scheduler puts it (default: "
                 "CHORUS_BIND_TO, else cores)")
      ->check(CLI::IsMember({"cores", "core", "none"}));
  app.prefix_command();
  app.footer("The program and its arguments follow the options.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!o.bind_to.empty()) setenv("CHORUS_BIND_TO", o.bind_to.c_str(), 1);  // read by worker_cpus
  std::vector<std::string> program = app.remaining();
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  if (program.empty()) {
    std::fprintf(stderr, "chorusrun: no program given\n%s", app.help().c_str());
    return 2;
  }
  bool elastic = false;
  try {
    const size_t colon = o.nnodes_arg.find(':');
    size_t used = 0;
    if (colon == std::string::npos) {
      o.nnodes = o.min_nodes = o.max_nodes = std::stoi(o.nnodes_arg, &used);
      if (used != o.nnodes_arg.size()) throw std::invalid_argument("trailing");
    } else {
      o.min_nodes = std::stoi(o.nnodes_arg.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument("trailing");
      o.max_nodes = std::stoi(o.nnodes_arg.substr(colon + 1), &used);
      if (used != o.nnodes_arg.size() - colon - 1) throw std::invalid_argument("trailing");
      elastic = true;
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "chorusrun: --nnodes '%s' is not N or MIN:MAX\n", o.nnodes_arg.c_str());
    return 2;
  }
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes) {
    std::fprintf(stderr, "chorusrun: --nnodes %s: %s\n", o.nnodes_arg.c_str(),
                 o.min_nodes < 1 ? "the number of nodes must be at least 1" : "MIN must not exceed MAX");
    return 2;
  }
  elastic = elastic || o.rdzv_backend != "static" || !o.rdzv_endpoint.empty();
  if (elastic && o.standalone) {
    std::fprintf(stderr, "chorusrun: --standalone is one node; it cannot be elastic (--nnodes MIN:MAX, --rdzv-*)\n");
    return 2;
  }
  if (elastic) try {
      return run_elastic(o, program);
    } catch (const std::exception& e) {
      say(e.what());
      return 1;
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
