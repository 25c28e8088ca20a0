// What the CPU kernels here share: vector helpers over AVX-512 or AVX2 intrinsics where the compiler targets them
// (VLLM_JAX_SIMD; the widening of bytes to 32-bit lanes is one instruction there, and GCC does not vectorize it
// from plain loops; other CPUs take the kernels' plain loops), float16 to float32, and the split of a call's work
// between the calling thread and XLA's intra-op thread pool.

#pragma once

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace vllm_jax_native {

namespace ffi = xla::ffi;

inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int shift = 0;
    while (!(mantissa & 0x400)) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((mantissa & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float scalar_half(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return half_to_float(h);
#endif
}

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
using VecF = __m512;
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vset1(float v) { return _mm512_set1_ps(v); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* dst, VecF v) { _mm512_storeu_ps(dst, v); }
inline VecF vload(const float* src) { return _mm512_loadu_ps(src); }
inline float vsum(VecF v) { return _mm512_reduce_add_ps(v); }
inline __m512i widen_u8(const uint8_t* src) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}
inline VecF low_nibbles(__m512i q) { return _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))); }
inline VecF high_nibbles(__m512i q) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)); }
inline VecF load_i8(const uint8_t* src) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
}
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vload_half(const uint16_t* src) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}
inline VecF vmax(VecF a, VecF b) { return _mm512_max_ps(a, b); }
inline VecF vround(VecF a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^n for whole-number floats n in [-126, 127]: n + 127 moved into the exponent bits.
inline VecF vpow2(VecF n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#define VLLM_JAX_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kLanes = 8;
using VecF = __m256;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vset1(float v) { return _mm256_set1_ps(v); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* dst, VecF v) { _mm256_storeu_ps(dst, v); }
inline VecF vload(const float* src) { return _mm256_loadu_ps(src); }
inline float vsum(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline __m256i widen_u8(const uint8_t* src) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
}
inline VecF low_nibbles(__m256i q) { return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15))); }
inline VecF high_nibbles(__m256i q) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)); }
inline VecF load_i8(const uint8_t* src) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src))));
}
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vload_half(const uint16_t* src) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
#else
  alignas(32) float f[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) f[i] = half_to_float(src[i]);
  return _mm256_load_ps(f);
#endif
}
inline VecF vmax(VecF a, VecF b) { return _mm256_max_ps(a, b); }
inline VecF vround(VecF a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VecF vpow2(VecF n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#define VLLM_JAX_SIMD 1
#endif

#ifdef VLLM_JAX_SIMD
// exp(x) for x <= 0 (softmax terms after the max is subtracted): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its
// Taylor polynomial to degree 7 (relative error below 2e-8 there, under float32's rounding), times 2^n. Inputs
// below -87 give exp(-87) ~ 1.6e-38 instead of a denormal or zero: nothing next to the max's term of 1.
inline VecF vexp_nonpositive(VecF x) {
  x = vmax(x, vset1(-87.0f));
  const VecF n = vround(vmul(x, vset1(1.44269504088896341f)));
  VecF r = vfma(n, vset1(-0.693145751953125f), x);  // ln 2 in two parts, so n ln2 is exact enough
  r = vfma(n, vset1(-1.42860682030941723212e-6f), r);
  VecF p = vset1(1.0f / 5040.0f);
  p = vfma(p, r, vset1(1.0f / 720.0f));
  p = vfma(p, r, vset1(1.0f / 120.0f));
  p = vfma(p, r, vset1(1.0f / 24.0f));
  p = vfma(p, r, vset1(1.0f / 6.0f));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  return vmul(p, vpow2(n));
}
#endif

// Runs work(unit) for units 0 .. units - 1 on the calling thread and, when `parallel`, on helper tasks of XLA's
// pool: each unit is taken once from a shared counter, and the caller returns when every unit is done.
template <class Work>
void run_units(ffi::ThreadPool& pool, int64_t units, bool parallel, Work work) {
  struct State {
    Work work;
    int64_t units;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    State(Work w, int64_t n) : work(std::move(w)), units(n) {}
    void take() {
      int64_t unit;
      while ((unit = next.fetch_add(1, std::memory_order_relaxed)) < units) {
        work(unit);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto state = std::make_shared<State>(std::move(work), units);
  const int64_t helpers = parallel ? std::min<int64_t>(pool.num_threads(), units) - 1 : 0;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([state] { state->take(); });
  state->take();
  while (state->done.load(std::memory_order_acquire) < units) std::this_thread::yield();
}

// Several dots whose outputs are sums over a reduction axis, dot j's axis cut into parts[j] ranges, a unit each
// (run_units): unit (j, 0) sums into ys[j] (zeroed by the caller), unit (j, k > 0) into a partial of its own
// (sizes[j] floats), and the partials are added into ys[j] once every unit is done. range(j, k, dst) runs one unit.
template <class Range>
void run_split_sums(ffi::ThreadPool& pool, bool parallel, const std::vector<int64_t>& parts,
                    const std::vector<float*>& ys, const std::vector<int64_t>& sizes, Range range) {
  const size_t n = parts.size();
  std::vector<int64_t> first_unit(n + 1, 0);
  for (size_t j = 0; j < n; ++j) first_unit[j + 1] = first_unit[j] + parts[j];
  std::vector<std::vector<float>> partials(first_unit[n]);
  run_units(pool, first_unit[n], parallel, [&](int64_t unit) {
    const size_t j = std::upper_bound(first_unit.begin(), first_unit.end(), unit) - first_unit.begin() - 1;
    const int64_t k = unit - first_unit[j];
    float* dst = ys[j];
    if (k > 0) {
      partials[unit].assign(sizes[j], 0.0f);
      dst = partials[unit].data();
    }
    range(j, k, dst);
  });
  for (size_t j = 0; j < n; ++j)
    for (int64_t unit = first_unit[j] + 1; unit < first_unit[j + 1]; ++unit)
      for (int64_t e = 0; e < sizes[j]; ++e) ys[j][e] += partials[unit][e];
}

}  // namespace vllm_jax_native
