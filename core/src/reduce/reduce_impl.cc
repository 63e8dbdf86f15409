// The reduction kernels, compiled once per instruction set (CHORUS_REDUCE_FN names the entry).
//
// Work goes in blocks of kBlock elements that stay in L1, each source folded in, in source
// order, so n sources cost n reads and one write per element, and the plain loops vectorize.
// f16/bf16 are widened to f32 on load and rounded once on store. A block that also goes to a
// second destination (Copy), or is streamed to its destination, is finished in a staging buffer
// and written out from there while it is in L1.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reduce/half.h"
#include "reduce/reduce_kernels.h"
#if defined(__F16C__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace chorus::reduce {
namespace {

constexpr size_t kBlock = 1024;

// Writes n bytes (a finished block, in L1 at src) to dst, with streaming stores when `stream`.
void put(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t n, bool stream) {
  size_t i = 0;
#if defined(__SSE2__)
  if (stream) {
#if defined(__AVX512F__)
    using Vec = __m512i;
#elif defined(__AVX2__)
    using Vec = __m256i;
#else
    using Vec = __m128i;
#endif
    constexpr size_t kVec = sizeof(Vec);
    i = std::min(n, (kVec - reinterpret_cast<uintptr_t>(dst) % kVec) % kVec);  // until dst is aligned
    std::memcpy(dst, src, i);
    for (; i + kVec <= n; i += kVec) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<Vec*>(dst + i), _mm512_loadu_si512(src + i));
#elif defined(__AVX2__)
      _mm256_stream_si256(reinterpret_cast<Vec*>(dst + i), _mm256_loadu_si256(reinterpret_cast<const Vec*>(src + i)));
#else
      _mm_stream_si128(reinterpret_cast<Vec*>(dst + i), _mm_loadu_si128(reinterpret_cast<const Vec*>(src + i)));
#endif
    }
  }
#endif
  std::memcpy(dst + i, src + i, n - i);
}

// Whether a finished block is written from a staging buffer rather than folded in place.
bool writes_staged(const Copy& copy) { return copy.to != nullptr || copy.stream_dst; }

// Writes a finished block (n bytes at src, in L1), `at` bytes into the result, to dst and to copy.to.
void write_block(uint8_t* dst, const uint8_t* src, size_t at, size_t n, const Copy& copy) {
  put(dst + at, src, n, copy.stream_dst);
  if (copy.to) put(static_cast<uint8_t*>(copy.to) + at, src, n, copy.stream);
}

// After the last block: streaming stores are weakly ordered, finish them before anything else.
void finish_copy(const Copy& copy) {
#if defined(__SSE2__)
  if ((copy.to && copy.stream) || copy.stream_dst) _mm_sfence();
#else
  (void)copy;
#endif
}

template <class T>
using Wide = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;

template <class T>
struct Sum {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return T(Wide<T>(a) + Wide<T>(b));
    else
      return a + b;
  }
};
template <class T>
struct Prod {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return T(Wide<T>(a) * Wide<T>(b));
    else
      return a * b;
  }
};
// NaN-propagating, like torch: a NaN on either side wins.
template <class T>
struct Min {
  static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
template <class T>
struct Max {
  static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};
template <class T>
struct And {
  static T apply(T a, T b) { return T(a & b); }
};
template <class T>
struct Or {
  static T apply(T a, T b) { return T(a | b); }
};
template <class T>
struct Xor {
  static T apply(T a, T b) { return T(a ^ b); }
};

// Same-type fold, block by block. The first two sources are combined straight into the
// destination (one pass, no staging), later sources fold into it while the block is in L1.
// The block goes through a staging buffer only when the destination is also a later source (its
// block would be overwritten before it is read), or when it also goes to copy.to or is streamed.
template <class T, template <class> class Op>
void fold_plain(const void* const* srcs, int n, void* dst_v, size_t count, bool mean, const Copy& copy) {
  T* dst = static_cast<T*>(dst_v);
  bool staged = writes_staged(copy);
  for (int p = 2; p < n; ++p) staged = staged || srcs[p] == dst_v;
  alignas(64) T stage[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    T* __restrict out = staged ? stage : dst + base;
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    if (n == 1) {
      std::memmove(out, s0, m * sizeof(T));
    } else {
      const T* s1 = static_cast<const T*>(srcs[1]) + base;
      for (size_t i = 0; i < m; ++i) out[i] = Op<T>::apply(s0[i], s1[i]);
    }
    for (int p = 2; p < n; ++p) {
      const T* __restrict s = static_cast<const T*>(srcs[p]) + base;
      for (size_t i = 0; i < m; ++i) out[i] = Op<T>::apply(out[i], s[i]);
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (mean) {
        const T div = T(copy.mean_of ? copy.mean_of : n);
        for (size_t i = 0; i < m; ++i) out[i] /= div;
      }
    }
    if (writes_staged(copy))
      write_block(static_cast<uint8_t*>(dst_v), reinterpret_cast<const uint8_t*>(stage), base * sizeof(T),
                  m * sizeof(T), copy);
    else if (staged)
      std::memcpy(dst + base, stage, m * sizeof(T));
  }
  finish_copy(copy);
}

void load_f16(float* __restrict out, const uint16_t* __restrict in, size_t m) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= m; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < m; ++i) out[i] = half_to_float(in[i]);
}
void store_f16(uint16_t* __restrict out, const float* __restrict in, size_t m) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= m; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < m; ++i) out[i] = float_to_half(in[i]);
}
void load_bf16(float* __restrict out, const uint16_t* __restrict in, size_t m) {
  for (size_t i = 0; i < m; ++i) out[i] = bf16_to_float(in[i]);
}
void store_bf16(uint16_t* __restrict out, const float* __restrict in, size_t m) {
  for (size_t i = 0; i < m; ++i) out[i] = float_to_bf16(in[i]);
}

// 16-bit float fold: widen to f32, fold, round once.
template <template <class> class Op, bool kBf16>
void fold_half(const void* const* srcs, int n, void* dst_v, size_t count, bool mean, const Copy& copy) {
  uint16_t* dst = static_cast<uint16_t*>(dst_v);
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  alignas(64) uint16_t stage[kBlock];
  auto load = kBf16 ? &load_bf16 : &load_f16;
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    load(acc, static_cast<const uint16_t*>(srcs[0]) + base, m);
    for (int p = 1; p < n; ++p) {
      load(tmp, static_cast<const uint16_t*>(srcs[p]) + base, m);
      for (size_t i = 0; i < m; ++i) acc[i] = Op<float>::apply(acc[i], tmp[i]);
    }
    if (mean) {
      const float div = float(copy.mean_of ? copy.mean_of : n);
      for (size_t i = 0; i < m; ++i) acc[i] /= div;
    }
    uint16_t* out = writes_staged(copy) ? stage : dst + base;
    if constexpr (kBf16)
      store_bf16(out, acc, m);
    else
      store_f16(out, acc, m);
    if (writes_staged(copy))
      write_block(reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(stage), base * 2, m * 2, copy);
  }
  finish_copy(copy);
}

template <class T>
void dispatch_plain(ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, const Copy& copy) {
  switch (op) {
    case ReduceOp::Sum: return fold_plain<T, Sum>(srcs, n, dst, count, false, copy);
    case ReduceOp::Mean: return fold_plain<T, Sum>(srcs, n, dst, count, true, copy);
    case ReduceOp::Product: return fold_plain<T, Prod>(srcs, n, dst, count, false, copy);
    case ReduceOp::Min: return fold_plain<T, Min>(srcs, n, dst, count, false, copy);
    case ReduceOp::Max: return fold_plain<T, Max>(srcs, n, dst, count, false, copy);
    case ReduceOp::BitwiseAnd:
      if constexpr (std::is_integral_v<T>) return fold_plain<T, And>(srcs, n, dst, count, false, copy);
      break;
    case ReduceOp::BitwiseOr:
      if constexpr (std::is_integral_v<T>) return fold_plain<T, Or>(srcs, n, dst, count, false, copy);
      break;
    case ReduceOp::BitwiseXor:
      if constexpr (std::is_integral_v<T>) return fold_plain<T, Xor>(srcs, n, dst, count, false, copy);
      break;
  }
}

template <bool kBf16>
void dispatch_half(ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, const Copy& copy) {
  switch (op) {
    case ReduceOp::Sum: return fold_half<Sum, kBf16>(srcs, n, dst, count, false, copy);
    case ReduceOp::Mean: return fold_half<Sum, kBf16>(srcs, n, dst, count, true, copy);
    case ReduceOp::Product: return fold_half<Prod, kBf16>(srcs, n, dst, count, false, copy);
    case ReduceOp::Min: return fold_half<Min, kBf16>(srcs, n, dst, count, false, copy);
    case ReduceOp::Max: return fold_half<Max, kBf16>(srcs, n, dst, count, false, copy);
    default: return;
  }
}

// Bools are bytes holding 0 or 1: or-like and and-like ops keep them so.
void dispatch_bool(ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, const Copy& copy) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BitwiseOr: return fold_plain<uint8_t, Or>(srcs, n, dst, count, false, copy);
    case ReduceOp::Product:
    case ReduceOp::Min:
    case ReduceOp::BitwiseAnd: return fold_plain<uint8_t, And>(srcs, n, dst, count, false, copy);
    case ReduceOp::BitwiseXor: return fold_plain<uint8_t, Xor>(srcs, n, dst, count, false, copy);
    case ReduceOp::Mean: return;
  }
}

}  // namespace

void CHORUS_REDUCE_FN(DataType dtype, ReduceOp op, const void* const* srcs, int n, void* dst, size_t count, Copy copy) {
  switch (dtype) {
    case DataType::Float32: return dispatch_plain<float>(op, srcs, n, dst, count, copy);
    case DataType::Float64: return dispatch_plain<double>(op, srcs, n, dst, count, copy);
    case DataType::Float16: return dispatch_half<false>(op, srcs, n, dst, count, copy);
    case DataType::BFloat16: return dispatch_half<true>(op, srcs, n, dst, count, copy);
    case DataType::Int8: return dispatch_plain<int8_t>(op, srcs, n, dst, count, copy);
    case DataType::UInt8: return dispatch_plain<uint8_t>(op, srcs, n, dst, count, copy);
    case DataType::Int16: return dispatch_plain<int16_t>(op, srcs, n, dst, count, copy);
    case DataType::Int32: return dispatch_plain<int32_t>(op, srcs, n, dst, count, copy);
    case DataType::Int64: return dispatch_plain<int64_t>(op, srcs, n, dst, count, copy);
    case DataType::Bool: return dispatch_bool(op, srcs, n, dst, count, copy);
  }
}

}  // namespace chorus::reduce
