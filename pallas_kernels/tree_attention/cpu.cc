// Tree attention over the KV cache for the few queries of a decode or verify step, reading only
// the used slots [0, lengths[b]) of each row (plus the tree block), so a step costs what the
// context holds, not what the cache allocates. The cache is the model's whole stack
// [L, B, S, KV, hd] and the layer is picked inside the kernel (XLA never copies it out); the
// slots of one row are contiguous in it. Work is split into (row, kv head, chunk of slots)
// tasks with an online softmax each, merged at the end (flash-decoding); the G query heads of a
// kv head and the N tree queries share every key and value read.
#include <limits>
#include <vector>

#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

constexpr int64_t CHUNK = 256;  // cache slots per task
constexpr int SB = 16;          // slots scored together (one exp per vector of scores)
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline vf load_kv(const float* p) { return load(p); }
inline vf load_kv(const uint16_t* p) { return load_bf16(p); }

struct Partial {  // one task's online-softmax state for its `rows` queries
  float* max;     // [rows]
  float* sum;     // [rows]
  float* acc;     // [rows, hd]
};

// Attend queries q [rows, hd] (pre-scaled) to `count` keys/values at k, v (row stride `stride`
// elements); visible(r, j) says whether query r sees key j.
template <typename T, typename Visible>
void attend(const float* q, int rows, int hd, const T* k, const T* v, int64_t count, int64_t stride,
            Visible visible, Partial out) {
  for (int r = 0; r < rows; ++r) out.max[r] = NEG_INF, out.sum[r] = 0.f;
  std::fill(out.acc, out.acc + int64_t(rows) * hd, 0.f);
  alignas(64) float scores[SB];
  for (int64_t s0 = 0; s0 < count; s0 += SB) {
    const int n = int(std::min<int64_t>(SB, count - s0));
    for (int r = 0; r < rows; ++r) {
      const float* qr = q + int64_t(r) * hd;
      float block_max = NEG_INF;
      for (int j = 0; j < SB; ++j) {
        float s = NEG_INF;
        if (j < n && visible(r, s0 + j)) {
          const T* kj = k + (s0 + j) * stride;
          vf dot{};
          for (int d = 0; d < hd; d += VL) dot += load(qr + d) * load_kv(kj + d);
          s = hsum(dot);
        }
        scores[j] = s;
        block_max = std::max(block_max, s);
      }
      if (block_max == NEG_INF) continue;
      const float new_max = std::max(out.max[r], block_max);
      const float alpha = out.max[r] == NEG_INF ? 0.f : std::exp(out.max[r] - new_max);
      float block_sum = 0.f;
      for (int j = 0; j < SB; j += VL) {
        vf p = exp_nonpositive(load(scores + j) - new_max);
        store(scores + j, p);
        block_sum += hsum(p);
      }
      out.max[r] = new_max;
      out.sum[r] = out.sum[r] * alpha + block_sum;
      float* acc = out.acc + int64_t(r) * hd;
      for (int d = 0; d < hd; d += VL) {
        vf a = load(acc + d) * alpha;
        for (int j = 0; j < n; ++j) a += scores[j] * load_kv(v + (s0 + j) * stride + d);
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
  struct Task { int64_t b, h, start, count; };  // count < 0: the tree block
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t used = std::clamp<int64_t>(lengths[b], 0, S);
    for (int64_t h = 0; h < KV; ++h) {
      for (int64_t s = 0; s < used; s += CHUNK) tasks.push_back({b, h, s, std::min(CHUNK, used - s)});
      tasks.push_back({b, h, 0, -1});
    }
  }
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
    Partial part{base, base + rows, base + 2 * rows};
    const float* qs = queries.data() + (task.b * KV + task.h) * rows * hd;
    if (task.count >= 0) {
      const int64_t offset = ((task.b * S + task.start) * KV + task.h) * hd;
      attend(qs, int(rows), int(hd), k_cache + offset, v_cache + offset, task.count, KV * hd,
             [](int, int64_t) { return true; }, part);
    } else {
      const int64_t offset = (task.b * M * KV + task.h) * hd;
      const bool* m = mask + task.b * N * M;
      attend(qs, int(rows), int(hd), k_tree + offset, v_tree + offset, M, KV * hd,
             [&](int r, int64_t j) { return m[(r / G) * M + j]; }, part);
    }
  });
  // merge each (b, h)'s tasks (they are consecutive) into the output
  for (size_t t0 = 0; t0 < tasks.size();) {
    size_t t1 = t0;
    while (t1 < tasks.size() && tasks[t1].b == tasks[t0].b && tasks[t1].h == tasks[t0].h) ++t1;
    const int64_t b = tasks[t0].b, h = tasks[t0].h;
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
    t0 = t1;
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
