#include "chorus/core/settings.h"

#include <charconv>

#include "chorus/core/error.h"
#include "net/cost_model.h"

extern char** environ;

namespace chorus {

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::optional<long long> env_int(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  long long value = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size())
    throw InvalidArgument(detail::concat("environment variable ", name, "='", s, "' is not an integer"));
  return value;
}

Settings read_settings(const EnvMap& env) {
  Settings s;
  if (auto v = env_int(env, "CHORUS_TIMEOUT_MS")) {
    if (*v <= 0) throw InvalidArgument("CHORUS_TIMEOUT_MS must be a positive number of milliseconds");
    s.timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = env_int(env, "CHORUS_STORE_TIMEOUT_MS")) {
    if (*v <= 0) throw InvalidArgument("CHORUS_STORE_TIMEOUT_MS must be a positive number of milliseconds");
    s.store_timeout = std::chrono::milliseconds(*v);
  }
  if (auto it = env.find("CHORUS_BACKEND"); it != env.end() && !it->second.empty()) s.backend = it->second;
  if (auto v = env_int(env, "CHORUS_SHM_CHUNK_BYTES")) {
    if (*v < 64) throw InvalidArgument("CHORUS_SHM_CHUNK_BYTES must be at least 64");
    s.shm.chunk_bytes = size_t(*v);
  }
  if (auto v = env_int(env, "CHORUS_SHM_SPIN_US")) {
    if (*v < 0) throw InvalidArgument("CHORUS_SHM_SPIN_US must be >= 0");
    s.shm_spin_us = int(*v);
  }
  if (auto v = env_int(env, "CHORUS_SHM_SINGLE_COPY")) {
    if (*v != 0 && *v != 1) throw InvalidArgument("CHORUS_SHM_SINGLE_COPY must be 0 or 1");
    s.shm.single_copy = *v == 1;
  }
  if (auto v = env_int(env, "CHORUS_SHM_STREAM_SLOTS")) {
    if (*v != 0 && *v != 1) throw InvalidArgument("CHORUS_SHM_STREAM_SLOTS must be 0 or 1");
    s.shm.stream_slots = *v == 1;
  }
  if (auto v = env_int(env, "CHORUS_SHM_STAGE_BYTES")) {
    if (*v < 0) throw InvalidArgument("CHORUS_SHM_STAGE_BYTES must be >= 0 (0: broadcasts stage nothing)");
    s.shm.stage_bytes = size_t(*v);
  }
  if (auto it = env.find("CHORUS_CROSS_ALGORITHM"); it != env.end()) {
    s.cross.algorithm = it->second;
    net::parse_forced(it->second, "CHORUS_CROSS_ALGORITHM");  // names checked here
  }
  if (auto it = env.find("CHORUS_CROSS_COST"); it != env.end()) {
    s.cross.cost = it->second;
    net::parse_cost(it->second);
  }
  if (auto v = env_int(env, "CHORUS_LOG_LEVEL")) s.log_level = int(*v);
  if (auto v = env_int(env, "CHORUS_RECV_CACHE_MB")) {
    if (*v < 0) throw InvalidArgument("CHORUS_RECV_CACHE_MB must be >= 0 (0 turns the cache off)");
    s.recv_cache_bytes = size_t(*v) << 20;
  }
  return s;
}

const Settings& settings() {
  static const Settings s = read_settings(current_environment());
  return s;
}

}  // namespace chorus
