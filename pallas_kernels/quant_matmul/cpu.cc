// y[M, N] = x[M, K] @ dequantize(qw[index]) for the few rows of a decode or verify step, the
// int8 / int4 weights read once for all M rows and never expanded in memory: each weight vector
// is converted and scaled in registers (weight-only: exact to float rounding). Layout as
// weight.py: data [L, K/P, N] int8, one byte holding plane 0's row r (low nibble for int4) and
// plane 1's row r (high nibble), plane p being rows [p K/P, (p+1) K/P); scales [L, P, K/(P g), N].
// With a tile t the columns come in panels of t, data [L, N/t, K/P, t] and scales
// [L, N/t, P, K/(P g), t]: a panel is one contiguous read, and a thread takes whole panels.
#include <type_traits>

#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

#if defined(__AVX512F__)  // (8 rows of 2 vectors measured slower at 4 and 8 rows)
constexpr int MR = 4;
constexpr int NV = 4;
#else
constexpr int MR = 3;
constexpr int NV = 2;
#endif
constexpr int NB = NV * VL;
constexpr int PREFETCH = 24;  // rows ahead
constexpr int MAX_GROUP = 128;  // weight.py's largest group size

struct Weight {
  const int8_t* data;    // [K/P, N], or panels [N/t, K/P, t]
  const float* scales;   // [P, K/(P g), N], or panels [N/t, P, K/(P g), t]
  int64_t K, N, group, pack, tile;

  // Column n0 onwards: where its first data row and its first scale row start, and the distance
  // between consecutive rows of either (N row-major; t in a panel, whose t columns hold n0).
  int64_t stride() const { return tile ? tile : N; }
  const int8_t* data_at(int64_t n0) const {
    return tile ? data + (n0 / tile) * (K / pack) * tile + n0 % tile : data + n0;
  }
  const float* scales_at(int64_t n0) const {
    return tile ? scales + (n0 / tile) * (K / group) * tile + n0 % tile : scales + n0;
  }
};

// The NV weight vectors of row r (of every plane) of the column block at n0, converted and scaled.
template <int P>
inline void convert_row(const int8_t* q, const vf (&scale)[P][NV], vf (&wv)[P][NV]) {
  for (int v = 0; v < NV; ++v) {
    vi b = load_i8(q + v * VL);
    if constexpr (P == 1) {
      wv[0][v] = to_float(b) * scale[0][v];
    } else {  // sign-extended byte: low nibble by shifts, high nibble by an arithmetic shift
      wv[0][v] = to_float((b << 28) >> 28) * scale[0][v];
      wv[P - 1][v] = to_float(b >> 4) * scale[P - 1][v];
    }
  }
}

template <int P>
inline void load_scales(const Weight& w, const float* scales, int64_t g, vf (&scale)[P][NV]) {
  const int64_t groups = w.K / P / w.group;
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < NV; ++v) scale[p][v] = load(scales + (p * groups + g) * w.stride() + v * VL);
}

// acc[i] += x's row m0 + i times the weight row: the FMAs every path shares (same order, so the
// converted and the buffered paths give the same bits)
template <int R, int P>
inline void accumulate(vf (&acc)[R][NV], const float* x, int64_t K, int64_t rows, int64_t m0, int64_t r,
                       const vf (&wv)[P][NV]) {
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < P; ++p) {
      vf xv = splat(x[(m0 + i) * K + p * rows + r]);
      for (int v = 0; v < NV; ++v) acc[i][v] += xv * wv[p][v];
    }
}

// rows [m0, m0 + R) times the column block at n0, converting each weight vector in registers
template <int R, int P>
void block(const float* x, const Weight& w, float* y, int64_t m0, int64_t n0) {
  vf acc[R][NV] = {};
  const int64_t rows = w.K / P, groups = rows / w.group, stride = w.stride();
  const int8_t* data = w.data_at(n0);
  for (int64_t g = 0; g < groups; ++g) {
    vf scale[P][NV], wv[P][NV];
    load_scales<P>(w, w.scales_at(n0), g, scale);
    for (int64_t r = g * w.group; r < (g + 1) * w.group; ++r) {
      const int8_t* q = data + r * stride;
      for (int line = 0; line < NB; line += 64) __builtin_prefetch(q + PREFETCH * stride + line);
      convert_row<P>(q, scale, wv);
      accumulate<R, P>(acc, x, w.K, rows, m0, r, wv);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) store(y + (m0 + i) * w.N + n0 + v * VL, acc[i][v]);
}

// rows [m0, m0 + R) of y's column block at n0 += x times group g, converted in `buffer`
template <int R, int P>
void block_from_buffer(const float* x, const Weight& w, const float* buffer, int64_t g, float* y,
                       int64_t m0, int64_t n0) {
  vf acc[R][NV];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = load(y + (m0 + i) * w.N + n0 + v * VL);
  const int64_t rows = w.K / P;
  for (int64_t j = 0; j < w.group; ++j) {
    vf wv[P][NV];
    for (int p = 0; p < P; ++p)
      for (int v = 0; v < NV; ++v) wv[p][v] = load(buffer + (j * P + p) * NB + v * VL);
    accumulate<R, P>(acc, x, w.K, rows, m0, g * w.group + j, wv);
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) store(y + (m0 + i) * w.N + n0 + v * VL, acc[i][v]);
}

// f(std::integral_constant<int, rows>) for 0 < rows <= MR: a block of rows held in registers
template <int R = MR, typename F>
void with_rows(int64_t rows, F&& f) {
  if constexpr (R > 0) {
    if (rows == R) f(std::integral_constant<int, R>{});
    else with_rows<R - 1>(rows, f);
  }
}

template <int P>
void columns(const float* x, const Weight& w, float* y, int64_t M, int64_t n0) {
  if (M <= MR) return with_rows(M, [&](auto r) { block<decltype(r)::value, P>(x, w, y, 0, n0); });
  // More rows than one register block: each group is converted once, into a buffer that stays
  // in L1, and every block of rows reads it from there instead of converting it again.
  alignas(64) static thread_local float buffer[MAX_GROUP * 2 * NB];
  for (int64_t i = 0; i < M; ++i) std::fill_n(y + i * w.N + n0, NB, 0.f);
  const int64_t groups = w.K / P / w.group, stride = w.stride();
  const int8_t* data = w.data_at(n0);
  for (int64_t g = 0; g < groups; ++g) {
    vf scale[P][NV], wv[P][NV];
    load_scales<P>(w, w.scales_at(n0), g, scale);
    for (int64_t j = 0; j < w.group; ++j) {
      const int8_t* q = data + (g * w.group + j) * stride;
      for (int line = 0; line < NB; line += 64) __builtin_prefetch(q + PREFETCH * stride + line);
      convert_row<P>(q, scale, wv);
      for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v) store(buffer + (j * P + p) * NB + v * VL, wv[p][v]);
    }
    const int64_t m = M - M % MR;
    for (int64_t m0 = 0; m0 < m; m0 += MR) block_from_buffer<MR, P>(x, w, buffer, g, y, m0, n0);
    with_rows(M - m, [&](auto r) { block_from_buffer<decltype(r)::value, P>(x, w, buffer, g, y, m, n0); });
  }
}

float weight_at(const Weight& w, int64_t k, int64_t n) {
  const int64_t rows = w.K / w.pack, groups = rows / w.group;
  const int64_t p = k / rows, r = k % rows;
  int32_t b = w.data_at(n)[r * w.stride()];
  int32_t q = w.pack == 1 ? b : (p == 0 ? (b << 28) >> 28 : b >> 4);
  return float(q) * w.scales_at(n)[(p * groups + r / w.group) * w.stride()];
}

ffi::Error QuantMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                       ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                       ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size,
                       int64_t tile) {
  auto xd = x.dimensions(), dd = data.dimensions(), sd = scales.dimensions();
  const int64_t pack = 8 / bits, panel_axes = tile ? 1 : 0;
  if (xd.size() != 2 || dd.size() != 3 + panel_axes || sd.size() != 4 + panel_axes ||
      (bits != 8 && bits != 4) || (tile && tile % NB) || group_size > MAX_GROUP)
    return ffi::Error::InvalidArgument(
        "quant_matmul: x [M, K], data [L, K/P, N], scales [L, P, G, N] (or their panels of a "
        "tile that is a multiple of the kernel's column block)");
  const int64_t M = xd[0], K = xd[1], L = dd[0], N = tile ? dd[1] * tile : dd[2];
  const int64_t d1 = dd[1 + panel_axes], s1 = sd[1 + panel_axes], s2 = sd[2 + panel_axes];
  const bool panels_agree = tile ? dd[3] == tile && sd[4] == tile && sd[1] == dd[1] : sd[3] == N;
  if (d1 * pack != K || s1 != pack || s2 * group_size * pack != K || !panels_agree)
    return ffi::Error::InvalidArgument("quant_matmul: shapes of x, data and scales disagree");
  const int64_t layer = std::clamp<int64_t>(index.typed_data()[0], 0, L - 1);
  const Weight w{data.typed_data() + layer * d1 * N, scales.typed_data() + layer * s1 * s2 * N,
                 K, N, group_size, pack, tile};
  const float* xp = x.typed_data();
  float* yp = y->typed_data();
  // a thread's unit: a whole panel (its column blocks in turn, re-read from L2), or a block
  const int64_t unit = tile ? tile : NB, units = N / unit;
  parallel_for(pool, units, [&](int64_t u) {
    for (int64_t n0 = u * unit; n0 < (u + 1) * unit; n0 += NB) {
      if (pack == 1) columns<1>(xp, w, yp, M, n0);
      else columns<2>(xp, w, yp, M, n0);
    }
  });
  for (int64_t m = 0; m < M; ++m)  // columns past the last whole block (row-major layout only)
    for (int64_t n = units * unit; n < N; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += xp[m * K + k] * weight_at(w, k, n);
      yp[m * N + n] = s;
    }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_quant_matmul, QuantMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("group_size")
                                  .Attr<int64_t>("tile"));
