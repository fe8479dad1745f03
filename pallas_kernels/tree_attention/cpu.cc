// Tree attention over the KV cache for the few queries of a decode or verify step, reading only
// the used slots [0, lengths[b]) of each row (plus the tree block), so a step costs what the
// context holds, not what the cache allocates. The cache is the model's whole stack
// [L, B, S, KV, hd] and the layer is picked inside the kernel (XLA never copies it out); the
// slots of one row are contiguous in it.
//
// Keys are taken by position: a query sees its row's cache slots at positions [0, used) and then
// the tree nodes its mask allows, in index order, at positions used, used + 1, ... (along a tree
// path, each node at its own position). The sum runs in chunks and blocks of fixed positions,
// wherever a key is stored, so a query attends in the same order, to the bit, whether the keys
// before it sit in the cache (a decode step) or in the tree block (a verify pass): with a float32
// cache, verifying a path gives the logits its decode steps would. Work is split into
// (row, kv head, chunk of positions) tasks with an online softmax each, merged in position order
// (flash-decoding); the G query heads of a kv head and the N tree queries share every key read.
#include <limits>
#include <vector>

#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

constexpr int64_t CHUNK = 64;  // positions per task
constexpr int SB = 16;          // positions scored together (one exp per vector of scores)
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline vf load_kv(const float* p) { return load(p); }
inline vf load_kv(const uint16_t* p) { return load_bf16(p); }

template <typename T>
inline float dot(const float* q, const T* k, int hd) {
  vf acc{};
  for (int d = 0; d < hd; d += VL) acc = fma(load(q + d), load_kv(k + d), acc);
  return hsum(acc);
}

// hsums(a)[j] = hsum(a[j]) for VL vectors at once, each pairing its lanes as hsum does (lane i
// with i + VL/2, then with i + VL/4, ...), so the scores of a block of keys are dot()'s to the bit.
// Each step adds two shuffles of two vectors x, y: the pairs of one level, x's sums then y's.
#if defined(__AVX512F__)
constexpr bool BATCHED_SCORES = true;
inline vf add_halves(vf x, vf y) { return _mm512_shuffle_f32x4(x, y, 0x44) + _mm512_shuffle_f32x4(x, y, 0xEE); }
inline vf add_quarters(vf x, vf y) { return _mm512_shuffle_f32x4(x, y, 0x88) + _mm512_shuffle_f32x4(x, y, 0xDD); }
inline vf add_pairs(vf x, vf y) { return _mm512_shuffle_ps(x, y, 0x44) + _mm512_shuffle_ps(x, y, 0xEE); }
inline vf add_neighbours(vf x, vf y) { return _mm512_shuffle_ps(x, y, 0x88) + _mm512_shuffle_ps(x, y, 0xDD); }
inline vf hsums(const vf (&a)[VL]) {  // (the order of a's vectors makes the sums come out in order)
  vf v[4];
  for (int s = 0; s < 4; ++s) v[s] = add_quarters(add_halves(a[s], a[s + 4]), add_halves(a[s + 8], a[s + 12]));
  return add_neighbours(add_pairs(v[0], v[1]), add_pairs(v[2], v[3]));
}
#elif defined(__AVX2__)
constexpr bool BATCHED_SCORES = true;
inline vf add_halves(vf x, vf y) { return _mm256_permute2f128_ps(x, y, 0x20) + _mm256_permute2f128_ps(x, y, 0x31); }
inline vf add_pairs(vf x, vf y) { return _mm256_shuffle_ps(x, y, 0x44) + _mm256_shuffle_ps(x, y, 0xEE); }
inline vf add_neighbours(vf x, vf y) { return _mm256_shuffle_ps(x, y, 0x88) + _mm256_shuffle_ps(x, y, 0xDD); }
inline vf hsums(const vf (&a)[VL]) {
  vf t[4];
  for (int k = 0; k < 4; ++k) t[k] = add_halves(a[k], a[k + 4]);
  return add_neighbours(add_pairs(t[0], t[1]), add_pairs(t[2], t[3]));
}
#else
constexpr bool BATCHED_SCORES = false;
#endif

// scores[j] = dot(q, k + j * stride) for j in [0, SB): VL keys' dot products reduced together
template <typename T>
inline void block_scores(const float* q, const T* k, int64_t stride, int hd, float* scores) {
  if constexpr (BATCHED_SCORES) {
    for (int j0 = 0; j0 < SB; j0 += VL) {
      vf acc[VL] = {};
      for (int d = 0; d < hd; d += VL) {  // the VL keys' sums side by side (each in dot()'s order)
        const vf qd = load(q + d);
        for (int j = 0; j < VL; ++j) acc[j] = fma(qd, load_kv(k + (j0 + j) * stride + d), acc[j]);
      }
      store(scores + j0, hsums(acc));
    }
  } else {
    for (int j = 0; j < SB; ++j) scores[j] = dot(q, k + j * stride, hd);
  }
}

struct Partial {  // one task's online-softmax state for its `rows` queries
  float* max;     // [rows]
  float* sum;     // [rows]
  float* acc;     // [rows, hd]
};

// One batch row and kv head's keys and values by position (see the top of the file).
template <typename T>
struct Keys {
  const T *k_cache, *v_cache;     // slot s at s * stride
  const float *k_tree, *v_tree;   // node j at j * stride
  const int32_t* seen;            // [N, M]: the tree nodes query n sees, in index order
  const int32_t* count;           // [N]: how many
  int64_t used, stride, M;
  int G;
};

// Attend queries q [rows, hd] (pre-scaled; row r is query n = r / G) to the positions
// [p0, p1) of `keys`.
template <typename T>
void attend(const float* q, int rows, int hd, const Keys<T>& keys, int64_t p0, int64_t p1, Partial out) {
  for (int r = 0; r < rows; ++r) out.max[r] = NEG_INF, out.sum[r] = 0.f;
  std::fill(out.acc, out.acc + int64_t(rows) * hd, 0.f);
  alignas(64) float scores[SB];
  for (int64_t s0 = p0; s0 < p1; s0 += SB) {
    const int n = int(std::min<int64_t>(SB, p1 - s0));
    for (int r = 0; r < rows; ++r) {
      const int64_t node = r / keys.G, end = keys.used + keys.count[node];
      const int32_t* seen = keys.seen + node * keys.M;  // position used + i: tree node seen[i]
      const float* qr = q + int64_t(r) * hd;
      // positions s0 + [0, in_cache) are cache slots, s0 + [in_cache, last) tree nodes
      const int last = int(std::clamp<int64_t>(end - s0, 0, n));
      const int in_cache = int(std::clamp<int64_t>(keys.used - s0, 0, last));
      const bool whole = last == SB && in_cache == SB;  // cache slots only: the block at once
      float block_max = NEG_INF;
      if (whole) {
        block_scores(qr, keys.k_cache + s0 * keys.stride, keys.stride, hd, scores);
        vf m = load(scores);
        for (int j = VL; j < SB; j += VL) m = m > load(scores + j) ? m : load(scores + j);
        block_max = hmax(m);
      } else {
        for (int j = 0; j < SB; ++j) scores[j] = NEG_INF;
        for (int j = 0; j < in_cache; ++j) scores[j] = dot(qr, keys.k_cache + (s0 + j) * keys.stride, hd);
        for (int j = in_cache; j < last; ++j) scores[j] = dot(qr, keys.k_tree + seen[s0 + j - keys.used] * keys.stride, hd);
        for (int j = 0; j < last; ++j) block_max = std::max(block_max, scores[j]);
      }
      if (block_max == NEG_INF) continue;
      const float new_max = std::max(out.max[r], block_max);
      // (while the maximum holds, the common case, alpha is exactly 1: no exp to compute)
      const float alpha = new_max == out.max[r] ? 1.f : out.max[r] == NEG_INF ? 0.f : std::exp(out.max[r] - new_max);
      float block_sum = 0.f;
      for (int j = 0; j < SB; j += VL) {
        vf p = exp_nonpositive(load(scores + j) - new_max);
        store(scores + j, p);
        block_sum += hsum(p);
      }
      out.max[r] = new_max;
      out.sum[r] = out.sum[r] * alpha + block_sum;
      float* acc = out.acc + int64_t(r) * hd;
      if (whole && hd % (4 * VL) == 0) {  // the sums below, 4 vectors of the output side by side
        const T* v = keys.v_cache + s0 * keys.stride;
        for (int d = 0; d < hd; d += 4 * VL) {
          vf a[4];
          for (int i = 0; i < 4; ++i) a[i] = load(acc + d + i * VL) * alpha;
          for (int j = 0; j < SB; ++j) {
            const vf p = splat(scores[j]);
            for (int i = 0; i < 4; ++i) a[i] = fma(p, load_kv(v + j * keys.stride + d + i * VL), a[i]);
          }
          for (int i = 0; i < 4; ++i) store(acc + d + i * VL, a[i]);
        }
        continue;
      }
      for (int d = 0; d < hd; d += VL) {
        vf a = load(acc + d) * alpha;
        for (int j = 0; j < in_cache; ++j) a = fma(splat(scores[j]), load_kv(keys.v_cache + (s0 + j) * keys.stride + d), a);
        for (int j = in_cache; j < last; ++j) a = fma(splat(scores[j]), load(keys.v_tree + seen[s0 + j - keys.used] * keys.stride + d), a);
        store(acc + d, a);
      }
    }
  }
}

template <typename T>
void tree_attention(ffi::ThreadPool& pool, const float* q, const T* k_cache, const T* v_cache,
                    const int32_t* lengths, const float* k_tree, const float* v_tree, const bool* mask,
                    float* out, int64_t B, int64_t N, int64_t Hq, int64_t KV, int64_t hd, int64_t S,
                    int64_t M, float scale) {
  const int64_t G = Hq / KV, rows = N * G;
  // each query's visible tree nodes in index order, and each row's positions in all
  std::vector<int32_t> seen(B * N * M), count(B * N), used(B), span(B);
  for (int64_t b = 0; b < B; ++b) {
    used[b] = int32_t(std::clamp<int64_t>(lengths[b], 0, S));
    span[b] = used[b];
    for (int64_t n = 0; n < N; ++n) {
      int32_t c = 0;
      for (int64_t j = 0; j < M; ++j)
        if (mask[(b * N + n) * M + j]) seen[(b * N + n) * M + c++] = int32_t(j);
      count[b * N + n] = c;
      span[b] = std::max(span[b], used[b] + c);
    }
  }
  struct Task { int64_t b, h, start, end; };
  std::vector<Task> tasks;
  std::vector<size_t> first(B * KV + 1);  // the tasks of (b, h): [first[b KV + h], first[... + 1])
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < KV; ++h) {
      first[b * KV + h] = tasks.size();
      for (int64_t s = 0; s < span[b]; s += CHUNK) tasks.push_back({b, h, s, std::min<int64_t>(s + CHUNK, span[b])});
    }
  first[B * KV] = tasks.size();
  // per task: max [rows], sum [rows], acc [rows, hd]; the scaled queries of each (b, h)
  std::vector<float> state(tasks.size() * rows * (hd + 2));
  std::vector<float> queries(B * KV * rows * hd);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const int64_t h = hq / G, r = n * G + hq % G;
        for (int64_t d = 0; d < hd; ++d)
          queries[((b * KV + h) * rows + r) * hd + d] = q[((b * N + n) * Hq + hq) * hd + d] * scale;
      }
  parallel_for(pool, int64_t(tasks.size()), [&](int64_t t) {
    const Task task = tasks[t];
    float* base = state.data() + t * rows * (hd + 2);
    const int64_t cache = (task.b * S * KV + task.h) * hd, tree = (task.b * M * KV + task.h) * hd;
    const Keys<T> keys{k_cache + cache, v_cache + cache, k_tree + tree, v_tree + tree,
                       seen.data() + task.b * N * M, count.data() + task.b * N, used[task.b],
                       KV * hd, M, int(G)};
    attend(queries.data() + (task.b * KV + task.h) * rows * hd, int(rows), int(hd), keys,
           task.start, task.end, Partial{base, base + rows, base + 2 * rows});
  });
  // merge each (b, h)'s tasks, in position order, into the output
  for (int64_t bh = 0; bh < B * KV; ++bh) {
    const int64_t b = bh / KV, h = bh % KV;
    const size_t t0 = first[bh], t1 = first[bh + 1];
    for (int64_t r = 0; r < rows; ++r) {
      float top = NEG_INF;
      for (size_t t = t0; t < t1; ++t) top = std::max(top, state[t * rows * (hd + 2) + r]);
      const int64_t n = r / G, hq = h * G + r % G;
      float* o = out + ((b * N + n) * Hq + hq) * hd;
      std::fill(o, o + hd, 0.f);
      if (top == NEG_INF) continue;  // sees nothing: zeros
      float total = 0.f;
      for (size_t t = t0; t < t1; ++t) {
        const float* base = state.data() + t * rows * (hd + 2);
        if (base[r] == NEG_INF) continue;
        const float w = std::exp(base[r] - top);
        total += base[rows + r] * w;
        const float* acc = base + 2 * rows + r * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += w * acc[d];
      }
      for (int64_t d = 0; d < hd; ++d) o[d] /= total;
    }
  }
}

ffi::Error TreeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_cache,
                         ffi::AnyBuffer v_cache, ffi::Buffer<ffi::S32> index,
                         ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::F32> k_tree,
                         ffi::Buffer<ffi::F32> v_tree, ffi::Buffer<ffi::PRED> mask,
                         ffi::ResultBuffer<ffi::F32> out, float scale) {
  auto qd = q.dimensions(), cd = k_cache.dimensions(), td = k_tree.dimensions();
  if (qd.size() != 4 || cd.size() != 5 || td.size() != 4)
    return ffi::Error::InvalidArgument("tree_attention: q [B,N,Hq,hd], cache [L,B,S,KV,hd], tree [B,M,KV,hd]");
  const int64_t B = qd[0], N = qd[1], Hq = qd[2], hd = qd[3];
  const int64_t L = cd[0], S = cd[2], KV = cd[3], M = td[1];
  if (cd[1] != B || cd[4] != hd || Hq % KV || hd % VL || td[2] != KV || td[3] != hd)
    return ffi::Error::InvalidArgument("tree_attention: shapes disagree (or hd not a multiple of the vector width)");
  const int64_t layer = std::clamp<int64_t>(index.typed_data()[0], 0, L - 1);
  const int64_t offset = layer * B * S * KV * hd;
  const bool* m = reinterpret_cast<const bool*>(mask.untyped_data());
  if (k_cache.element_type() == ffi::F32) {
    tree_attention(pool, q.typed_data(), k_cache.typed_data<float>() + offset,
                   v_cache.typed_data<float>() + offset, lengths.typed_data(), k_tree.typed_data(),
                   v_tree.typed_data(), m, out->typed_data(), B, N, Hq, KV, hd, S, M, scale);
  } else if (k_cache.element_type() == ffi::BF16) {
    tree_attention(pool, q.typed_data(), reinterpret_cast<const uint16_t*>(k_cache.untyped_data()) + offset,
                   reinterpret_cast<const uint16_t*>(v_cache.untyped_data()) + offset,
                   lengths.typed_data(), k_tree.typed_data(), v_tree.typed_data(), m,
                   out->typed_data(), B, N, Hq, KV, hd, S, M, scale);
  } else {
    return ffi::Error::InvalidArgument("tree_attention: the cache must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_tree_attention, TreeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
