// Shared by the CPU kernels: the host's vector type (GCC vector extensions, so one source
// serves AVX-512, AVX2 and a portable 128-bit fallback) and a parallel-for on XLA's own
// intra-op thread pool, so the kernels never compete with a second pool for the cores.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace specjax_cpu {

#if defined(__AVX512F__)
constexpr int VL = 16;
#elif defined(__AVX__)
constexpr int VL = 8;
#else
constexpr int VL = 4;
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vf_u __attribute__((vector_size(VL * 4), aligned(4)));  // unaligned access
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef int8_t vi8_u __attribute__((vector_size(VL), aligned(1)));
typedef uint16_t vu16_u __attribute__((vector_size(VL * 2), aligned(2)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_u*>(p) = v; }
inline vf splat(float x) { return vf{} + x; }
// a * b + c rounded once, spelled out: left to contraction, GCC fused the same expression in one
// loop and not in another (the AVX2 build's LM head), and rows that must agree to the bit did not.
inline vf fma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// VL bfloat16 values -> float32 (a bfloat16 is the top half of a float32).
inline vf load_bf16(const uint16_t* p) {
#if defined(__AVX512F__)
  vu wide = reinterpret_cast<vu>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__AVX2__)
  vu wide = reinterpret_cast<vu>(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  vu wide = __builtin_convertvector(*reinterpret_cast<const vu16_u*>(p), vu);
#endif
  return reinterpret_cast<vf>(wide << 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// VL int8 values, sign-extended to int32 (intrinsics: GCC scalarizes this convertvector).
inline vi load_i8(const int8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vi>(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return reinterpret_cast<vi>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  return __builtin_convertvector(*reinterpret_cast<const vi8_u*>(p), vi);
#endif
}
inline vf to_float(vi v) { return __builtin_convertvector(v, vf); }

inline float hmax(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(v);
#elif defined(__AVX__)
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
#else
  float m = v[0];
  for (int i = 1; i < VL; ++i) m = std::max(m, v[i]);
  return m;
#endif
}

inline float hsum(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#elif defined(__AVX__)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
#else
  float s = 0.f;
  for (int i = 0; i < VL; ++i) s += v[i];
  return s;
#endif
}

// exp(x) for x <= 0 (softmax weights), relative error ~2e-7; exp(-inf) and very negative x -> 0.
inline vf exp_nonpositive(vf x) {
  const vf lo = splat(-87.3f);
  vi tiny = x < lo;
  x = x < lo ? lo : x;
  vf n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504f + (x < 0 ? -0.5f : 0.5f), vi), vf);
  vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf out = p * reinterpret_cast<vf>(bits);
  return tiny ? vf{} : out;
}

// f(std::integral_constant<int, rows>) for 0 < rows <= R: a block of rows held in registers.
template <int R, typename F>
void with_rows(int64_t rows, F&& f) {
  if constexpr (R > 0) {
    if (rows == R) f(std::integral_constant<int, R>{});
    else with_rows<R - 1>(rows, f);
  }
}

// Run body(i) for i in [0, n < 2^32) on the caller and XLA's intra-op threads. Worker w owns the
// w-th contiguous range of the items and takes them front to back, so each thread streams one
// contiguous stretch of the weights and the hardware prefetchers keep up from item to item (items
// dealt round-robin start a new stream each: SmolLM2's int4 decode step took ~20% longer); a
// worker done with its own range takes the last items of the others. Ranges are claimed by atomic
// front / back counters, so a pool task that starts late finds its range taken by the others
// and the caller never waits for a task that has not started (no deadlock when the pool is busy
// or has one thread).
template <typename F>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t n, F body) {
  if (n <= 0) return;
  const int64_t workers = std::min<int64_t>(n, std::max<int64_t>(1, pool.num_threads()));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct Range {  // [front, back) of the items not yet claimed, packed so one CAS claims
    alignas(64) std::atomic<uint64_t> bounds;
  };
  struct Shared {
    std::unique_ptr<Range[]> ranges;
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  shared->ranges.reset(new Range[workers]);
  for (int64_t w = 0; w < workers; ++w)
    shared->ranges[w].bounds.store(uint64_t(n * w / workers) << 32 | uint64_t(n * (w + 1) / workers));
  auto claim = [](Range& r, bool from_front) -> int64_t {  // an item of r, or -1 if none is left
    uint64_t b = r.bounds.load();
    for (;;) {
      const uint64_t front = b >> 32, back = b & 0xFFFFFFFFu;
      if (front >= back) return -1;
      const uint64_t next = from_front ? (front + 1) << 32 | back : front << 32 | (back - 1);
      if (r.bounds.compare_exchange_weak(b, next)) return int64_t(from_front ? front : back - 1);
    }
  };
  auto* fn = &body;
  // The caller waits until every claimed item is done, so `fn` outlives each use of it; a task
  // that starts after the end only touches `shared`, which it co-owns.
  auto work = [shared, fn, workers, claim](int64_t w) {
    for (int64_t k = 0; k < workers; ++k) {
      Range& r = shared->ranges[(w + k) % workers];
      for (int64_t i; (i = claim(r, k == 0)) >= 0;) {
        (*fn)(i);
        shared->done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  for (int64_t t = 1; t < workers; ++t) pool.Schedule([work, t] { work(t); });
  work(0);
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace specjax_cpu
