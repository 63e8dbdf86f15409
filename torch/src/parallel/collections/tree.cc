#include "parallel/collections/tree.h"

#include "chorus/core/error.h"

namespace chorus::detail::tree {
namespace {

// A value's type for container typing: tensors as plain Tensor (not shape-specialized).
c10::TypePtr value_type(const c10::IValue& v) { return v.isTensor() ? c10::TensorType::get() : v.type(); }

}  // namespace

c10::TypePtr item_type(const c10::TypePtr& old, const std::vector<c10::IValue>& items) {
  bool fits = true;
  for (const auto& i : items) fits = fits && value_type(i)->isSubtypeOf(*old);
  if (fits) return old;
  c10::TypePtr common;
  for (const auto& i : items) {
    auto t = value_type(i);
    if (!common) {
      common = t;
    } else if (auto u = c10::unifyTypes(common, t)) {
      common = *u;
    } else {
      return c10::AnyType::get();
    }
  }
  return common ? common : old;
}

c10::IValue rebuild(const c10::IValue& like, std::vector<c10::IValue> children, bool types_kept) {
  if (like.isList()) {
    const auto old = like.toList().elementType();
    c10::impl::GenericList out(types_kept ? old : item_type(old, children));
    out.reserve(children.size());
    for (auto& c : children) out.push_back(std::move(c));
    return out;
  }
  if (like.isGenericDict()) {
    auto dict = like.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), types_kept ? dict.valueType() : item_type(dict.valueType(), children));
    out.reserve(children.size());
    size_t i = 0;
    for (const auto& item : dict) out.insert(item.key(), std::move(children[i++]));
    return out;
  }
  CHORUS_ENFORCE(like.isTuple());
  auto type = like.type()->cast<c10::TupleType>();
  if (!type || !type->schema() || !type->name()) return c10::ivalue::Tuple::create(std::move(children));
  if (types_kept) return c10::ivalue::Tuple::createNamed(std::move(children), type);
  std::vector<std::string> fields;
  for (const auto& a : type->schema()->arguments()) fields.push_back(a.name());
  if (fields.size() != children.size()) return c10::ivalue::Tuple::create(std::move(children));
  std::vector<c10::TypePtr> types;
  for (const auto& c : children) types.push_back(value_type(c));
  return c10::ivalue::Tuple::createNamed(std::move(children),
                                         c10::TupleType::createNamed(*type->name(), fields, types));
}

std::string step_text(size_t index, const c10::IValue* key) {
  if (!key) return concat("[", index, "]");
  if (key->isString()) return concat("['", key->toStringRef(), "']");
  if (key->isInt()) return concat("[", key->toInt(), "]");
  return concat("[", key->type()->annotation_str(), "]");
}

}  // namespace chorus::detail::tree
