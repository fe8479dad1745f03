// y[M, N] = x[M, K] @ W for the few rows of a decode or verify step, each weight read once for
// all M rows. W is one layer of a stack, W = w[index], stored [K, N] ("kn", the model's layer
// weights), in column panels [N / tile, K, tile] (`tile` > 0: a matmul.PanelWeight, where a
// block's weights are one contiguous read instead of K rows strided by N) or [N, K] ("nk", a
// tied embedding read as the LM head), in float32 or bfloat16; accumulation is float32. The
// layer is picked inside the kernel so that XLA never copies a slice of the stack out for it.
#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

#if defined(__AVX512F__)
constexpr int REGISTERS = 32;
#else
constexpr int REGISTERS = 16;
#endif
// Rows held in registers at once over a block of V vectors of columns: R * V accumulators, the V
// weight vectors and one broadcast of x fit the registers (AVX-512: 8 rows of 2 or 3 vectors, 6
// of 4; AVX2: 6, 4, 3).
template <int V>
constexpr int rows_for() { return std::max(3, std::min(8, (REGISTERS - V - 1) / V)); }
constexpr int NV = 4;           // vectors of output columns per block of a row-major weight
constexpr int NB = NV * VL;     // its output columns
constexpr int NK_MR = REGISTERS == 32 ? 6 : 3;  // "nk": rows per block (NK_COLS accumulators each)
constexpr int NK_COLS = 4;      // "nk": output columns per block past NK_STREAM_ROWS rows
constexpr int NK_STREAM_ROWS = 2;
#ifndef PREFETCH
#define PREFETCH 24
#endif

inline vf load_w(const float* p) { return load(p); }
inline vf load_w(const uint16_t* p) { return load_bf16(p); }
inline float scalar_w(float w) { return w; }
inline float scalar_w(uint16_t w) { return bf16_to_float(w); }

// Where column n of W's row 0 is, and the step from a row to the next: [K, N] when tile is 0,
// else column panels [N / tile, K, tile].
struct Columns {
  int64_t K, N, tile;
  int64_t offset(int64_t n) const { return tile ? n / tile * K * tile + n % tile : n; }
  int64_t stride() const { return tile ? tile : N; }
};

// "kn" and panels: rows [m0, m0 + R) times the V-vector column block at n0, over all of K. Every
// output sums its K products in order, whatever R, V and the layout: a row's bits do not depend
// on its neighbours, nor on whether W is in panels.
template <int R, int V, typename W>
void kn_block(const float* x, const W* w, float* y, Columns cols, int64_t m0, int64_t n0) {
  const int64_t K = cols.K, N = cols.N, stride = cols.stride();
  vf acc[R][V] = {};
  const W* wp = w + cols.offset(n0);
  for (int64_t k = 0; k < K; ++k, wp += stride) {
    for (int line = 0; line < int(V * VL * sizeof(W)); line += 64)  // the block's row PREFETCH rows ahead
      __builtin_prefetch(reinterpret_cast<const char*>(wp + PREFETCH * stride) + line);
    vf wv[V];
    for (int v = 0; v < V; ++v) wv[v] = load_w(wp + v * VL);
    for (int r = 0; r < R; ++r) {
      vf xv = splat(x[(m0 + r) * K + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = fma(xv, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) store(y + (m0 + r) * N + n0 + v * VL, acc[r][v]);
}

// All M rows times the V-vector column block at n0, rows_for<V>() rows at a time: a verify's
// 8 rows take one pass over the block's weights as they stream from memory (a panel of 2 or 3
// vectors); more rows, or 4 vectors, find them in L2 on the later passes (K * V * VL values).
template <int V, typename W>
void kn_columns(const float* x, const W* w, float* y, int64_t M, Columns cols, int64_t n0) {
  constexpr int R = rows_for<V>();
  for (int64_t m0 = 0; m0 < M; m0 += R)
    with_rows<R>(std::min<int64_t>(R, M - m0), [&](auto r) { kn_block<decltype(r)::value, V>(x, w, y, cols, m0, n0); });
}

// The vectors of a column block in panels of `tile` columns: 4, 3 or 2, the most that divide the
// panel (0: none do); a row-major weight's blocks are NV vectors.
inline int block_vectors(int64_t tile) {
  if (!tile) return NV;
  if (tile % VL) return 0;
  const int64_t v = tile / VL;
  return v % 4 == 0 ? 4 : v % 3 == 0 ? 3 : v % 2 == 0 ? 2 : 0;
}

// Every column block of W, split over the threads.
template <typename W>
void kn_matmul(ffi::ThreadPool& pool, const float* x, const W* w, float* y, int64_t M, Columns cols) {
  auto run = [&](auto v) {
    constexpr int V = decltype(v)::value;
    parallel_for(pool, cols.N / (V * VL), [&](int64_t b) { kn_columns<V>(x, w, y, M, cols, b * V * VL); });
  };
  switch (block_vectors(cols.tile)) {
    case 2: return run(std::integral_constant<int, 2>{});
    case 3: return run(std::integral_constant<int, 3>{});
    default: return run(std::integral_constant<int, 4>{});
  }
}

template <typename W>
void kn_tail(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < N; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * scalar_w(w[k * N + n]);
      y[m * N + n] = s;
    }
}

// "nk": rows [m0, m0 + R) times the NK_COLS output columns at n0 (contiguous weight rows), so
// that each load of x serves them all.
template <int R, typename W>
void nk_block(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0, int cols) {
  vf acc[R][NK_COLS] = {};
  const int64_t kv = K / VL * VL;
  for (int64_t k = 0; k < kv; k += VL) {
    if (R == NK_MR || m0 == 0)  // the next columns' weight rows, one line per row and step
      for (int c = 0; c < NK_COLS; ++c) __builtin_prefetch(w + (n0 + NK_COLS + c) * K + k);
    vf wv[NK_COLS];
    for (int c = 0; c < NK_COLS; ++c) wv[c] = c < cols ? load_w(w + (n0 + c) * K + k) : vf{};
    for (int r = 0; r < R; ++r) {
      vf xv = load(x + (m0 + r) * K + k);
      for (int c = 0; c < NK_COLS; ++c) acc[r][c] = fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t k = kv; k < K; ++k) s += x[(m0 + r) * K + k] * scalar_w(w[(n0 + c) * K + k]);
      y[(m0 + r) * N + n0 + c] = s;
    }
}

template <typename W>
void nk_columns(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0, int cols) {
  int64_t m = 0;
  for (; m + NK_MR <= M; m += NK_MR) nk_block<NK_MR>(x, w, y, K, N, m, n0, cols);
  switch (M - m) {
    case 1: nk_block<1>(x, w, y, K, N, m, n0, cols); break;
    case 2: nk_block<2>(x, w, y, K, N, m, n0, cols); break;
#if defined(__AVX512F__)
    case 3: nk_block<3>(x, w, y, K, N, m, n0, cols); break;
    case 4: nk_block<4>(x, w, y, K, N, m, n0, cols); break;
    case 5: nk_block<5>(x, w, y, K, N, m, n0, cols); break;
#endif
    default: break;
  }
}

// "nk" for up to NK_STREAM_ROWS rows: output column n alone, its weights one contiguous row of K
// values. A single stream is what the prefetchers follow best (the tied LM head of SmolLM2
// reads ~1.5x faster at one row than four rows side by side); each output sums its products
// as nk_block's do, VL at a time into one accumulator, so a row's bits do not depend on which
// of the two its row count picks.
template <int R, typename W>
void nk_stream(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t n) {
  vf acc[R] = {};
  const W* row = w + n * K;
  const int64_t kv = K / VL * VL;
  for (int64_t k = 0; k < kv; k += VL) {
    vf wv = load_w(row + k);
    for (int r = 0; r < R; ++r) acc[r] = fma(load(x + r * K + k), wv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(acc[r]);
    for (int64_t k = kv; k < K; ++k) s += x[r * K + k] * scalar_w(row[k]);
    y[r * N + n] = s;
  }
}

template <typename W>
void matmul(ffi::ThreadPool& pool, const float* x, const W* w, float* y, int64_t M, int64_t K,
            int64_t N, bool nk, int64_t tile) {
  if (nk) {
    const int64_t per_task = 64;  // output columns per task: weight rows of 64 * K contiguous values
    const int64_t tasks = (N + per_task - 1) / per_task;
    parallel_for(pool, tasks, [&](int64_t t) {
      const int64_t end = std::min(N, (t + 1) * per_task);
      if (M <= NK_STREAM_ROWS) {
        with_rows<NK_STREAM_ROWS>(M, [&](auto r) {
          for (int64_t n = t * per_task; n < end; ++n) nk_stream<decltype(r)::value>(x, w, y, K, N, n);
        });
        return;
      }
      for (int64_t n = t * per_task; n < end; n += NK_COLS)
        nk_columns(x, w, y, M, K, N, n, int(std::min<int64_t>(NK_COLS, end - n)));
    });
    return;
  }
  const Columns cols{K, N, tile};  // panels: the tile divides N into blocks (checked)
  kn_matmul(pool, x, w, y, M, cols);
  const int64_t whole = N / NB * NB;  // a row-major weight's columns past its last block
  if (!tile && whole < N) kn_tail(x, w, y, M, K, N, whole);
}

}  // namespace

// The panel width this build reads fastest for a weight of n output columns (0: none divides n,
// keep it row-major): a panel is one column block, so it streams as one contiguous read; with
// AVX-512 3 vectors (8 verify rows fit the registers: one pass over the weights), else 4.
extern "C" int64_t specjax_matmul_tile(int64_t n) {
  constexpr int preferred = REGISTERS == 32 ? 3 : 4;
  for (int v : {preferred, 4, 3, 2})
    if (n % (v * VL) == 0) return v * VL;
  return 0;
}

namespace {

ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                  ffi::Buffer<ffi::S32> index, ffi::ResultBuffer<ffi::F32> y, bool nk, int64_t tile) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (tile > 0) {  // panels [L, N / tile, K, tile]
    if (xd.size() != 2 || wd.size() != 4 || wd[3] != tile || !block_vectors(tile) || nk)
      return ffi::Error::InvalidArgument("matmul: panels must be [L, N / tile, K, tile], tile a multiple of 2 vectors");
  } else if (xd.size() != 2 || wd.size() != 3) {
    return ffi::Error::InvalidArgument("matmul: x must be [M, K] and w [L, K, N] or [L, N, K]");
  }
  const int64_t M = xd[0], K = xd[1], L = wd[0];
  const int64_t N = tile ? wd[1] * tile : nk ? wd[1] : wd[2];
  if ((tile ? wd[2] : nk ? wd[2] : wd[1]) != K) return ffi::Error::InvalidArgument("matmul: K of x and w differ");
  const int64_t layer = std::clamp<int64_t>(index.typed_data()[0], 0, L - 1);
  const int64_t stride = K * N;
  if (w.element_type() == ffi::F32) {
    matmul(pool, x.typed_data(), w.typed_data<float>() + layer * stride, y->typed_data(), M, K, N, nk, tile);
  } else if (w.element_type() == ffi::BF16) {
    const auto* base = reinterpret_cast<const uint16_t*>(w.untyped_data());
    matmul(pool, x.typed_data(), base + layer * stride, y->typed_data(), M, K, N, nk, tile);
  } else {
    return ffi::Error::InvalidArgument("matmul: weights must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_matmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("nk")
                                  .Attr<int64_t>("tile"));
