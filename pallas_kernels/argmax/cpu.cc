// Argmax over the last axis of x [M, V] float32: the first index of the maximum, or of the first
// NaN where a row has one (jnp.argmax's rule). A greedy step reads one vocabulary-wide row of
// logits (a verify pass one per tree node): XLA's variadic reduce takes ~0.2 ms for 49152
// entries, this a few microseconds. Rows are split in chunks that the threads take; the chunks of
// a row are merged in order, so the result does not depend on the split.
#include <limits>
#include <vector>

#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

constexpr int64_t CHUNK = 16384;  // entries a task reads (64 KB)

struct Best {  // a chunk's first maximum (or first NaN)
  float value;
  int64_t index;
  bool nan;
};

// The first maximum of x[0, n) (n > 0), or its first NaN; index relative to x.
Best chunk_argmax(const float* x, int64_t n) {
  vf best = splat(-std::numeric_limits<float>::infinity());
  vi lane, where, nan{};  // where: each lane's first position of its maximum (all -inf: its first)
  for (int l = 0; l < VL; ++l) lane[l] = l;
  where = lane;
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    const vf v = load(x + i);
    const vi above = v > best;  // strictly: a lane keeps the first position of its maximum
    best = above ? v : best;
    where = above ? lane + int32_t(i) : where;
    nan |= v != v;
  }
  bool has_nan = false;
  for (int l = 0; l < VL; ++l) has_nan |= nan[l] != 0;
  for (int64_t j = i; j < n; ++j) has_nan |= x[j] != x[j];
  if (has_nan)
    for (int64_t j = 0; j < n; ++j)
      if (x[j] != x[j]) return {x[j], j, true};
  Best out{hmax(best), n, false};
  for (int l = 0; l < VL; ++l)
    if (best[l] == out.value) out.index = std::min<int64_t>(out.index, where[l]);
  for (; i < n; ++i)
    if (x[i] > out.value) out.value = x[i], out.index = i;
  return out;
}

ffi::Error Argmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::S32> out) {
  auto xd = x.dimensions();
  if (xd.size() != 2 || xd[1] == 0) return ffi::Error::InvalidArgument("argmax: x [M, V] with V > 0");
  const int64_t M = xd[0], V = xd[1], chunks = (V + CHUNK - 1) / CHUNK;
  std::vector<Best> best(M * chunks);
  parallel_for(pool, M * chunks, [&](int64_t t) {
    const int64_t m = t / chunks, c = t % chunks, start = c * CHUNK;
    Best b = chunk_argmax(x.typed_data() + m * V + start, std::min(CHUNK, V - start));
    b.index += start;
    best[t] = b;
  });
  for (int64_t m = 0; m < M; ++m) {
    Best row = best[m * chunks];
    for (int64_t c = 1; c < chunks && !row.nan; ++c) {
      const Best& b = best[m * chunks + c];
      if (b.nan || b.value > row.value) row = b;  // later chunks win only when strictly larger
    }
    out->typed_data()[m] = int32_t(row.index);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_argmax, Argmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
