// save_checkpoint: the full and the sharded format (Note [Checkpoint layout] in catalog.cc, Note
// [Checkpoint files] in files.cc, Note [Checkpoint metadata] in meta.cc).
//   Sharded: every rank writes the parts it holds (catalog.h's part_of) into its own new data file,
//   at offsets every rank computes alike, hashing each part as it goes, and fsyncs; the ranks
//   agree that all writes succeeded, then rank 0 writes the metadata (with every part's checksum)
//   by an atomic rename and removes the data files no metadata names any more.
//   Full: rank 0 writes a zip in torch.save's layout, tensor by tensor; a sharded tensor is
//   gathered onto rank 0 just before it is written and dropped after, so rank 0 holds its shards
//   and one parameter more. The zip is written under a temporary name and renamed.
// Every rank writes or fails together: a failure anywhere is an error on every rank
// (fail_together, Note [Agreement] in agreement.cc), and the checkpoint that was at the path
// stays as it was.
#include <ATen/CPUGeneratorImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <unordered_map>

#include "groups/agreement.h"
#include "groups/tensor_util.h"
#include "parallel/checkpoint/catalog.h"
#include "parallel/checkpoint/files.h"
#include "parallel/checkpoint/meta.h"

#ifndef CHORUS_VERSION
#define CHORUS_VERSION "unknown"
#endif

namespace chorus {

namespace fs = std::filesystem;
using detail::concat;
using namespace detail::checkpoint;

namespace {

constexpr int64_t kAlign = 4096;

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

at::Tensor rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Every rank's RNG state, on rank 0.
std::vector<at::Tensor> gather_rng(ProcessGroup& group) {
  std::vector<at::Tensor> all = group.all_gather_v(rng_state());
  return group.rank() == 0 ? all : std::vector<at::Tensor>{};
}

Meta describe(const Catalog& c, ProcessGroup& group, bool full) {
  Meta m;
  m.full = full;
  m.chorus_version = CHORUS_VERSION;
  m.world_size = group.size();
  m.items = c.items;
  m.objects = c.objects;
  for (const auto& s : c.slots) m.tensors.push_back(SavedTensor{s.key, s.dtype, s.shape, s.numel, {}});
  return m;
}

std::string save_id(ProcessGroup& group) {
  std::string mine;
  if (group.rank() == 0) {
    std::random_device rd;
    mine = concat(std::hex, rd(), rd());
  }
  return detail::all_gather_strings(group.communicator(), mine)[0];
}

// The part of slot s that this rank writes: contiguous bytes starting at element `begin`.
const char* part_bytes(const Slot& s, at::Tensor& keep, int64_t begin) {
  keep = s.local.contiguous();
  const int64_t first = s.layout == Layout::Sharded ? begin : 0;  // a shard's element 0 is its range's first
  return static_cast<const char*>(keep.data_ptr()) + (begin - first) * int64_t(c10::elementSize(s.dtype));
}

void check_slots(const Catalog& c, int world) {
  for (const auto& s : c.slots) {
    const int64_t want = s.layout == Layout::Sharded ? s.shard_numel : s.numel;
    if (s.local.numel() != want || s.local.scalar_type() != s.dtype || !s.local.device().is_cpu())
      throw InvalidArgument(concat("save_checkpoint: '", s.key, "' holds ", s.local.numel(), " ",
                                   c10::toString(s.local.scalar_type()), " elements on ", s.local.device().str(),
                                   "; expected ", want, " on the CPU (world size ", world, ")"));
  }
}

void save_sharded(const std::string& path, const Catalog& c, ProcessGroup& group) {
  const int world = group.size(), rank = group.rank();
  const std::string id = save_id(group);
  Meta meta = describe(c, group, false);
  for (int q = 0; q < world; ++q) meta.files.push_back(concat("data-", id, "-", q, "-of-", world, ".bin"));
  // Offsets: the same rule on every rank.
  std::vector<int64_t> next(size_t(world), 0);
  for (size_t i = 0; i < c.slots.size(); ++i) {
    const size_t es = c10::elementSize(c.slots[i].dtype);
    for (int q = 0; q < world; ++q) {
      auto [b, e] = part_of(c.slots[i], q, world);
      if (e <= b) continue;
      meta.tensors[i].pieces.push_back(Piece{q, b, e, next[size_t(q)], 0});
      next[size_t(q)] += aligned((e - b) * int64_t(es));
    }
  }
  const std::string mine = (fs::path(path) / meta.files[size_t(rank)]).string();
  std::string hashes;
  try {
    detail::fail_together(group.communicator(), [&] {
      fs::create_directories(path);
      File f = File::create(mine);
      for (size_t i = 0; i < c.slots.size(); ++i)
        for (const Piece& p : meta.tensors[i].pieces) {
          if (p.file != rank) continue;
          at::Tensor keep;
          const char* bytes = part_bytes(c.slots[i], keep, p.begin);
          const size_t n = size_t(p.end - p.begin) * c10::elementSize(c.slots[i].dtype);
          hashes += concat(f.write_hashed_at(bytes, n, p.offset), ",");
        }
      f.sync();
    });
  } catch (...) {
    fs::remove(mine);
    throw;
  }
  const std::vector<std::string> all = detail::all_gather_strings(group.communicator(), hashes);
  meta.rng = gather_rng(group);
  detail::fail_together(group.communicator(), [&] {
    if (rank != 0) return;
    std::vector<size_t> taken(static_cast<size_t>(world), 0);
    std::vector<std::vector<uint64_t>> by_rank(static_cast<size_t>(world));
    for (int q = 0; q < world; ++q) {
      std::stringstream in(all[size_t(q)]);
      for (std::string h; std::getline(in, h, ',');) by_rank[size_t(q)].push_back(std::stoull(h));
    }
    for (auto& t : meta.tensors)
      for (auto& p : t.pieces) p.hash = by_rank[size_t(p.file)].at(taken[size_t(p.file)]++);
    write_atomically((fs::path(path) / kMetaFile).string(), seal(torch::pickle_save(meta.to_ivalue())));
    // What no metadata names any more: earlier saves' data files, temporaries of failed saves.
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string name = entry.path().filename().string();
      const bool ours = name.rfind("data-", 0) == 0 || name.rfind(std::string(kMetaFile) + ".tmp-", 0) == 0;
      if (ours && std::find(meta.files.begin(), meta.files.end(), name) == meta.files.end()) fs::remove(entry.path());
    }
  });
}

// A tensor with the slot's dtype and shape whose storage has the right size and no memory: the
// pickler writes a reference to record "data/<i>", which the loop wrote already.
at::Tensor placeholder(const Slot& s) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), size_t(s.numel) * c10::elementSize(s.dtype),
                       c10::DataPtr(nullptr, at::Device(at::kCPU)), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(s.dtype)).set_(storage, 0, s.shape, c10::contiguous_strides(s.shape));
}

void save_full(const std::string& path, const Catalog& c, ProcessGroup& group) {
  const int rank = group.rank();
  Meta meta = describe(c, group, true);
  meta.files = {""};
  const std::string tmp = concat(path, ".tmp-", save_id(group));
  std::unique_ptr<File> file;
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip;
  int64_t pos = 0;
  std::exception_ptr error;  // rank 0's: it keeps taking part in the gathers, then fail_together tells everyone
  auto on_rank0 = [&](const std::function<void()>& fn) {
    if (rank != 0 || error) return;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  };
  on_rank0([&] {
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    file = std::make_unique<File>(File::create(tmp));
    zip = std::make_unique<caffe2::serialize::PyTorchStreamWriter>([&](const void* p, size_t n) {
      file->write_at(p, n, pos);
      pos += int64_t(n);
      return n;
    });
  });
  for (size_t i = 0; i < c.slots.size(); ++i) {
    const Slot& s = c.slots[i];
    at::Tensor full = s.local;
    if (s.layout == Layout::Sharded) {  // gathered now, dropped after the write
      std::optional<at::Tensor> stacked = group.gather(s.local.contiguous(), 0);
      if (stacked) full = stacked->reshape({-1}).narrow(0, 0, s.numel);
    }
    on_rank0([&] {
      at::Tensor bytes = full.contiguous();
      const size_t n = size_t(s.numel) * c10::elementSize(s.dtype);
      meta.tensors[i].pieces = {Piece{0, 0, s.numel, -1, checksum(bytes.data_ptr(), n)}};
      zip->writeRecord(record_of(i), bytes.data_ptr(), n);
    });
  }
  meta.rng = gather_rng(group);
  on_rank0([&] {
    // data.pkl: torch.save's object, {item: value}, its tensors pointing at the records above.
    std::unordered_map<const c10::TensorImpl*, size_t> index;
    std::vector<at::Tensor> keep;
    std::vector<std::string> names;
    for (const auto& item : c.items) names.push_back(item.first);
    c10::IValue data = nested(meta, names, [&](size_t i) {
      keep.push_back(placeholder(c.slots[i]));
      index[keep.back().unsafeGetTensorImpl()] = i;
      return keep.back();
    });
    std::vector<char> pickle;
    torch::jit::Pickler pickler(
        [&](const char* p, size_t n) { pickle.insert(pickle.end(), p, p + n); },
        /*tensor_table=*/nullptr, nullptr, nullptr,
        [&](const at::Tensor& t) { return std::to_string(index.at(t.unsafeGetTensorImpl())); },
        /*tag_aggregates=*/false);  // plain dicts and lists: torch.load's weights_only reads them
    pickler.protocol();
    pickler.pushIValue(data);
    pickler.stop();
    zip->writeRecord("data.pkl", pickle.data(), pickle.size());
    const std::vector<char> sealed = seal(torch::pickle_save(meta.to_ivalue()));
    zip->writeRecord(kMetaRecord, sealed.data(), sealed.size());
    zip->writeEndOfFile();
    zip.reset();
    file->sync();
    file.reset();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(concat("save_checkpoint: cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
    sync_dir(fs::path(path).parent_path().string());
  });
  if (rank == 0 && error) {
    zip.reset();
    file.reset();
    fs::remove(tmp);
  }
  detail::fail_together(group.communicator(), [&] {
    if (error) std::rethrow_exception(error);
  });
}

// What this rank is about to save, for comparing across ranks.
std::string outline(const Catalog& c) {
  std::string s;
  for (const auto& [name, kind] : c.items) s += concat(name, " ", kind, "\n");
  for (const auto& t : c.slots)
    s += concat(t.key, " ", c10::toString(t.dtype), detail::shape_string(t.shape), " ", int(t.layout), "\n");
  return s;
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointState& state, SaveOptions options) {
  std::shared_ptr<ProcessGroup> group = options.group ? options.group : default_group();
  Catalog c;
  detail::fail_together(group->communicator(), [&] {
    c = catalog_for_save(state);
    check_slots(c, group->size());
  });
  detail::require_same(group->communicator(), "save_checkpoint",
                       "every rank must save the same state (item and tensor names, dtypes, shapes)", outline(c));
  const bool full =
      options.format == CheckpointFormat::Full || (options.format == CheckpointFormat::Auto && !c.sharded);
  if (full)
    save_full(path, c, *group);
  else
    save_sharded(path, c, *group);
}

}  // namespace chorus
