// The backend table (Note [Backend table]) and what every backend gets by default.
#include <cstring>

#include "backend.h"
#include "chorus/core/error.h"
#include "engine/engine.h"

namespace chorus {

const std::vector<BackendRow>& backend_table() {
  static const std::vector<BackendRow> rows = {
    {"shm", false, make_shm_backend},
    {"tcp", true,
     [](Store& store, int rank, int size, const BackendOptions& o) {
       return make_engine_backend(make_tcp_engine(store, rank, size, o.cross, left_until(o.deadline)), store, rank,
                                  size, o);
     }},
#if CHORUS_HAVE_GLOO
    {"gloo", true,
     [](Store& store, int rank, int size, const BackendOptions& o) {
       return make_engine_backend(make_gloo_engine(store, rank, size, left_until(o.deadline)), store, rank, size, o);
     }},
#endif
#if CHORUS_HAVE_MPI
    {"mpi", true,
     [](Store& store, int rank, int size, const BackendOptions& o) {
       return make_engine_backend(make_mpi_engine(store, rank, size, o.group_name, left_until(o.deadline)), store, rank,
                                  size, o);
     }},
#endif
  };
  return rows;
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"auto"};
  for (const auto& row : backend_table()) names.push_back(row.name);
  return names;
}

void check_backend_name(const std::string& name, const std::string& group) {
  std::string list;
  for (const auto& known : available_backends()) {
    if (known == name) return;
    list += (list.empty() ? "" : ", ") + known;
  }
  throw InvalidArgument(
      detail::concat("group '", group, "': unknown backend '", name, "' (this build has: ", list, ")"));
}

const BackendRow& choose_backend(const std::string& name, const std::string& elsewhere, const std::string& group) {
  check_backend_name(name, group);
  for (const auto& row : backend_table()) {
    const bool serves = elsewhere.empty() || row.crosses_hosts;
    if (serves && (name == row.name || name == "auto")) return row;
    if (name == row.name) {
      std::string cross;
      for (const auto& other : backend_table())
        if (other.crosses_hosts) cross += (cross.empty() ? "" : " and ") + std::string(other.name);
      throw InvalidArgument(detail::concat("group '", group, "': backend '", name,
                                           "' needs every rank on this host, but ranks ", elsewhere,
                                           " are elsewhere; the cross-host backends are ", cross));
    }
  }
  throw InvalidArgument(detail::concat("group '", group, "': ranks ", elsewhere,
                                       " are on other hosts, and this build has no cross-host backend "
                                       "(install libgloo-dev or libopenmpi-dev and rebuild)"));
}

SymmetricMemory private_memory(size_t bytes) {
  if (bytes == 0) return {};
  constexpr std::align_val_t kAlign{64};
  std::shared_ptr<void> owner(::operator new(bytes, kAlign), [kAlign](void* p) { ::operator delete(p, kAlign); });
  std::memset(owner.get(), 0, bytes);
  return SymmetricMemory(owner, owner.get(), bytes);
}

SymmetricMemory Backend::alloc_symmetric(const Call& call) {
  Call compare = call;
  compare.compare_only = true;
  run(compare);
  return private_memory(size_t(call.count));
}

}  // namespace chorus
