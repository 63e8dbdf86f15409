// Note [Checkpoint metadata]
// What a checkpoint says of itself, written once by rank 0 as a pickled dict (torch::pickle_save:
// readable by torch.load too): the chorus version and world size that wrote it, the items and
// their kinds ("module:full_shard", "optimizer:Adam", "value"), every tensor's key, dtype, shape
// and pieces (file, element range, byte offset, XXH3-64 of the bytes), the items' other values,
// and each rank's RNG state. A sharded checkpoint keeps it in the sealed file "metadata" of its
// directory (Note [Checkpoint files]); a full one in the zip record "chorus/metadata" beside
// torch.save's "data.pkl", whose tensors are records "data/<i>" (tensor i of the metadata).
#include "parallel/checkpoint/meta.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>

#include <filesystem>

#include "parallel/checkpoint/catalog.h"
#include "parallel/checkpoint/files.h"

namespace chorus::detail::checkpoint {

namespace {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

}  // namespace

std::string record_of(size_t i) { return concat("data/", i); }

c10::IValue Meta::to_ivalue() const {
  Dict d = new_dict();
  d.insert("format", full ? "chorus-full" : "chorus-sharded");
  d.insert("format_version", int64_t(1));
  d.insert("chorus_version", chorus_version);
  d.insert("world_size", world_size);
  List it(c10::AnyType::get());
  for (const auto& [name, kind] : items) it.push_back(c10::ivalue::Tuple::create(name, kind));
  d.insert("items", it);
  List fs(c10::StringType::get());
  for (const auto& f : files) fs.push_back(f);
  d.insert("files", fs);
  List ts(c10::AnyType::get());
  for (const auto& t : tensors) {
    List pieces(c10::AnyType::get());
    for (const auto& p : t.pieces)
      pieces.push_back(std::vector<int64_t>{p.file, p.begin, p.end, p.offset, int64_t(p.hash)});
    ts.push_back(c10::ivalue::Tuple::create(t.key, int64_t(t.dtype), t.shape, pieces));
  }
  d.insert("tensors", ts);
  d.insert("objects", objects);
  List rs(c10::TensorType::get());
  for (const auto& r : rng) rs.push_back(r);
  d.insert("rng", rs);
  return d;
}

Meta Meta::from_ivalue(const c10::IValue& v, const std::string& path) {
  try {
    Meta m;
    Dict d = v.toGenericDict();
    const std::string format = d.at("format").toStringRef();
    if (format != "chorus-full" && format != "chorus-sharded") throw std::runtime_error("format " + format);
    if (d.at("format_version").toInt() != 1)
      throw InvalidArgument(concat("checkpoint: '", path, "' has format version ", d.at("format_version").toInt(),
                                   "; this chorus reads version 1"));
    m.full = format == "chorus-full";
    m.chorus_version = d.at("chorus_version").toStringRef();
    m.world_size = d.at("world_size").toInt();
    for (const c10::IValue& e : d.at("items").toList().vec()) {
      auto t = e.toTuple();
      m.items.emplace_back(t->elements()[0].toStringRef(), t->elements()[1].toStringRef());
    }
    for (const c10::IValue& f : d.at("files").toList().vec()) m.files.push_back(f.toStringRef());
    for (const c10::IValue& e : d.at("tensors").toList().vec()) {
      auto t = e.toTuple();
      SavedTensor s;
      s.key = t->elements()[0].toStringRef();
      s.dtype = at::ScalarType(t->elements()[1].toInt());
      s.shape = t->elements()[2].toIntVector();
      s.numel = c10::multiply_integers(s.shape);
      for (const c10::IValue& p : t->elements()[3].toList().vec()) {
        auto x = p.toIntVector();
        if (x.size() != 5 || x[0] < 0 || size_t(x[0]) >= std::max<size_t>(m.files.size(), 1))
          throw std::runtime_error("piece");
        s.pieces.push_back(Piece{x[0], x[1], x[2], x[3], uint64_t(x[4])});
      }
      m.tensors.push_back(std::move(s));
    }
    m.objects = d.at("objects").toGenericDict();
    for (const c10::IValue& r : d.at("rng").toList().vec()) m.rng.push_back(r.toTensor());
    return m;
  } catch (const InvalidArgument&) {
    throw;
  } catch (const std::exception& e) {
    throw InvalidArgument(concat("checkpoint: '", path, "' does not describe a chorus checkpoint (", e.what(), ")"));
  }
}

Meta read_meta(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw InvalidArgument(concat("checkpoint: '", path, "' does not exist"));
  if (fs::is_directory(path)) {
    const std::string file = (fs::path(path) / kMetaFile).string();
    if (!fs::exists(file))
      throw InvalidArgument(concat(
          "checkpoint: '", path, "' has no metadata file: not a chorus checkpoint, or its first save never finished"));
    std::vector<char> payload = open_sealed(read_whole(file), file);
    Meta m = Meta::from_ivalue(torch::pickle_load(payload), file);
    if (m.full) throw InvalidArgument(concat("checkpoint: '", file, "' describes a full checkpoint, in a directory"));
    return m;
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception&) {
    throw InvalidArgument(
        concat("checkpoint: '", path,
               "' is not a chorus checkpoint: not a zip file, or truncated (no zip directory at its end)"));
  }
  if (!zip->hasRecord(kMetaRecord))
    throw InvalidArgument(concat("checkpoint: '", path, "' has no chorus metadata (a torch.save file?)"));
  auto [data, size] = zip->getRecord(kMetaRecord);
  const char* p = static_cast<const char*>(data.get());
  std::vector<char> payload = open_sealed(std::vector<char>(p, p + size), concat(path, ":", kMetaRecord));
  Meta m = Meta::from_ivalue(torch::pickle_load(payload), path);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!zip->hasRecord(record_of(i)))
      throw InvalidArgument(
          concat("checkpoint: '", path, "' has no record ", record_of(i), " ('", m.tensors[i].key, "')"));
    const int64_t offset = int64_t(zip->getRecordOffset(record_of(i)));
    for (auto& piece : m.tensors[i].pieces) piece.offset = offset;
  }
  m.files = {""};
  return m;
}

Dict nested(const Meta& meta, const std::vector<std::string>& items, const std::function<at::Tensor(size_t)>& tensor) {
  Dict out = new_dict();
  for (const auto& item : items) {
    c10::IValue obj = meta.objects.contains(item) ? meta.objects.at(item) : c10::IValue();
    const std::string prefix = keys::item_prefix(item);
    bool has_tensors = false;
    for (const auto& t : meta.tensors) has_tensors |= t.key.rfind(prefix, 0) == 0;
    if (!has_tensors) {
      if (!obj.isNone()) out.insert(item, obj);
      continue;
    }
    Dict root = obj.isGenericDict() ? obj.toGenericDict().copy() : new_dict();
    for (size_t i = 0; i < meta.tensors.size(); ++i) {
      const std::string& key = meta.tensors[i].key;
      if (key.rfind(prefix, 0) != 0) continue;
      // "state/model.l1.weight/exp_avg" -> nested dicts; module parameter names keep their dots.
      std::vector<std::string> parts;
      size_t start = prefix.size();
      for (size_t slash; (slash = key.find('/', start)) != std::string::npos; start = slash + 1)
        parts.push_back(key.substr(start, slash - start));
      parts.push_back(key.substr(start));
      Dict d = root;
      for (size_t k = 0; k + 1 < parts.size(); ++k) {
        if (!d.contains(parts[k]) || !d.at(parts[k]).isGenericDict()) d.insert_or_assign(parts[k], new_dict());
        d = d.at(parts[k]).toGenericDict();
      }
      d.insert_or_assign(parts.back(), tensor(i));
    }
    out.insert(item, root);
  }
  return out;
}

}  // namespace chorus::detail::checkpoint
