// The vector type and the spelled-out fused multiply-add the kernels share: built with
// -ffp-contract=off, every rounding is the source's, whatever the compiler's tuning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace metrale {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef float vfu __attribute__((vector_size(kLanes * 4), aligned(4)));

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }

// acc + x * w with one rounding, spelled out: left to the compiler (-ffp-contract), whether it fuses
// depends on its tuning and the block shape (AMD tunings skip fusing some accumulation chains), and
// a row's result would then change with the row count.
inline vf multiply_add(vf x, vf w, vf acc) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)x, (__m512)w, (__m512)acc);
#elif defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)x, (__m256)w, (__m256)acc);
#else
  return acc + x * w;  // no fused instruction: built with -ffp-contract=off, so never fused
#endif
}

// The sum of a vector's lanes, pairwise halves: the same order for every call.
inline float lane_total(vf v) {
  float lanes[kLanes];
  __builtin_memcpy(lanes, &v, sizeof lanes);
  for (int h = kLanes / 2; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) lanes[i] += lanes[i + h];
  return lanes[0];
}


typedef int32_t vi __attribute__((vector_size(kLanes * 4)));

// exp(x): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6 polynomial (~1 ulp), 2^n in the exponent.
// Element-wise: a value's result is the same in any lane, vector or scalar call.
inline vf vexp(vf x) {
  const vf hi = vf{} + 88.0f, lo = vf{} - 87.0f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const vf magic = vf{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  vf n = (x * 1.44269504f + magic) - magic;
  vf r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  vf p = vf{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * (vf)bits;
}

inline float sexp(float x) {
  vf v = vexp(vf{} + x);
  return v[0];
}

// Lane sums, pairwise: at each half-width h, lane i < h of an output takes lane i + h; the same order
// for every output whatever block computes it. Many accumulators are summed at once, packed into
// shared vectors (a few shuffles per output instead of a scalar chain each).
// Lane i of halving (a, b) at half-width h: a holds kLanes / 2h outputs of 2h partial sums, b after it.
constexpr int source_lane(int i, int h, bool upper) {
  int per_vector = kLanes / (2 * h), output = i / h, base = output < per_vector ? output * 2 * h
                                                                             : kLanes + (output - per_vector) * 2 * h;
  return base + i % h + (upper ? h : 0);
}

template <int h, size_t... I>
inline vf halve(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, source_lane(I, h, false)...) +
         __builtin_shufflevector(a, b, source_lane(I, h, true)...);
}

// The sums of count accumulators (a power of two, at most kLanes) into the first count lanes of v[0].
template <int h, int count>
inline void lane_sums(vf* v) {
  if constexpr (h >= 1) {
    constexpr int pairs = count > 1 ? count / 2 : 1;
    for (int i = 0; i < pairs; ++i)
      v[i] = halve<h>(v[2 * i], v[count > 1 ? 2 * i + 1 : 0], std::make_index_sequence<kLanes>{});
    lane_sums<h / 2, pairs>(v);
  }
}

}  // namespace metrale
