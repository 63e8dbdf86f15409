// A checkpoint's description of itself (Note [Checkpoint metadata] in meta.cc).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/catalog.h"

namespace chorus::detail::checkpoint {

// Bytes [begin, end) of a tensor's flattened elements, at `offset` in file `file`, with their
// checksum. In a full checkpoint the offset is the zip record's, found when it is opened.
struct Piece {
  int64_t file = 0, begin = 0, end = 0, offset = 0;
  uint64_t hash = 0;
};

struct SavedTensor {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<Piece> pieces;
};

struct Meta {
  bool full = false;  // one file (zip) or a directory
  std::string chorus_version;
  int64_t world_size = 1;
  std::vector<std::pair<std::string, std::string>> items;  // name, kind
  std::vector<std::string> files;                          // sharded: data files, in the directory
  std::vector<SavedTensor> tensors;
  c10::impl::GenericDict objects{c10::StringType::get(), c10::AnyType::get()};
  std::vector<at::Tensor> rng;  // each rank's CPU generator state

  c10::IValue to_ivalue() const;
  // InvalidArgument naming `path` when the value is not a checkpoint description.
  static Meta from_ivalue(const c10::IValue& v, const std::string& path);
};

// The zip record of tensor i in a full checkpoint.
std::string record_of(size_t i);
constexpr const char* kMetaRecord = "chorus/metadata";
constexpr const char* kMetaFile = "metadata";

// Reads the description of the checkpoint at `path` (a directory or a full file); for a full file
// the pieces' offsets are filled from the zip. InvalidArgument naming the file and what is wrong.
Meta read_meta(const std::string& path);

// The items' values as nested dicts: "a/b/c" -> {a: {b: {c: tensor}}}, merged with the items'
// objects; `tensor(i)` gives tensor i's value (a placeholder when writing a full file).
c10::impl::GenericDict nested(const Meta& meta, const std::vector<std::string>& items,
                              const std::function<at::Tensor(size_t)>& tensor);

}  // namespace chorus::detail::checkpoint
