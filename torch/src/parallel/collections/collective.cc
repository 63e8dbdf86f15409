// Note [Collection collectives]
// A collection's leaves are flattened in leaf order (Note [Leaf order]), and its structure (container kinds,
// keys, leaf dtypes, devices and shapes) is written as a signature. The ranks first agree on the
// signature (one all_gather of its hash; on a difference, every rank's signature is exchanged so
// the CollectiveMismatch shows them all). After that every check that depends only on structure
// gives the same answer everywhere, so it can throw locally without leaving anyone waiting.
// Leaves are then coalesced: one flat buffer and one collective per dtype, however many leaves.
#include "parallel/collections/collective.h"

#include <charconv>
#include <cstring>
#include <functional>
#include <map>

#include "groups/agreement.h"
#include "groups/tensor_util.h"
#include "parallel/collections/tree.h"

namespace chorus::detail {

namespace {

enum class Shapes { Exact, AnyRows };  // AnyRows: dim 0 may differ between ranks

struct Flat {
  std::vector<at::Tensor> leaves;  // contiguous, in leaf order; numbers as 0-d tensors
  std::string signature;
};

void append_int(std::string& s, int64_t v) {
  char buf[24];
  auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  s.append(buf, end);
}

bool is_number(const c10::IValue& v) { return v.isInt() || v.isDouble() || v.isBool(); }

// Leaves of the collection collectives: tensors and numbers (strings and None stay behind).
bool moved_leaf(const c10::IValue& v) { return v.isTensor() || is_number(v); }

// Appends data's structure to the signature and its leaves to out (hot: one call per leaf of
// collections with thousands of tensors, so no streams and no torch ops unless needed).
struct Flatten : tree::Visitor {
  Shapes shapes;
  Flat& out;
  Flatten(Shapes s, Flat& f) : shapes(s), out(f) {}
  bool is_leaf(const c10::IValue& v) const { return moved_leaf(v); }
  void leaf(const c10::IValue& v) {
    std::string& sig = out.signature;
    if (is_number(v)) {
      sig += v.isInt() ? "int" : v.isDouble() ? "float" : "bool";
      const auto type = v.isInt() ? at::kLong : v.isDouble() ? at::kDouble : at::kBool;
      out.leaves.push_back(at::scalar_tensor(v.toScalar(), at::TensorOptions().dtype(type)));
      return;
    }
    const at::Tensor& t = v.toTensor();
    sig += "T<";
    sig += c10::toString(t.scalar_type());
    if (t.is_cpu()) {
      sig += ",cpu>[";
    } else {
      sig += ',';
      sig += t.device().str();
      sig += ">[";
    }
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) sig += ',';
      if (d == 0 && shapes == Shapes::AnyRows)
        sig += '*';
      else
        append_int(sig, t.size(d));
    }
    sig += ']';
    out.leaves.push_back(plain(t));
  }
  void other(const c10::IValue& v) {
    out.signature += v.isNone() ? "None" : v.isString() ? "str" : v.type()->annotation_str();
  }
  void open(const c10::IValue& v) {
    if (v.isList()) {
      out.signature += '[';
    } else if (v.isTuple()) {
      if (auto name = v.type()->castRaw<c10::TupleType>()->name()) out.signature += name->name();
      out.signature += '(';
    } else {
      out.signature += '{';
    }
  }
  void child(size_t i, const c10::IValue* key) {
    std::string& sig = out.signature;
    if (i) sig += ',';
    if (!key) return;
    if (key->isString()) {
      sig += '\'';
      sig += key->toStringRef();
      sig += '\'';
    } else if (key->isInt()) {
      append_int(sig, key->toInt());
    } else {
      sig += key->type()->annotation_str();
    }
    sig += ':';
  }
  void close(const c10::IValue& v) { out.signature += v.isList() ? ']' : v.isTuple() ? ')' : '}'; }
};

Flat flatten(const c10::IValue& data, Shapes shapes) {
  // Collections usually come back with the same structure: start with room for the last one.
  thread_local size_t last_signature = 0, last_leaves = 0;
  Flat f;
  f.signature.reserve(last_signature);
  f.leaves.reserve(last_leaves);
  Flatten visitor(shapes, f);
  tree::walk(data, visitor);
  last_signature = f.signature.size();
  last_leaves = f.leaves.size();
  return f;
}

std::string leaf_path(const c10::IValue& data, size_t index) { return tree::leaf_path(data, index, moved_leaf); }

// data with its leaves replaced in leaf order. A number leaf becomes a number again when
// numbers_back (its tensor is 0-d then), else stays a tensor, which changes container types.
c10::IValue rebuild(const c10::IValue& data, const std::vector<at::Tensor>& leaves, bool numbers_back) {
  return tree::map_leaves(data, moved_leaf, [&](const c10::IValue& v, size_t i) -> c10::IValue {
    const at::Tensor& t = leaves[i];
    if (v.isTensor() || !numbers_back) return t;
    if (v.isInt()) return t.item<int64_t>();
    if (v.isDouble()) return t.item<double>();
    return t.item<bool>();
  });
}

// CollectiveMismatch on every rank unless every rank has the same signature.
void agree(ProcessGroup& g, const std::string& signature, const char* what) {
  detail::require_same(g.communicator(), what,
                       "the ranks passed collections that differ in structure, keys, dtypes or shapes", signature);
}

// Structure-only checks, after agree(): the same verdict on every rank.
void check_leaves(const c10::IValue& data, const Flat& f, std::optional<ReduceOp> op, const char* what) {
  // One verdict per dtype (a leaf's problem depends on its dtype, device and layout only).
  std::vector<int8_t> checked(size_t(at::ScalarType::NumOptions), 0);
  for (size_t i = 0; i < f.leaves.size(); ++i) {
    const at::Tensor& t = f.leaves[i];
    int8_t& seen = checked[size_t(t.scalar_type())];
    if (seen && t.is_cpu() && t.layout() == at::kStrided) continue;
    seen = 1;
    if (auto why = tensor_problem(t, op); !why.empty())
      throw InvalidArgument(concat(what, ": ", leaf_path(data, i), " (", describe(t), "): ", why));
  }
}

// Leaf indices grouped by dtype, in leaf order within each group; groups in dtype order.
std::vector<std::pair<at::ScalarType, std::vector<size_t>>> by_dtype(const Flat& f) {
  std::vector<std::vector<size_t>> groups(size_t(at::ScalarType::NumOptions));
  for (size_t i = 0; i < f.leaves.size(); ++i) groups[size_t(f.leaves[i].scalar_type())].push_back(i);
  std::vector<std::pair<at::ScalarType, std::vector<size_t>>> out;
  for (size_t t = 0; t < groups.size(); ++t)
    if (!groups[t].empty()) out.emplace_back(at::ScalarType(t), std::move(groups[t]));
  return out;
}

// One flat tensor holding the leaves `idx` back to back.
at::Tensor pack(const Flat& f, const std::vector<size_t>& idx, int64_t& total) {
  total = 0;
  for (size_t i : idx) total += f.leaves[i].numel();
  at::Tensor flat = at::empty({total}, f.leaves[idx[0]].options());
  auto* dst = static_cast<char*>(total ? flat.data_ptr() : nullptr);
  for (size_t i : idx) {
    const auto& t = f.leaves[i];
    if (t.nbytes()) std::memcpy(dst, t.data_ptr(), t.nbytes());
    dst += t.nbytes();
  }
  return flat;
}

}  // namespace

c10::IValue all_reduce_collection(ProcessGroup& g, const c10::IValue& data, ReduceOp op, const char* what) {
  Flat f = flatten(data, Shapes::Exact);
  agree(g, f.signature, what);
  check_leaves(data, f, op, what);
  std::vector<at::Tensor> out(f.leaves.size());
  for (auto& [type, idx] : by_dtype(f)) {
    int64_t total;
    at::Tensor flat = pack(f, idx, total);
    g.all_reduce_(flat, op);
    int64_t off = 0;
    for (size_t i : idx) {
      out[i] = alias_of(flat, f.leaves[i].sizes(), off);
      off += f.leaves[i].numel();
    }
  }
  return rebuild(data, out, true);
}

c10::IValue all_gather_collection(ProcessGroup& g, const c10::IValue& data, const char* what) {
  Flat f = flatten(data, Shapes::Exact);
  agree(g, f.signature, what);
  check_leaves(data, f, std::nullopt, what);
  std::vector<at::Tensor> out(f.leaves.size());
  for (auto& [type, idx] : by_dtype(f)) {
    int64_t total;
    at::Tensor flat = pack(f, idx, total);
    at::Tensor all = g.all_gather(flat);  // (W, total)
    int64_t off = 0;
    for (size_t i : idx) {
      const at::Tensor& leaf = f.leaves[i];
      std::vector<int64_t> sizes{g.size()}, strides{total};
      sizes.insert(sizes.end(), leaf.sizes().begin(), leaf.sizes().end());
      strides.insert(strides.end(), leaf.strides().begin(), leaf.strides().end());
      out[i] = alias_of(all, sizes, strides, off);
      off += leaf.numel();
    }
  }
  return rebuild(data, out, false);
}

std::optional<c10::IValue> gather_collection(ProcessGroup& g, const c10::IValue& data, int dst, const char* what) {
  Communicator& comm = g.communicator();
  const int w = g.size();
  if (dst < 0 || dst >= w)
    comm.reject(what, concat("destination ", dst, " is not a rank of this group (size ", w, ")"));
  Flat f = flatten(data, Shapes::AnyRows);
  agree(g, f.signature, what);
  check_leaves(data, f, std::nullopt, what);
  for (auto& leaf : f.leaves)
    if (leaf.dim() == 0) leaf = leaf.reshape({1});
  // Every rank's row count of every leaf.
  const size_t n = f.leaves.size();
  std::vector<int64_t> rows(n), all_rows(n * size_t(w));
  for (size_t i = 0; i < n; ++i) rows[i] = f.leaves[i].size(0);
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
        const int64_t row = c10::multiply_integers(f.leaves[i].sizes().slice(1));
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
        auto sizes = f.leaves[i].sizes().vec();
        sizes[0] = all_rows[size_t(r) * n + i];
        pieces[i].push_back(alias_of(all, sizes, off));
        off += c10::multiply_integers(sizes);
      }
  }
  if (!mine) return std::nullopt;
  std::vector<at::Tensor> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = at::cat(pieces[i], 0);
  return rebuild(data, out, false);
}

}  // namespace chorus::detail
