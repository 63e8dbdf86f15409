#include "parallel/objects/codec.h"

#include <ATen/ATen.h>
#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/mobile/type_parser.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstring>

#include "chorus/core/error.h"
#include "groups/tensor_util.h"
#include "parallel/objects/recv_buffers.h"

namespace chorus::detail {

namespace {

constexpr char kValue = 'V', kError = 'E';

class Writer {
 public:
  std::string out;
  void byte(char c) { out.push_back(c); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out.push_back(char(v | 0x80));
      v >>= 7;
    }
    out.push_back(char(v));
  }
  void sint(int64_t v) { varint((uint64_t(v) << 1) ^ uint64_t(v >> 63)); }
  void text(std::string_view s) {
    varint(s.size());
    out.append(s);
  }
  template <class T>
  void raw(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  char byte() {
    need(1);
    return in_[at_++];
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto b = uint8_t(byte());
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    corrupt("varint too long");
  }
  int64_t sint() {
    const uint64_t v = varint();
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  // A count of things that each take at least one more byte of the header: never more than
  // what is left, so a corrupt count cannot make the reader allocate without bound.
  uint64_t count() {
    const uint64_t n = varint();
    need(n);
    return n;
  }
  std::string_view text() {
    const uint64_t n = varint();
    need(n);
    auto s = in_.substr(at_, n);
    at_ += n;
    return s;
  }
  template <class T>
  T raw() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  // Bounds the nesting of types and values (a corrupt header could otherwise recurse until the
  // stack overflows). One per level; the level ends with the Nest.
  struct Nest {
    Reader& r;
    explicit Nest(Reader& reader) : r(reader) {
      if (++r.depth_ > kMaxDepth) r.corrupt("nested deeper than 1000 levels");
    }
    ~Nest() { --r.depth_; }
  };
  [[noreturn]] void corrupt(const char* what) const {
    throw Error(
        concat("chorus: a received object header is corrupt (", what, " at byte ", at_, " of ", in_.size(), ")"));
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size() - at_) corrupt("truncated");
  }
  static constexpr int kMaxDepth = 1000;
  std::string_view in_;
  size_t at_ = 0;
  int depth_ = 0;
};

// ---- types --------------------------------------------------------------------------------

void write_type(Writer& w, const c10::TypePtr& type) {
  using K = c10::TypeKind;
  switch (type->kind()) {
    case K::AnyType: return w.byte('A');
    case K::NoneType: return w.byte('N');
    case K::BoolType: return w.byte('b');
    case K::IntType: return w.byte('i');
    case K::FloatType: return w.byte('f');
    case K::ComplexType: return w.byte('c');
    case K::StringType: return w.byte('s');
    case K::TensorType: return w.byte('t');
    case K::DeviceObjType: return w.byte('D');
    case K::NumberType: return w.byte('n');
    case K::ListType: w.byte('l'); return write_type(w, type->expectRef<c10::ListType>().getElementType());
    case K::DictType: {
      const auto& d = type->expectRef<c10::DictType>();
      w.byte('m');
      write_type(w, d.getKeyType());
      return write_type(w, d.getValueType());
    }
    case K::OptionalType: w.byte('o'); return write_type(w, type->expectRef<c10::OptionalType>().getElementType());
    case K::TupleType: {
      const auto& t = type->expectRef<c10::TupleType>();
      w.byte('u');
      w.varint(t.elements().size());
      for (const auto& e : t.elements()) write_type(w, e);
      const bool named = t.schema() != nullptr && t.name().has_value();
      w.byte(named ? 1 : 0);
      if (named) {
        w.text(t.name()->qualifiedName());
        for (const auto& f : t.schema()->arguments()) w.text(f.name());
      }
      return;
    }
    default: w.byte('x'); return w.text(type->annotation_str());
  }
}

c10::TypePtr read_type(Reader& r) {
  Reader::Nest level(r);
  switch (r.byte()) {
    case 'A': return c10::AnyType::get();
    case 'N': return c10::NoneType::get();
    case 'b': return c10::BoolType::get();
    case 'i': return c10::IntType::get();
    case 'f': return c10::FloatType::get();
    case 'c': return c10::ComplexType::get();
    case 's': return c10::StringType::get();
    case 't': return c10::TensorType::get();
    case 'D': return c10::DeviceObjType::get();
    case 'n': return c10::NumberType::get();
    case 'l': return c10::ListType::create(read_type(r));
    case 'm': {
      auto k = read_type(r);
      return c10::DictType::create(k, read_type(r));
    }
    case 'o': return c10::OptionalType::create(read_type(r));
    case 'u': {
      std::vector<c10::TypePtr> elems(r.count());
      for (auto& e : elems) e = read_type(r);
      if (!r.byte()) return c10::TupleType::create(std::move(elems));
      std::string name(r.text());
      std::vector<std::string> fields;
      for (size_t i = 0; i < elems.size(); ++i) fields.emplace_back(r.text());
      return c10::TupleType::createNamed(c10::QualifiedName(name), fields, elems);
    }
    case 'x': {
      std::string text(r.text());
      try {
        return c10::parseType(text);
      } catch (const std::exception&) {
        return c10::AnyType::get();
      }
    }
    default: r.corrupt("unknown type tag");
  }
}

// ---- values -------------------------------------------------------------------------------

void write_value(Writer& w, const c10::IValue& v, std::vector<at::Tensor>& tensors) {
  if (v.isNone()) return w.byte('N');
  if (v.isBool()) return w.byte(v.toBool() ? 'T' : 'F');
  if (v.isInt()) {
    w.byte('i');
    return w.sint(v.toInt());
  }
  if (v.isDouble()) {
    w.byte('d');
    return w.raw(v.toDouble());
  }
  if (v.isComplexDouble()) {
    w.byte('c');
    return w.raw(v.toComplexDouble());
  }
  if (v.isString()) {
    w.byte('s');
    return w.text(v.toStringRef());
  }
  if (v.isTensor()) {
    w.byte('t');
    w.varint(tensors.size());
    tensors.push_back(v.toTensor());
    return;
  }
  if (v.isList()) {
    auto list = v.toList();
    w.byte('l');
    write_type(w, list.elementType());
    w.varint(list.size());
    for (size_t i = 0; i < list.size(); ++i) write_value(w, list.get(i), tensors);
    return;
  }
  if (v.isGenericDict()) {
    auto dict = v.toGenericDict();
    w.byte('m');
    write_type(w, dict.keyType());
    write_type(w, dict.valueType());
    w.varint(dict.size());
    for (const auto& item : dict) {
      write_value(w, item.key(), tensors);
      write_value(w, item.value(), tensors);
    }
    return;
  }
  if (v.isTuple()) {
    const auto& tuple = v.toTupleRef();
    w.byte('u');
    write_type(w, v.type());
    w.varint(tuple.elements().size());
    for (const auto& e : tuple.elements()) write_value(w, e, tensors);
    return;
  }
  if (v.isDevice()) {
    w.byte('D');
    return w.text(v.toDevice().str());
  }
  // Anything else goes through torch's pickler, tensors still out of band.
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle(v, &tensors);
  } catch (const std::exception& e) {
    throw InvalidArgument(concat("cannot move an object of type ", v.type()->annotation_str(), ": ", e.what()));
  }
  w.byte('p');
  w.text(std::string_view(bytes.data(), bytes.size()));
}

c10::IValue read_value(Reader& r, const std::vector<at::Tensor>& tensors) {
  Reader::Nest level(r);
  switch (r.byte()) {
    case 'N': return c10::IValue();
    case 'T': return c10::IValue(true);
    case 'F': return c10::IValue(false);
    case 'i': return c10::IValue(r.sint());
    case 'd': return c10::IValue(r.raw<double>());
    case 'c': return c10::IValue(r.raw<c10::complex<double>>());
    case 's': return c10::IValue(std::string(r.text()));
    case 't': {
      const uint64_t i = r.varint();
      if (i >= tensors.size()) r.corrupt("tensor index out of range");
      return c10::IValue(tensors[i]);
    }
    case 'l': {
      auto elem = read_type(r);
      c10::impl::GenericList list(elem);
      const uint64_t n = r.count();
      list.reserve(n);
      for (uint64_t i = 0; i < n; ++i) list.push_back(read_value(r, tensors));
      return c10::IValue(list);
    }
    case 'm': {
      auto key = read_type(r);
      c10::impl::GenericDict dict(key, read_type(r));
      const uint64_t n = r.count();
      dict.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        auto k = read_value(r, tensors);
        dict.insert_or_assign(std::move(k), read_value(r, tensors));
      }
      return c10::IValue(dict);
    }
    case 'u': {
      auto type = read_type(r);
      std::vector<c10::IValue> elems(r.count());
      for (auto& e : elems) e = read_value(r, tensors);
      auto tuple_type = type->cast<c10::TupleType>();
      if (tuple_type && tuple_type->schema()) return c10::ivalue::Tuple::createNamed(std::move(elems), tuple_type);
      return c10::ivalue::Tuple::create(std::move(elems));
    }
    case 'D': return c10::IValue(c10::Device(std::string(r.text())));
    case 'p': {
      auto bytes = r.text();
      return torch::jit::unpickle(bytes.data(), bytes.size(), nullptr, tensors);
    }
    default: r.corrupt("unknown value tag");
  }
}

}  // namespace

size_t Encoded::tensor_bytes() const {
  size_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

Encoded encode_object(const c10::IValue& value) {
  Writer body;
  std::vector<at::Tensor> tensors;
  write_value(body, value, tensors);
  Writer head;
  head.byte(kValue);
  head.varint(tensors.size());
  for (auto& t : tensors) {
    if (!t.device().is_cpu())
      throw InvalidArgument(concat("an object holds a tensor on ", t.device().str(),
                                   ": move it to the CPU first (chorus::send_to_device(obj, torch::kCPU))"));
    if (t.layout() != at::kStrided)
      throw InvalidArgument(
          concat("an object holds a tensor with layout ", t.layout(), ": convert it with to_dense()"));
    head.byte(char(t.scalar_type()));
    head.byte(t.requires_grad() ? 1 : 0);
    head.varint(size_t(t.dim()));
    for (int64_t s : t.sizes()) head.sint(s);
    t = plain(t);
  }
  head.out += body.out;
  return Encoded{std::move(head.out), std::move(tensors)};
}

std::string encode_error(const std::string& message) { return std::string(1, kError) + message; }

std::optional<std::string> header_error(std::string_view header) {
  if (!header.empty() && header[0] == kError) return std::string(header.substr(1));
  return std::nullopt;
}

namespace {
// Reads the tensor table; leaves the reader at the value.
std::vector<at::Tensor> read_tensors(Reader& r, bool allocate) {
  if (r.byte() != kValue) r.corrupt("not a value");
  std::vector<at::Tensor> out(r.count());
  for (auto& t : out) {
    const auto code = uint8_t(r.byte());
    const auto type = at::ScalarType(code);
    if (code >= uint8_t(at::ScalarType::NumOptions) || !core_type(type)) r.corrupt("unknown tensor dtype");
    const bool grad = r.byte() != 0;
    std::vector<int64_t> sizes(r.count());
    for (auto& s : sizes)
      if ((s = r.sint()) < 0) r.corrupt("negative tensor size");
    if (allocate) {
      t = receive_buffer(sizes, type);
      if (grad) t.set_requires_grad(true);
    }
  }
  return out;
}

// fn(), with what torch's own code throws on bad bytes (device names, pickles, allocations)
// reported as a corrupt header.
template <class Fn>
auto as_corrupt(Fn&& fn) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(concat("chorus: a received object header is corrupt (", e.what(), ")"));
  }
}
}  // namespace

std::vector<at::Tensor> allocate_tensors(std::string_view header) {
  return as_corrupt([&] {
    Reader r(header);
    return read_tensors(r, true);
  });
}

c10::IValue decode_object(std::string_view header, const std::vector<at::Tensor>& tensors) {
  return as_corrupt([&] {
    Reader r(header);
    auto table = read_tensors(r, false);
    if (table.size() != tensors.size()) r.corrupt("tensor count");
    return read_value(r, tensors);
  });
}

}  // namespace chorus::detail
