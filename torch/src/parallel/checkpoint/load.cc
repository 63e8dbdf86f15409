// load_checkpoint: every rank reads the description (meta.cc), checks that it fits the state it is
// given, verifies the checksums of a share of the pieces (piece k by rank k mod W), then reads the
// elements it holds from whichever pieces cover them: its shard's range for a sharded module, whole
// tensors otherwise (Note [Checkpoint layout] in catalog.cc). Each of these steps ends with the
// ranks agreeing (files.h): an error on any rank is an error on every rank, raised before anything
// is overwritten when it is about the checkpoint itself.
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <iostream>
#include <map>

#include "groups/agreement.h"
#include "groups/tensor_util.h"
#include "parallel/checkpoint/catalog.h"
#include "parallel/checkpoint/files.h"
#include "parallel/checkpoint/meta.h"

namespace chorus {

namespace fs = std::filesystem;
using detail::concat;
using namespace detail::checkpoint;

namespace {

class Reader {
 public:
  Reader(const std::string& path, const Meta& meta) : path_(path), meta_(meta) {}

  std::string file_name(int64_t k) const {
    return meta_.full ? path_ : (fs::path(path_) / meta_.files[size_t(k)]).string();
  }
  const File& file(int64_t k) {
    auto it = files_.find(k);
    if (it != files_.end()) return it->second;
    try {
      return files_.emplace(k, File::open(file_name(k))).first->second;
    } catch (const InvalidArgument& e) {
      if (meta_.full) throw;
      throw InvalidArgument(concat(e.what(), " (rank ", k, "'s part of checkpoint '", path_, "', written by ",
                                   meta_.world_size, " ranks)"));
    }
  }

  // Elements [begin, end) of tensor t into dst (contiguous, t's dtype).
  void read(const SavedTensor& t, int64_t begin, int64_t end, void* dst) {
    const int64_t es = int64_t(c10::elementSize(t.dtype));
    char* out = static_cast<char*>(dst);
    int64_t covered = 0;
    for (const Piece& p : t.pieces) {
      const int64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
      if (e <= b) continue;
      file(p.file).read_at(out + (b - begin) * es, size_t((e - b) * es), p.offset + (b - p.begin) * es);
      covered += e - b;
    }
    if (covered != end - begin)
      throw InvalidArgument(concat("checkpoint: '", path_, "' does not hold all of '", t.key, "' (elements [", begin,
                                   ", ", end, ") asked, ", covered, " found)"));
  }

  at::Tensor read_whole(const SavedTensor& t) {
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
    read(t, 0, t.numel, out.data_ptr());
    return out;
  }

  // This rank's share of the checks: file sizes, then every k-th piece's checksum.
  void verify(int rank, int world) {
    const int64_t nfiles = int64_t(meta_.files.size());
    std::vector<int64_t> need(size_t(nfiles), 0);
    for (const auto& t : meta_.tensors)
      for (const auto& p : t.pieces)
        need[size_t(p.file)] =
            std::max(need[size_t(p.file)], p.offset + (p.end - p.begin) * int64_t(c10::elementSize(t.dtype)));
    for (int64_t k = rank; k < nfiles; k += world) {
      const int64_t size = file(k).size();
      if (size < need[size_t(k)])
        throw InvalidArgument(concat("checkpoint: file '", file_name(k), "' is truncated: ", size,
                                     " bytes, the checkpoint wrote at least ", need[size_t(k)]));
    }
    int64_t k = 0;
    for (const auto& t : meta_.tensors)
      for (const auto& p : t.pieces) {
        if (k++ % world != rank) continue;
        const int64_t n = (p.end - p.begin) * int64_t(c10::elementSize(t.dtype));
        if (checksum(file(p.file), p.offset, n) != p.hash)
          throw InvalidArgument(concat("checkpoint: file '", file_name(p.file), "' is corrupt: the bytes of '", t.key,
                                       "' (elements [", p.begin, ", ", p.end, ")) do not match their checksum"));
      }
  }

 private:
  std::string path_;
  const Meta& meta_;
  std::map<int64_t, File> files_;
};

std::string kind_family(const std::string& kind) { return kind.substr(0, kind.find(':')); }

std::string items_of(const Meta& m) {
  std::string s;
  for (const auto& [name, kind] : m.items) s += concat(s.empty() ? "" : ", ", name, " (", kind, ")");
  return s;
}

// Which of the catalog's slots to fill, by their index in the checkpoint (-1: skipped); throws
// InvalidArgument for a checkpoint that does not fit the state.
std::vector<int64_t> match(const std::string& path, const Meta& meta, const CheckpointState& state, LoadCatalog& lc,
                           const std::map<std::string, int64_t>& saved, bool strict) {
  for (const auto& [name, item] : state) {
    auto it = std::find_if(meta.items.begin(), meta.items.end(), [&](const auto& x) { return x.first == name; });
    const std::string want = item.kind() == Stateful::Kind::Module      ? "module"
                             : item.kind() == Stateful::Kind::Optimizer ? "optimizer"
                                                                        : "value";
    if (it == meta.items.end()) {
      if (strict || item.kind() != Stateful::Kind::Module)
        throw InvalidArgument(
            concat("checkpoint: '", path, "' has no item '", name, "' (it holds: ", items_of(meta), ")"));
      continue;
    }
    if (kind_family(it->second) != want)
      throw InvalidArgument(concat("checkpoint: '", path, "' holds '", name, "' as a ", it->second, ", not a ", want));
  }
  std::vector<int64_t> use;
  std::map<std::string, bool> wanted;
  for (const Slot& s : lc.catalog().slots) {
    wanted[s.key] = true;
    auto it = saved.find(s.key);
    if (it == saved.end()) {
      if (strict)
        throw InvalidArgument(concat("checkpoint: '", path, "' has no '", s.key, "': saved from another model? (",
                                     "load with strict = false to load what matches)"));
      use.push_back(-1);
      continue;
    }
    const SavedTensor& t = meta.tensors[size_t(it->second)];
    if (t.shape != s.shape || (s.local.defined() && t.dtype != s.dtype))
      throw InvalidArgument(concat("checkpoint: '", s.key, "' is ", c10::toString(t.dtype),
                                   detail::shape_string(t.shape), " in '", path, "' but ", c10::toString(s.dtype),
                                   detail::shape_string(s.shape), " here: saved from another model?"));
    use.push_back(it->second);
  }
  if (strict)
    for (const auto& [name, item] : state) {
      if (item.kind() != Stateful::Kind::Module) continue;
      for (const auto& t : meta.tensors)
        if (t.key.rfind(keys::item_prefix(name), 0) == 0 && !wanted.count(t.key))
          throw InvalidArgument(concat("checkpoint: '", path, "' holds '", t.key, "', which this '", name,
                                       "' does not have (load with strict = false to leave it out)"));
    }
  if (std::string p = lc.problem(meta.objects); !p.empty())
    throw InvalidArgument(concat("checkpoint: '", path, "' ", p));
  return use;
}

void restore_rng(const Meta& meta, ProcessGroup& group) {
  if (meta.world_size != group.size() || meta.rng.size() != size_t(group.size())) {
    if (group.rank() == 0)
      std::cerr << "chorus: load_checkpoint: the RNG states of the " << meta.world_size
                << " ranks that saved are not restored on " << group.size() << " ranks" << std::endl;
    return;
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  // A copy: the saved states share one storage, and torch 2.13's set_state reads a state with a
  // storage offset at offset x sizeof(state), past its end.
  gen.set_state(meta.rng[size_t(group.rank())].clone());
}

}  // namespace

c10::impl::GenericDict load_checkpoint(const std::string& path, const CheckpointState& state, LoadOptions options) {
  std::shared_ptr<ProcessGroup> group = options.group ? options.group : default_group();
  const int world = group->size(), rank = group->rank();
  Meta meta;
  detail::fail_together(group->communicator(), [&] { meta = read_meta(path); });
  std::map<std::string, int64_t> saved;
  std::map<std::string, at::ScalarType> dtypes;
  for (size_t i = 0; i < meta.tensors.size(); ++i) {
    saved[meta.tensors[i].key] = int64_t(i);
    dtypes[meta.tensors[i].key] = meta.tensors[i].dtype;
  }
  std::unique_ptr<LoadCatalog> lc;
  std::vector<int64_t> use;
  Reader reader(path, meta);
  detail::fail_together(group->communicator(), [&] {
    lc = std::make_unique<LoadCatalog>(state, dtypes);
    use = match(path, meta, state, *lc, saved, options.strict);
  });
  detail::fail_together(group->communicator(), [&] { reader.verify(rank, world); });
  c10::impl::GenericDict rest(c10::StringType::get(), c10::AnyType::get());
  detail::fail_together(group->communicator(), [&] {
    std::map<std::string, at::Tensor> loaded;
    const auto& slots = lc->catalog().slots;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (use[i] < 0) continue;
      const Slot& s = slots[i];
      const SavedTensor& t = meta.tensors[size_t(use[i])];
      const bool sharded = s.layout == Layout::Sharded;
      auto [begin, end] = sharded ? part_of(s, rank, world) : std::make_pair(int64_t(0), s.numel);
      at::Tensor dst = s.local;
      if (!dst.defined()) {
        dst = sharded ? at::zeros({s.shard_numel}, at::TensorOptions().dtype(t.dtype))
                      : at::empty(s.shape, at::TensorOptions().dtype(t.dtype));
        loaded[s.key] = dst;
      }
      at::Tensor buf = dst.is_contiguous() ? dst : at::empty(dst.sizes(), dst.options());
      reader.read(t, begin, end, buf.data_ptr());
      if (sharded && end - begin < buf.numel())
        buf.reshape({-1}).narrow(0, end - begin, buf.numel() - (end - begin)).zero_();
      if (!buf.is_same(dst)) dst.copy_(buf);
    }
    lc->finish(meta.objects, loaded);
    restore_rng(meta, *group);
    std::vector<std::string> others;
    for (const auto& [name, kind] : meta.items)
      if (std::none_of(state.begin(), state.end(), [&](const auto& x) { return x.first == name; }))
        others.push_back(name);
    rest = nested(meta, others, [&](size_t i) { return reader.read_whole(meta.tensors[i]); });
  });
  return rest;
}

std::string describe_checkpoint(const std::string& path) {
  Meta m = read_meta(path);
  std::string s = concat(m.full ? "full" : "sharded", " checkpoint '", path, "' written by chorus ", m.chorus_version,
                         " on ", m.world_size, " rank(s)\n");
  for (const auto& [name, kind] : m.items) s += concat("  ", name, ": ", kind, "\n");
  for (const auto& t : m.tensors)
    s += concat("    ", t.key, " ", c10::toString(t.dtype), detail::shape_string(t.shape), " in ", t.pieces.size(),
                " piece(s)\n");
  return s;
}

}  // namespace chorus
