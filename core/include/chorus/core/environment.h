// Who am I and where is the rendezvous store: read from whatever launched this process.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/settings.h"

namespace chorus {

enum class Launcher {
  Single,     // nothing launched us: one process
  Chorusrun,  // chorusrun (CHORUS_LAUNCHER=chorusrun); it hosts the store
  Torchrun,   // torchrun / torch.distributed.run (TORCHELASTIC_RUN_ID)
  Env,        // plain RANK WORLD_SIZE MASTER_ADDR MASTER_PORT, like torch's env://
  Slurm,      // srun
  OpenMpi,    // mpirun from Open MPI
  Pmi,        // MPICH / Hydra / PMI
};
std::string_view to_string(Launcher launcher);

struct Environment {
  Launcher launcher = Launcher::Single;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: none given
  // The store at master_addr:master_port already runs (a launcher hosts it); otherwise rank 0
  // hosts it there.
  bool store_hosted = false;
  // torchrun's own store owns MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True) and speaks torch's
  // protocol: chorus must not bind or talk there.
  bool master_port_taken_by_torchrun = false;
  std::string job_id;
  // Which attempt of a restarted job this is (TORCHELASTIC_RESTART_COUNT / CHORUS_RESTART_COUNT);
  // each attempt rendezvouses under its own keys.
  int restart_count = 0;

  // Reads the variables of every supported launcher, most specific first: RANK/WORLD_SIZE
  // (chorusrun, torchrun, env://), Open MPI, PMI, SLURM, else a single process.
  // Throws InvalidArgument naming an inconsistent or malformed variable.
  static Environment detect(const EnvMap& env);
  static Environment detect();
};

// Rank `rank` of `world_size` processes on this one machine, meeting on a store a launcher
// hosts at 127.0.0.1:store_port (what chorusrun, Fabric::launch and chorus-bench start).
Environment single_node(int rank, int world_size, int store_port, std::string job_id);

// SLURM host lists: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
// Throws InvalidArgument on unbalanced brackets or bad ranges.
std::vector<std::string> expand_slurm_nodelist(std::string_view nodelist);

}  // namespace chorus
