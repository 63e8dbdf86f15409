// C++ values <-> c10::IValue with their exact types, for the typed object helpers
// (broadcast_object<T>, compute_and_broadcast, ...): bool, integers (as int64), floating point
// (as double), std::string, at::Tensor, c10::IValue, std::vector<T>, std::map<K, V>,
// std::unordered_map<K, V>, std::pair, std::tuple, std::optional<T>, and nestings of these.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/core/error.h"

namespace chorus {

template <class T, class Enable = void>
struct IValueTraits;  // specialize to move your own types: static type(), to(), from()

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};
template <class A, class B>
struct is_tuple<std::pair<A, B>> : std::true_type {};

[[noreturn]] inline void wrong_type(const c10::IValue& v, const char* want) {
  throw Error(concat("chorus: expected ", want, " but the object is a ", v.type()->annotation_str()));
}
}  // namespace detail

template <>
struct IValueTraits<bool> {
  static c10::TypePtr type() { return c10::BoolType::get(); }
  static c10::IValue to(bool v) { return v; }
  static bool from(const c10::IValue& v) {
    if (!v.isBool()) detail::wrong_type(v, "bool");
    return v.toBool();
  }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static c10::TypePtr type() { return c10::IntType::get(); }
  static c10::IValue to(T v) { return int64_t(v); }
  static T from(const c10::IValue& v) {
    if (!v.isInt()) detail::wrong_type(v, "an integer");
    return T(v.toInt());
  }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static c10::TypePtr type() { return c10::FloatType::get(); }
  static c10::IValue to(T v) { return double(v); }
  static T from(const c10::IValue& v) {
    if (!v.isDouble()) detail::wrong_type(v, "a float");
    return T(v.toDouble());
  }
};

template <>
struct IValueTraits<std::string> {
  static c10::TypePtr type() { return c10::StringType::get(); }
  static c10::IValue to(const std::string& v) { return v; }
  static std::string from(const c10::IValue& v) {
    if (!v.isString()) detail::wrong_type(v, "a string");
    return v.toStringRef();
  }
};

template <>
struct IValueTraits<at::Tensor> {
  static c10::TypePtr type() { return c10::TensorType::get(); }
  static c10::IValue to(const at::Tensor& v) { return v; }
  static at::Tensor from(const c10::IValue& v) {
    if (!v.isTensor()) detail::wrong_type(v, "a tensor");
    return v.toTensor();
  }
};

template <>
struct IValueTraits<c10::IValue> {
  static c10::TypePtr type() { return c10::AnyType::get(); }
  static c10::IValue to(const c10::IValue& v) { return v; }
  static c10::IValue from(const c10::IValue& v) { return v; }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<detail::is_vector<T>::value>> {
  using E = typename T::value_type;
  static c10::TypePtr type() { return c10::ListType::create(IValueTraits<E>::type()); }
  static c10::IValue to(const T& v) {
    c10::impl::GenericList list(IValueTraits<E>::type());
    list.reserve(v.size());
    for (const auto& e : v) list.push_back(IValueTraits<E>::to(e));
    return list;
  }
  static T from(const c10::IValue& v) {
    if (!v.isList()) detail::wrong_type(v, "a list");
    T out;
    for (const auto& e : v.toList()) out.push_back(IValueTraits<E>::from(e));
    return out;
  }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<detail::is_map<T>::value>> {
  using K = typename T::key_type;
  using V = typename T::mapped_type;
  static c10::TypePtr type() { return c10::DictType::create(IValueTraits<K>::type(), IValueTraits<V>::type()); }
  static c10::IValue to(const T& v) {
    c10::impl::GenericDict dict(IValueTraits<K>::type(), IValueTraits<V>::type());
    for (const auto& [k, x] : v) dict.insert(IValueTraits<K>::to(k), IValueTraits<V>::to(x));
    return dict;
  }
  static T from(const c10::IValue& v) {
    if (!v.isGenericDict()) detail::wrong_type(v, "a dict");
    T out;
    for (const auto& item : v.toGenericDict())
      out.emplace(IValueTraits<K>::from(item.key()), IValueTraits<V>::from(item.value()));
    return out;
  }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<detail::is_optional<T>::value>> {
  using E = typename T::value_type;
  static c10::TypePtr type() { return c10::OptionalType::create(IValueTraits<E>::type()); }
  static c10::IValue to(const T& v) { return v ? IValueTraits<E>::to(*v) : c10::IValue(); }
  static T from(const c10::IValue& v) {
    if (v.isNone()) return std::nullopt;
    return IValueTraits<E>::from(v);
  }
};

template <class T>
struct IValueTraits<T, std::enable_if_t<detail::is_tuple<T>::value>> {
  static constexpr size_t N = std::tuple_size_v<T>;
  static c10::TypePtr type() {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return c10::TupleType::create({IValueTraits<std::tuple_element_t<I, T>>::type()...});
    }
    (std::make_index_sequence<N>());
  }
  static c10::IValue to(const T& v) {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return c10::ivalue::Tuple::create({IValueTraits<std::tuple_element_t<I, T>>::to(std::get<I>(v))...});
    }
    (std::make_index_sequence<N>());
  }
  static T from(const c10::IValue& v) {
    if (!v.isTuple() || v.toTupleRef().elements().size() != N) detail::wrong_type(v, "a tuple of the right length");
    const auto& e = v.toTupleRef().elements();
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return T{IValueTraits<std::tuple_element_t<I, T>>::from(e[I])...};
    }
    (std::make_index_sequence<N>());
  }
};

template <class T>
c10::IValue to_ivalue(const T& v) {
  return IValueTraits<std::decay_t<T>>::to(v);
}
template <class T>
T from_ivalue(const c10::IValue& v) {
  return IValueTraits<T>::from(v);
}

}  // namespace chorus
