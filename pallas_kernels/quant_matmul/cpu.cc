// y[M, N] = x[M, K] @ dequantize(qw[index]) for the few rows of a decode or verify step, the
// int8 / int4 weights read once for all M rows and never expanded in memory: each weight vector
// is converted and scaled in registers (weight-only: exact to float rounding). Layout as
// weight.py: data [L, K/P, N] int8, one byte holding plane 0's row r (low nibble for int4) and
// plane 1's row r (high nibble), plane p being rows [p K/P, (p+1) K/P); scales [L, P, K/(P g), N].
// With a tile t the columns come in panels of t, data [L, N/t, K/P, t] and scales
// [L, N/t, P, K/(P g), t]: a panel is one contiguous read, and a thread takes whole panels.
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

// rows [m0, m0 + R) times the NV-vector column block at n0
template <int R, int P>
void block(const float* x, const Weight& w, float* y, int64_t m0, int64_t n0) {
  vf acc[R][NV] = {};
  const int64_t rows = w.K / P, groups = rows / w.group, stride = w.stride();
  const int8_t* data = w.data_at(n0);
  const float* scales = w.scales_at(n0);
  for (int64_t g = 0; g < groups; ++g) {
    vf scale[P][NV];
    for (int p = 0; p < P; ++p)
      for (int v = 0; v < NV; ++v) scale[p][v] = load(scales + (p * groups + g) * stride + v * VL);
    const int64_t r_end = (g + 1) * w.group;
    for (int64_t r = g * w.group; r < r_end; ++r) {
      const int8_t* q = data + r * stride;
      for (int line = 0; line < NB; line += 64) __builtin_prefetch(q + PREFETCH * stride + line);
      vf wv[P][NV];
      for (int v = 0; v < NV; ++v) {
        vi b = load_i8(q + v * VL);
        if constexpr (P == 1) {
          wv[0][v] = to_float(b) * scale[0][v];
        } else {  // sign-extended byte: low nibble by shifts, high nibble by an arithmetic shift
          wv[0][v] = to_float((b << 28) >> 28) * scale[0][v];
          wv[P - 1][v] = to_float(b >> 4) * scale[P - 1][v];
        }
      }
      for (int i = 0; i < R; ++i)
        for (int p = 0; p < P; ++p) {
          vf xv = splat(x[(m0 + i) * w.K + p * rows + r]);
          for (int v = 0; v < NV; ++v) acc[i][v] += xv * wv[p][v];
        }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) store(y + (m0 + i) * w.N + n0 + v * VL, acc[i][v]);
}

// the last `rows` < MR rows, still from registers
template <int P, int R = MR - 1>
void last_rows(int64_t rows, const float* x, const Weight& w, float* y, int64_t m0, int64_t n0) {
  if constexpr (R > 0) {
    if (rows == R) block<R, P>(x, w, y, m0, n0);
    else last_rows<P, R - 1>(rows, x, w, y, m0, n0);
  }
}

template <int P>
void columns(const float* x, const Weight& w, float* y, int64_t M, int64_t n0) {
  int64_t m = 0;
  for (; m + MR <= M; m += MR) block<MR, P>(x, w, y, m, n0);
  last_rows<P>(M - m, x, w, y, m, n0);
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
      (bits != 8 && bits != 4) || (tile && tile % NB))
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
