// Test data and reference results, computed independently of the code under test: values are
// stored through the compiler's _Float16 and a comparison-based bf16 rounding, and reductions
// are folded here in the canonical order 0..W-1 in plain C++ arithmetic.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/core/dtype.h"

namespace chorus::test {

inline uint16_t ref_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t lo = uint16_t(x >> 16);
  float flo = std::bit_cast<float>(uint32_t(lo) << 16);
  float fhi = std::bit_cast<float>(uint32_t(uint16_t(lo + 1)) << 16);
  double dlo = std::fabs(double(f) - flo), dhi = std::fabs(double(fhi) - f);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return uint16_t(lo + 1);
  return (lo & 1) ? uint16_t(lo + 1) : lo;
}
inline float from_bf16(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h =
      a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^ c * 0x94d049bb133111ebull;
  h ^= h >> 31;
  h *= 0xd6e8feb86659fd93ull;
  return h ^ (h >> 29);
}

inline bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BitwiseAnd || op == ReduceOp::BitwiseOr || op == ReduceOp::BitwiseXor;
}
inline bool is_unsigned(DataType dt) { return dt == DataType::UInt8 || dt == DataType::Bool; }

// Values exact in every dtype, chosen per op so results stay exact and in range.
inline double value(DataType dt, ReduceOp op, int rank, size_t i, uint64_t salt) {
  const uint64_t h = mix(uint64_t(rank) + 1, i, salt);
  if (dt == DataType::Bool) return double(h & 1);
  if (is_bitwise(op)) return double((h >> 8) % (dt == DataType::Int8 ? 128 : dt == DataType::UInt8 ? 256 : 32768));
  if (op == ReduceOp::Product) {
    static const double pick[6] = {1, 2, -1, 1, 0.5, 1};
    double v = pick[h % 6];
    if (v == 0.5 && !is_floating(dt)) v = 3;
    if (v < 0 && is_unsigned(dt)) v = 1;
    return v;
  }
  double v = is_unsigned(dt) ? double(h % 16) : double(int(h % 17) - 8);
  if (is_floating(dt)) v += 0.25 * double((h >> 20) % 4);
  return v;
}

// Stores v in element i of a dtype buffer, rounding like a user's conversion would.
inline void put(DataType dt, void* buf, size_t i, double v) {
  auto* b = static_cast<uint8_t*>(buf);
  switch (dt) {
    case DataType::Float32: {
      float x = float(v);
      std::memcpy(b + 4 * i, &x, 4);
      return;
    }
    case DataType::Float64: {
      std::memcpy(b + 8 * i, &v, 8);
      return;
    }
    case DataType::Float16: {
      _Float16 x = _Float16(float(v));
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::BFloat16: {
      uint16_t x = ref_bf16(float(v));
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::Int8: {
      int8_t x = int8_t(int64_t(v));
      b[i] = uint8_t(x);
      return;
    }
    case DataType::UInt8: {
      b[i] = uint8_t(int64_t(v));
      return;
    }
    case DataType::Bool: {
      b[i] = v != 0;
      return;
    }
    case DataType::Int16: {
      int16_t x = int16_t(int64_t(v));
      std::memcpy(b + 2 * i, &x, 2);
      return;
    }
    case DataType::Int32: {
      int32_t x = int32_t(int64_t(v));
      std::memcpy(b + 4 * i, &x, 4);
      return;
    }
    case DataType::Int64: {
      int64_t x = int64_t(v);
      std::memcpy(b + 8 * i, &x, 8);
      return;
    }
  }
}

template <class Gen>
std::vector<uint8_t> make_buffer(DataType dt, size_t count, Gen&& gen) {
  std::vector<uint8_t> buf(count * element_size(dt) + 1);  // +1: never a null data()
  for (size_t i = 0; i < count; ++i) put(dt, buf.data(), i, gen(i));
  buf.resize(count * element_size(dt));
  return buf;
}

namespace detail_ref {
template <class A>
A combine(ReduceOp op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<decltype(a + b)>;
    switch (op) {
      case ReduceOp::Sum: return A(U(a) + U(b));
      case ReduceOp::Product: return A(U(a) * U(b));
      case ReduceOp::Min: return a < b ? a : b;
      case ReduceOp::Max: return a > b ? a : b;
      case ReduceOp::BitwiseAnd: return A(a & b);
      case ReduceOp::BitwiseOr: return A(a | b);
      case ReduceOp::BitwiseXor: return A(a ^ b);
      default: return a;
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean: return a + b;
      case ReduceOp::Product: return a * b;
      case ReduceOp::Min: return a < b ? a : b;
      case ReduceOp::Max: return a > b ? a : b;
      default: return a;
    }
  }
}

// T: storage type; A: accumulation type; load/store convert between them.
template <class T, class A, class Gen>
std::vector<uint8_t> fold(DataType dt, ReduceOp op, int world, size_t count, Gen&& gen) {
  std::vector<uint8_t> out(count * sizeof(T) + 1);
  std::vector<uint8_t> cell(16);
  auto load = [&](int p, size_t i) {
    put(dt, cell.data(), 0, gen(p, i));
    T t;
    std::memcpy(&t, cell.data(), sizeof(T));
    if constexpr (std::is_same_v<T, uint16_t>)
      return A(from_bf16(t));
    else
      return A(t);
  };
  for (size_t i = 0; i < count; ++i) {
    A acc = load(0, i);
    for (int p = 1; p < world; ++p) acc = combine<A>(op, acc, load(p, i));
    if constexpr (std::is_floating_point_v<A>)
      if (op == ReduceOp::Mean) acc /= A(world);
    T t;
    if constexpr (std::is_same_v<T, uint16_t>)
      t = ref_bf16(acc);
    else
      t = T(acc);
    std::memcpy(out.data() + i * sizeof(T), &t, sizeof(T));
  }
  out.resize(count * sizeof(T));
  return out;
}

template <class Gen>
std::vector<uint8_t> fold_bool(ReduceOp op, int world, size_t count, Gen&& gen) {
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    bool acc = gen(0, i) != 0;
    for (int p = 1; p < world; ++p) {
      bool x = gen(p, i) != 0;
      if (op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::BitwiseOr)
        acc = acc || x;
      else if (op == ReduceOp::BitwiseXor)
        acc = acc != x;
      else
        acc = acc && x;
    }
    out[i] = acc;
  }
  return out;
}
}  // namespace detail_ref

// The reduction of gen(p, i) over ranks p = 0..world-1, element by element.
template <class Gen>
std::vector<uint8_t> reference_reduce(DataType dt, ReduceOp op, int world, size_t count, Gen&& gen) {
  using namespace detail_ref;
  switch (dt) {
    case DataType::Float32: return fold<float, float>(dt, op, world, count, gen);
    case DataType::Float64: return fold<double, double>(dt, op, world, count, gen);
    case DataType::Float16: return fold<_Float16, float>(dt, op, world, count, gen);
    case DataType::BFloat16: return fold<uint16_t, float>(dt, op, world, count, gen);
    case DataType::Int8: return fold<int8_t, int8_t>(dt, op, world, count, gen);
    case DataType::UInt8: return fold<uint8_t, uint8_t>(dt, op, world, count, gen);
    case DataType::Int16: return fold<int16_t, int16_t>(dt, op, world, count, gen);
    case DataType::Int32: return fold<int32_t, int32_t>(dt, op, world, count, gen);
    case DataType::Int64: return fold<int64_t, int64_t>(dt, op, world, count, gen);
    case DataType::Bool: return fold_bool(op, world, count, gen);
  }
  return {};
}

// "" when equal, else where and how they differ.
inline std::string compare_bytes(const uint8_t* got, const uint8_t* want, size_t count, DataType dt) {
  const size_t es = element_size(dt);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i * es, want + i * es, es) != 0) {
      uint64_t g = 0, w = 0;
      std::memcpy(&g, got + i * es, es);
      std::memcpy(&w, want + i * es, es);
      return "element " + std::to_string(i) + " of " + std::to_string(count) + ": got bits 0x" +
             [](uint64_t v) {
               char b[32];
               std::snprintf(b, sizeof b, "%llx", (unsigned long long)v);
               return std::string(b);
             }(g) +
             ", want 0x" + [](uint64_t v) {
               char b[32];
               std::snprintf(b, sizeof b, "%llx", (unsigned long long)v);
               return std::string(b);
             }(w);
    }
  }
  return {};
}

}  // namespace chorus::test
