// Note [Collection collectives]
// A collection's leaves are flattened in a fixed walk order, and its structure (container kinds,
// keys, leaf dtypes, devices and shapes) is written as a signature. The ranks first agree on the
// signature (one all_gather of its hash; on a difference, every rank's signature is exchanged so
// the CollectiveMismatch shows them all). After that every check that depends only on structure
// gives the same answer everywhere, so it can throw locally without leaving anyone waiting.
// Leaves are then coalesced: one flat buffer and one collective per dtype, however many leaves.
#include "structured.h"

#include <cstring>
#include <functional>
#include <map>

#include "chorus/collections.h"
#include "tensor_util.h"

namespace chorus::detail {

namespace {

enum class Shapes { Exact, AnyRows };  // AnyRows: dim 0 may differ between ranks

struct Leaf {
  at::Tensor tensor;   // contiguous
  std::string path;
  c10::IValue number;  // the number this leaf was, or None
};

struct Flat {
  std::vector<Leaf> leaves;
  std::string signature;
};

void flatten_into(const c10::IValue& v, Shapes shapes, const std::string& path, Flat& out) {
  std::string& sig = out.signature;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    sig += concat("T<", c10::toString(t.scalar_type()), ",", t.device().str(), ">");
    if (shapes == Shapes::AnyRows && t.dim() > 0) {
      sig += "[*";
      for (int64_t d = 1; d < t.dim(); ++d) sig += concat(",", t.size(d));
      sig += "]";
    } else {
      sig += shape_string(t.sizes());
    }
    out.leaves.push_back({t.resolve_conj().resolve_neg().contiguous(), path, {}});
  } else if (v.isInt() || v.isDouble() || v.isBool()) {
    const auto type = v.isInt() ? at::kLong : v.isDouble() ? at::kDouble : at::kBool;
    sig += v.isInt() ? "int" : v.isDouble() ? "float" : "bool";
    out.leaves.push_back({at::scalar_tensor(v.toScalar(), at::TensorOptions().dtype(type)), path, v});
  } else if (v.isList() || v.isTuple()) {
    const bool list = v.isList();
    if (!list && v.type()->castRaw<c10::TupleType>()->name())
      sig += v.type()->castRaw<c10::TupleType>()->name()->name();
    sig += list ? "[" : "(";
    const auto items = list ? v.toList().vec() : v.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) sig += ",";
      flatten_into(items[i], shapes, concat(path, "[", i, "]"), out);
    }
    sig += list ? "]" : ")";
  } else if (v.isGenericDict()) {
    sig += "{";
    bool first = true;
    for (const auto& item : v.toGenericDict()) {
      const auto& k = item.key();
      const std::string key = k.isString() ? concat("'", k.toStringRef(), "'") : k.isInt() ? std::to_string(k.toInt())
                                                                                         : k.type()->annotation_str();
      sig += concat(first ? "" : ",", key, ":");
      first = false;
      flatten_into(item.value(), shapes, concat(path, "[", key, "]"), out);
    }
    sig += "}";
  } else {
    sig += v.isNone() ? "None" : v.isString() ? "str" : v.type()->annotation_str();
  }
}

Flat flatten(const c10::IValue& data, Shapes shapes) {
  Flat f;
  flatten_into(data, shapes, "", f);
  for (auto& leaf : f.leaves)
    if (leaf.path.empty()) leaf.path = "the data";
  return f;
}

// data with its leaves replaced in walk order; a number leaf becomes a number again when
// numbers_back (its tensor is 0-d then).
c10::IValue rebuild(const c10::IValue& v, const std::vector<at::Tensor>& leaves, size_t& next, bool numbers_back) {
  if (v.isTensor()) return leaves[next++];
  if (v.isInt() || v.isDouble() || v.isBool()) {
    const at::Tensor& t = leaves[next++];
    if (!numbers_back) return t;
    if (v.isInt()) return t.item<int64_t>();
    if (v.isDouble()) return t.item<double>();
    return t.item<bool>();
  }
  if (v.isList() || v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& i : v.isList() ? v.toList().vec() : v.toTupleRef().elements().vec())
      items.push_back(rebuild(i, leaves, next, numbers_back));
    return honor_type(v, std::move(items));
  }
  if (v.isGenericDict()) {
    auto dict = v.toGenericDict();
    std::vector<c10::IValue> values;
    bool same_types = true;
    for (const auto& item : dict) {
      values.push_back(rebuild(item.value(), leaves, next, numbers_back));
      same_types = same_types && values.back().type()->isSubtypeOf(*dict.valueType());
    }
    c10::impl::GenericDict out(dict.keyType(), same_types ? dict.valueType() : c10::AnyType::get());
    size_t i = 0;
    for (const auto& item : dict) out.insert(item.key(), std::move(values[i++]));
    return out;
  }
  return v;
}

c10::IValue rebuild(const c10::IValue& data, const std::vector<at::Tensor>& leaves, bool numbers_back) {
  size_t next = 0;
  return rebuild(data, leaves, next, numbers_back);
}

// CollectiveMismatch on every rank unless every rank has the same signature.
void agree(ProcessGroup& g, const std::string& signature, const char* what) {
  Communicator& comm = g.communicator();
  const int w = g.size();
  if (w == 1) return;
  const uint64_t mine = std::hash<std::string>{}(signature);
  std::vector<uint64_t> all(static_cast<size_t>(w));
  comm.all_gather(&mine, all.data(), 1, DataType::Int64);
  bool same = true;
  for (uint64_t h : all) same = same && h == mine;
  if (same) return;
  std::vector<size_t> lengths(static_cast<size_t>(w));
  uint64_t n = signature.size();
  std::vector<uint64_t> ns(static_cast<size_t>(w));
  comm.all_gather(&n, ns.data(), 1, DataType::Int64);
  size_t total = 0;
  for (int r = 0; r < w; ++r) total += lengths[size_t(r)] = ns[size_t(r)];
  std::string texts(total, '\0');
  comm.all_gather_v(signature.data(), texts.data(), lengths, DataType::UInt8);
  std::vector<std::string> calls;
  std::string lines;
  size_t at = 0;
  for (int r = 0; r < w; ++r) {
    calls.push_back(texts.substr(at, lengths[size_t(r)]));
    at += lengths[size_t(r)];
    std::string shown = calls.back().size() > 300 ? calls.back().substr(0, 300) + "..." : calls.back();
    lines += concat("\n  rank ", r, ": ", shown);
  }
  throw CollectiveMismatch(concat(what, " on group '", g.name(),
                                  "': the ranks passed collections that differ in structure, keys, dtypes or shapes:",
                                  lines),
                           calls);
}

// Structure-only checks, after agree(): the same verdict on every rank.
void check_leaves(const Flat& f, std::optional<ReduceOp> op, const char* what) {
  for (const auto& leaf : f.leaves)
    if (auto why = tensor_problem(leaf.tensor, op); !why.empty())
      throw InvalidArgument(concat(what, ": ", leaf.path, " (", describe(leaf.tensor), "): ", why));
}

// Leaf indices grouped by dtype, in walk order within each group.
std::map<at::ScalarType, std::vector<size_t>> by_dtype(const Flat& f) {
  std::map<at::ScalarType, std::vector<size_t>> groups;
  for (size_t i = 0; i < f.leaves.size(); ++i) groups[f.leaves[i].tensor.scalar_type()].push_back(i);
  return groups;
}

// One flat tensor holding the leaves `idx` back to back.
at::Tensor pack(const Flat& f, const std::vector<size_t>& idx, int64_t& total) {
  total = 0;
  for (size_t i : idx) total += f.leaves[i].tensor.numel();
  at::Tensor flat = at::empty({total}, f.leaves[idx[0]].tensor.options());
  auto* dst = static_cast<char*>(total ? flat.data_ptr() : nullptr);
  for (size_t i : idx) {
    const auto& t = f.leaves[i].tensor;
    if (t.nbytes()) std::memcpy(dst, t.data_ptr(), t.nbytes());
    dst += t.nbytes();
  }
  return flat;
}

// A view of `base` with `sizes`, starting `offset` elements in, rows `row_stride` apart when
// stacked (rows > 0 adds a leading dim of that many rows).
at::Tensor view_of(const at::Tensor& base, at::IntArrayRef sizes, int64_t offset, int64_t rows, int64_t row_stride) {
  std::vector<int64_t> shape, strides(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = s;
    s *= sizes[d];
  }
  shape.assign(sizes.begin(), sizes.end());
  if (rows > 0) {
    shape.insert(shape.begin(), rows);
    strides.insert(strides.begin(), row_stride);
  }
  return base.as_strided(shape, strides, base.storage_offset() + offset);
}

}  // namespace

c10::IValue all_reduce_collection(ProcessGroup& g, const c10::IValue& data, ReduceOp op, const char* what) {
  Flat f = flatten(data, Shapes::Exact);
  agree(g, f.signature, what);
  check_leaves(f, op, what);
  std::vector<at::Tensor> out(f.leaves.size());
  for (auto& [type, idx] : by_dtype(f)) {
    int64_t total;
    at::Tensor flat = pack(f, idx, total);
    g.all_reduce_(flat, op);
    int64_t off = 0;
    for (size_t i : idx) {
      out[i] = view_of(flat, f.leaves[i].tensor.sizes(), off, 0, 0);
      off += f.leaves[i].tensor.numel();
    }
  }
  return rebuild(data, out, true);
}

c10::IValue all_gather_collection(ProcessGroup& g, const c10::IValue& data, const char* what) {
  Flat f = flatten(data, Shapes::Exact);
  agree(g, f.signature, what);
  check_leaves(f, std::nullopt, what);
  std::vector<at::Tensor> out(f.leaves.size());
  for (auto& [type, idx] : by_dtype(f)) {
    int64_t total;
    at::Tensor flat = pack(f, idx, total);
    at::Tensor all = g.all_gather(flat);  // (W, total)
    int64_t off = 0;
    for (size_t i : idx) {
      out[i] = view_of(all, f.leaves[i].tensor.sizes(), off, g.size(), total);
      off += f.leaves[i].tensor.numel();
    }
  }
  return rebuild(data, out, false);
}

std::optional<c10::IValue> gather_collection(ProcessGroup& g, const c10::IValue& data, int dst, const char* what) {
  Communicator& comm = g.communicator();
  const int w = g.size();
  if (dst < 0 || dst >= w) comm.reject(what, concat("destination ", dst, " is not a rank of this group (size ", w, ")"));
  Flat f = flatten(data, Shapes::AnyRows);
  agree(g, f.signature, what);
  check_leaves(f, std::nullopt, what);
  for (auto& leaf : f.leaves)
    if (leaf.tensor.dim() == 0) leaf.tensor = leaf.tensor.reshape({1});
  // Every rank's row count of every leaf.
  const size_t n = f.leaves.size();
  std::vector<int64_t> rows(n), all_rows(n * size_t(w));
  for (size_t i = 0; i < n; ++i) rows[i] = f.leaves[i].tensor.size(0);
  if (n) comm.all_gather(rows.data(), all_rows.data(), n, DataType::Int64);
  const bool mine = g.rank() == dst;
  std::vector<std::vector<at::Tensor>> pieces(n);
  for (auto& [type, idx] : by_dtype(f)) {
    int64_t total;
    at::Tensor flat = pack(f, idx, total);
    const size_t per = core_type(type)->per_element;
    std::vector<size_t> counts(size_t(w), 0);
    for (int r = 0; r < w; ++r)
      for (size_t i : idx) {
        const int64_t row = c10::multiply_integers(f.leaves[i].tensor.sizes().slice(1));
        counts[size_t(r)] += size_t(all_rows[size_t(r) * n + i] * row) * per;
      }
    size_t sum = 0;
    for (size_t c : counts) sum += c;
    at::Tensor all = mine ? at::empty({int64_t(sum / per)}, flat.options()) : at::Tensor();
    comm.gather_v(total ? flat.data_ptr() : nullptr, mine && sum ? all.data_ptr() : nullptr, counts,
                  core_type(type)->dtype, dst);
    if (!mine) continue;
    int64_t off = 0;
    for (int r = 0; r < w; ++r)
      for (size_t i : idx) {
        auto sizes = f.leaves[i].tensor.sizes().vec();
        sizes[0] = all_rows[size_t(r) * n + i];
        pieces[i].push_back(view_of(all, sizes, off, 0, 0));
        off += c10::multiply_integers(sizes);
      }
  }
  if (!mine) return std::nullopt;
  std::vector<at::Tensor> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = at::cat(pieces[i], 0);
  return rebuild(data, out, false);
}

}  // namespace chorus::detail
