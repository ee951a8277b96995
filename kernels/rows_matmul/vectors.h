// The vector type and the spelled-out fused multiply-add the kernels share: built with
// -ffp-contract=off, every rounding is the source's, whatever the compiler's tuning.
#pragma once

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

}  // namespace metrale
