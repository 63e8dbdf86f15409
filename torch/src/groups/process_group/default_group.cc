// The default group: the process's world ProcessGroup, made once by init_process_group (from the
// environment a launcher set, or one given), shared by everything that is not handed a group.
#include <mutex>

#include "chorus/core/rendezvous.h"
#include "chorus/process_group.h"

namespace chorus {

namespace {
std::mutex g_mu;
std::shared_ptr<ProcessGroup> g_default;
Environment g_env;
}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(const Environment& env, InitOptions options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_default) return g_default;
  auto store = connect_store(env);
  CommunicatorOptions co;
  co.backend = options.backend;
  co.timeout = options.timeout;
  co.name = "world";
  auto comm = Communicator::create(store, env.rank, env.world_size, co);
  std::vector<int> ranks(size_t(env.world_size));
  for (int r = 0; r < env.world_size; ++r) ranks[size_t(r)] = r;
  g_env = env;
  g_default = std::make_shared<ProcessGroup>(comm, ranks);
  return g_default;
}

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_default) return g_default;
  }
  return init_process_group(Environment::detect(), options);
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_default)
    throw Error(
        "chorus: the default process group is not initialized: call chorus::init_process_group() "
        "(or Fabric::launch()) first");
  return g_default;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_default != nullptr;
}

Environment environment() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_default ? g_env : Environment();
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    group = std::move(g_default);
    g_env = Environment();
  }
  // Held nowhere else: leave in order, raising what the last call left unchecked. A group still
  // held stays usable, and its communicator's destructor does the same later (logging instead).
  if (group && group.use_count() == 1) group->communicator().shutdown();
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) { return default_group()->split(ranks); }

ProcessGroup& group_or_default(const std::shared_ptr<ProcessGroup>& group) {
  if (group) return *group;
  return *default_group();
}

}  // namespace chorus
