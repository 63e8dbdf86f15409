// The one walk of a collection (c10::IValue: GenericDict, GenericList, Tuple, and leaves).
//
// Note [Leaf order]: every walk of a collection visits it depth first, list items and tuple
// elements by index, dict values in the dict's insertion order. What must pair leaves up between
// ranks or between two walks of the same data — the collection collectives' flattening and the
// rebuild that puts their results back, the leaf path in a message, the local operations' map
// over leaves — walks with walk() below, so they cannot disagree on that order.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <type_traits>
#include <vector>

namespace chorus::detail::tree {

inline bool is_container(const c10::IValue& v) { return v.isList() || v.isTuple() || v.isGenericDict(); }

// Walks v in leaf order. A Visitor has:
//   bool is_leaf(const IValue&)       a leaf (asked first, so a container may count as one);
//   void leaf(const IValue&)          each leaf;
//   void other(const IValue&)         each value that is neither leaf nor container;
//   void open(const IValue&)          entering a container,
//   void child(size_t i, const IValue* key)   before its i-th child (key: the dict key, else null),
//   void close(const IValue&)         and leaving it;
//   bool done()                       true to stop the walk early.
template <class Visitor>
void walk(const c10::IValue& v, Visitor& visitor) {
  if (visitor.is_leaf(v)) return visitor.leaf(v);
  if (!is_container(v)) return visitor.other(v);
  visitor.open(v);
  size_t i = 0;
  auto visit = [&](const c10::IValue& child, const c10::IValue* key) {
    if (visitor.done()) return;
    visitor.child(i++, key);
    walk(child, visitor);
  };
  if (v.isList()) {
    for (const auto& item : v.toList()) visit(item, nullptr);
  } else if (v.isTuple()) {
    for (const auto& item : v.toTupleRef().elements()) visit(item, nullptr);
  } else {
    for (const auto& item : v.toGenericDict()) visit(item.value(), &item.key());
  }
  if (!visitor.done()) visitor.close(v);
}

// A visitor's defaults: override what it needs.
struct Visitor {
  void other(const c10::IValue&) {}
  void open(const c10::IValue&) {}
  void child(size_t, const c10::IValue*) {}
  void close(const c10::IValue&) {}
  bool done() const { return false; }
};

// The element type for new items of a container typed `old`: `old` when every item fits it,
// else the items' unified type, else Any.
c10::TypePtr item_type(const c10::TypePtr& old, const std::vector<c10::IValue>& items);

// Container `like` (list, tuple or dict) with new children, one per child in leaf order, of the
// same kind: list and dict element types kept when every child still fits them, named tuples
// keep their name and fields. `types_kept`: the caller knows each child has its old child's type,
// so no child is checked (the hot path of the collection collectives).
c10::IValue rebuild(const c10::IValue& like, std::vector<c10::IValue> children, bool types_kept);

// v with every leaf replaced by fn(leaf, index) (index in leaf order), containers rebuilt with
// their kinds (rebuild()). Values that are neither leaf nor container stay as they are. Either
// function may also take the dict key the value sits under (null elsewhere) as its last argument:
// is_leaf(value, key), fn(leaf, index, key).
template <class IsLeaf, class Fn>
c10::IValue map_leaves(const c10::IValue& v, IsLeaf&& is_leaf, Fn&& fn);

// Where leaf `index` (leaf order, leaves as is_leaf says) sits in data, for messages:
// "['a'][0]", or "the data" for data itself.
template <class IsLeaf>
std::string leaf_path(const c10::IValue& data, size_t index, IsLeaf&& is_leaf);

// Whether b is a leaf of a's kind (tensor, int, double, bool, string or None): a container
// holding b instead of a keeps its type.
inline bool same_kind(const c10::IValue& a, const c10::IValue& b) {
  return (a.isTensor() && b.isTensor()) || (a.isInt() && b.isInt()) || (a.isDouble() && b.isDouble()) ||
         (a.isBool() && b.isBool()) || (a.isString() && b.isString()) || (a.isNone() && b.isNone());
}

// "[3]" or "['key']": the step to a child, as leaf paths show it.
std::string step_text(size_t index, const c10::IValue* key);

// ---- implementation -----------------------------------------------------------------------

template <class IsLeaf, class Fn>
c10::IValue map_leaves(const c10::IValue& v, IsLeaf&& is_leaf, Fn&& fn) {
  struct Map : Visitor {
    IsLeaf& is_leaf_;
    Fn& fn_;
    size_t index = 0;
    const c10::IValue* key = nullptr;                 // of the value being visited
    std::vector<std::vector<c10::IValue>> frames{1};  // the children made so far, per open container
    std::vector<bool> kept{true};                     // per frame: every child kept its type
    Map(IsLeaf& l, Fn& f) : is_leaf_(l), fn_(f) {}
    bool is_leaf(const c10::IValue& x) {
      if constexpr (std::is_invocable_v<IsLeaf&, const c10::IValue&, const c10::IValue*>)
        return is_leaf_(x, key);
      else
        return is_leaf_(x);
    }
    void child(size_t, const c10::IValue* k) { key = k; }
    void add(c10::IValue made, bool same) {
      frames.back().push_back(std::move(made));
      kept.back() = kept.back() && same;
    }
    void leaf(const c10::IValue& x) {
      c10::IValue made;
      if constexpr (std::is_invocable_v<Fn&, const c10::IValue&, size_t, const c10::IValue*>)
        made = fn_(x, index++, key);
      else
        made = fn_(x, index++);
      const bool same = same_kind(x, made);
      add(std::move(made), same);
    }
    void other(const c10::IValue& x) { add(x, true); }
    void open(const c10::IValue&) {
      frames.emplace_back();
      kept.push_back(true);
    }
    void close(const c10::IValue& x) {
      auto children = std::move(frames.back());
      const bool same = kept.back();
      frames.pop_back();
      kept.pop_back();
      add(rebuild(x, std::move(children), same), same);
    }
  } map(is_leaf, fn);
  walk(v, map);
  return std::move(map.frames[0][0]);
}

template <class IsLeaf>
std::string leaf_path(const c10::IValue& data, size_t index, IsLeaf&& is_leaf) {
  struct Find : Visitor {
    IsLeaf& is_leaf_;
    size_t left;
    bool found = false;
    std::string path;
    std::vector<size_t> starts;  // where each open container's step begins in path
    Find(IsLeaf& l, size_t i) : is_leaf_(l), left(i) {}
    bool is_leaf(const c10::IValue& x) { return is_leaf_(x); }
    void leaf(const c10::IValue&) { found = left-- == 0; }
    void open(const c10::IValue&) { starts.push_back(path.size()); }
    void child(size_t i, const c10::IValue* key) {
      path.resize(starts.back());
      path += step_text(i, key);
    }
    void close(const c10::IValue&) {
      path.resize(starts.back());
      starts.pop_back();
    }
    bool done() const { return found; }
  } find(is_leaf, index);
  walk(data, find);
  return find.found && !find.path.empty() ? find.path : "the data";
}

}  // namespace chorus::detail::tree
