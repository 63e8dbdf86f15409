#include "chorus/core/environment.h"

#include <cstdlib>

#include "chorus/core/error.h"

namespace chorus {

std::string_view to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::Single: return "single process";
    case Launcher::Chorusrun: return "chorusrun";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Env: return "environment variables";
    case Launcher::Slurm: return "SLURM";
    case Launcher::OpenMpi: return "Open MPI";
    case Launcher::Pmi: return "PMI";
  }
  return "?";
}

namespace {

std::string get(const EnvMap& env, const std::string& name, const std::string& fallback = "") {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

int get_int(const EnvMap& env, const std::string& name, int fallback) {
  auto v = env_int(env, name);
  return v ? int(*v) : fallback;
}

int require_int(const EnvMap& env, const std::string& name, const char* launcher) {
  auto v = env_int(env, name);
  if (!v) throw InvalidArgument(detail::concat(launcher, " environment is missing ", name));
  return int(*v);
}

// A port derived from a job id, so all ranks of one job agree without talking.
int port_from_job_id(const std::string& job_id) {
  if (job_id.empty()) return 29500;
  std::string digits;
  for (char c : job_id)
    if (c >= '0' && c <= '9') digits += c;
  if (digits.size() >= 4) return 15000 + std::atoi(digits.substr(digits.size() - 4).c_str());
  if (!digits.empty()) return 15000 + std::atoi(digits.c_str());
  unsigned h = 2166136261u;
  for (char c : job_id) h = (h ^ uint8_t(c)) * 16777619u;
  return 15000 + int(h % 10000);
}

// "2(x3),1" -> tasks per node for node 0.. ; returns the count of node `node`.
int slurm_tasks_on_node(const std::string& spec, int node, int fallback) {
  if (spec.empty()) return fallback;
  int seen = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int count = std::atoi(item.c_str());
    int repeat = 1;
    if (auto x = item.find("(x"); x != std::string::npos) repeat = std::atoi(item.c_str() + x + 2);
    if (node < seen + repeat) return count;
    seen += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return fallback;
}

void check(const Environment& e, const char* source) {
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
    throw InvalidArgument(detail::concat(source, ": rank ", e.rank, " is not in [0, world size ", e.world_size, ")"));
  if (e.local_world_size < 1 || e.local_rank < 0 || e.local_rank >= e.local_world_size)
    throw InvalidArgument(detail::concat(source, ": local rank ", e.local_rank, " is not in [0, local world size ",
                                         e.local_world_size, ")"));
  if (e.master_port < 0 || e.master_port > 65535)
    throw InvalidArgument(detail::concat(source, ": port ", e.master_port, " is out of range"));
}

// The variables of an MPI launcher that says each rank's place itself (no store of its own).
struct MpiLauncher {
  Launcher launcher;
  const char* name;  // in messages
  const char *rank, *size, *local_rank, *local_size;
  const char *job_id, *job_id_fallback;  // the job's id, for a port all its ranks agree on
  bool local_defaults_to_world;          // without local variables: one host (PMI) or one rank per host
};
constexpr MpiLauncher kOpenMpi{Launcher::OpenMpi,
                               "Open MPI",
                               "OMPI_COMM_WORLD_RANK",
                               "OMPI_COMM_WORLD_SIZE",
                               "OMPI_COMM_WORLD_LOCAL_RANK",
                               "OMPI_COMM_WORLD_LOCAL_SIZE",
                               "OMPI_MCA_ess_base_jobid",
                               "PMIX_NAMESPACE",
                               false};
constexpr MpiLauncher kPmi{Launcher::Pmi,     "PMI",       "PMI_RANK",    "PMI_SIZE", "MPI_LOCALRANKID",
                           "MPI_LOCALNRANKS", "PMI_JOBID", "PMI_KVSNAME", true};

void from_mpi_launcher(Environment& e, const EnvMap& env, const MpiLauncher& l) {
  e.launcher = l.launcher;
  e.rank = require_int(env, l.rank, l.name);
  e.world_size = require_int(env, l.size, l.name);
  e.local_rank = get_int(env, l.local_rank, l.local_defaults_to_world ? e.rank : 0);
  e.local_world_size = get_int(env, l.local_size, l.local_defaults_to_world ? e.world_size : 1);
  e.num_nodes = std::max(1, e.world_size / std::max(1, e.local_world_size));
  e.node_rank = (e.rank - e.local_rank) / std::max(1, e.local_world_size);
  e.job_id = get(env, l.job_id, get(env, l.job_id_fallback));
  e.master_addr = get(env, "MASTER_ADDR", "127.0.0.1");
  e.master_port = get_int(env, "MASTER_PORT", port_from_job_id(e.job_id));
  check(e, (std::string(l.name) + " environment").c_str());
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  size_t i = 0;
  while (i < list.size()) {
    // One entry: prefix[ranges]suffix... up to a comma outside brackets.
    size_t start = i;
    int depth = 0;
    while (i < list.size() && (depth > 0 || list[i] != ',')) {
      if (list[i] == '[') ++depth;
      if (list[i] == ']' && --depth < 0) break;
      ++i;
    }
    if (depth != 0) throw InvalidArgument(detail::concat("SLURM node list '", list, "' has unbalanced brackets"));
    std::string_view entry = list.substr(start, i - start);
    ++i;  // skip the comma
    if (entry.empty()) continue;
    auto open = entry.find('[');
    if (open == std::string_view::npos) {
      hosts.emplace_back(entry);
      continue;
    }
    auto close = entry.find(']', open);
    std::string prefix(entry.substr(0, open));
    std::string suffix(entry.substr(close + 1));
    std::string_view ranges = entry.substr(open + 1, close - open - 1);
    size_t r = 0;
    while (r <= ranges.size()) {
      size_t comma = ranges.find(',', r);
      std::string_view range = ranges.substr(r, comma == std::string_view::npos ? std::string_view::npos : comma - r);
      auto dash = range.find('-');
      std::string lo(range.substr(0, dash)), hi(dash == std::string_view::npos ? lo : range.substr(dash + 1));
      if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
          hi.find_first_not_of("0123456789") != std::string::npos || std::stol(hi) < std::stol(lo))
        throw InvalidArgument(detail::concat("SLURM node list '", list, "' has a bad range '", range, "'"));
      for (long n = std::stol(lo); n <= std::stol(hi); ++n) {
        std::string num = std::to_string(n);
        if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');  // keep zero padding
        hosts.push_back(prefix + num + suffix);
      }
      if (comma == std::string_view::npos) break;
      r = comma + 1;
    }
  }
  return hosts;
}

Environment Environment::detect(const EnvMap& env) {
  Environment e;
  if (env.count("RANK") != env.count("WORLD_SIZE"))
    throw InvalidArgument(env.count("RANK") ? "RANK is set but WORLD_SIZE is not: set both, or neither"
                                            : "WORLD_SIZE is set but RANK is not: set both, or neither");
  if (env.count("RANK") && env.count("WORLD_SIZE")) {
    const bool torchrun = env.count("TORCHELASTIC_RUN_ID") > 0;
    const bool chorusrun = get(env, "CHORUS_LAUNCHER") == "chorusrun";
    e.launcher = chorusrun ? Launcher::Chorusrun : torchrun ? Launcher::Torchrun : Launcher::Env;
    e.rank = require_int(env, "RANK", "torchrun-style");
    e.world_size = require_int(env, "WORLD_SIZE", "torchrun-style");
    e.local_rank = get_int(env, "LOCAL_RANK", e.launcher == Launcher::Env ? e.rank : 0);
    e.local_world_size = get_int(env, "LOCAL_WORLD_SIZE", e.launcher == Launcher::Env ? e.world_size : 1);
    e.node_rank = get_int(env, "GROUP_RANK", get_int(env, "NODE_RANK", 0));
    e.num_nodes = std::max(1, e.world_size / std::max(1, e.local_world_size));
    e.master_addr = get(env, "MASTER_ADDR", "127.0.0.1");
    e.master_port = get_int(env, "MASTER_PORT", 0);
    e.job_id = get(env, "TORCHELASTIC_RUN_ID", get(env, "CHORUS_RUN_ID"));
    e.restart_count = get_int(env, "CHORUS_RESTART_COUNT", get_int(env, "TORCHELASTIC_RESTART_COUNT", 0));
    if (chorusrun) {
      e.master_addr = get(env, "CHORUS_STORE_ADDR", e.master_addr);
      e.master_port = get_int(env, "CHORUS_STORE_PORT", e.master_port);
      e.store_hosted = true;
    }
    if (torchrun) e.master_port_taken_by_torchrun = get(env, "TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (e.launcher == Launcher::Env && e.master_port == 0 && e.world_size > 1)
      throw InvalidArgument("RANK and WORLD_SIZE are set but MASTER_PORT is not: set MASTER_ADDR and MASTER_PORT");
    check(e, "RANK/WORLD_SIZE environment");
  } else if (env.count("OMPI_COMM_WORLD_RANK")) {
    from_mpi_launcher(e, env, kOpenMpi);
  } else if (env.count("PMI_RANK")) {
    from_mpi_launcher(e, env, kPmi);
  } else if (env.count("SLURM_PROCID") && env.count("SLURM_NTASKS")) {
    e.launcher = Launcher::Slurm;
    e.rank = require_int(env, "SLURM_PROCID", "SLURM");
    e.world_size = require_int(env, "SLURM_NTASKS", "SLURM");
    e.local_rank = get_int(env, "SLURM_LOCALID", 0);
    e.node_rank = get_int(env, "SLURM_NODEID", 0);
    e.num_nodes = get_int(env, "SLURM_NNODES", get_int(env, "SLURM_JOB_NUM_NODES", 1));
    e.local_world_size = slurm_tasks_on_node(get(env, "SLURM_TASKS_PER_NODE", get(env, "SLURM_NTASKS_PER_NODE")),
                                             e.node_rank, std::max(1, e.world_size / std::max(1, e.num_nodes)));
    e.job_id = get(env, "SLURM_JOB_ID", get(env, "SLURM_JOBID"));
    std::string nodelist = get(env, "SLURM_NODELIST", get(env, "SLURM_JOB_NODELIST"));
    auto hosts = expand_slurm_nodelist(nodelist);
    e.master_addr = get(env, "MASTER_ADDR", hosts.empty() ? "127.0.0.1" : hosts.front());
    e.master_port = get_int(env, "MASTER_PORT", port_from_job_id(e.job_id));
    check(e, "SLURM environment");
  }
  return e;
}

Environment Environment::detect() { return detect(current_environment()); }

Environment single_node(int rank, int world_size, int store_port, std::string job_id) {
  Environment e;
  e.launcher = Launcher::Chorusrun;
  e.rank = e.local_rank = rank;
  e.world_size = e.local_world_size = world_size;
  e.master_port = store_port;
  e.store_hosted = true;
  e.job_id = std::move(job_id);
  return e;
}

}  // namespace chorus
