// y[M, N] = x[M, K] @ dequantize(qw[index]) for the few rows of a decode or verify step, the
// int8 / int4 weights read once for all M rows and never expanded in memory: each weight vector
// is converted and scaled in registers (weight-only: exact to float rounding). Layout as
// weight.py: data [L, K/P, N] int8, one byte holding plane 0's row r (low nibble for int4) and
// plane 1's row r (high nibble), plane p being rows [p K/P, (p+1) K/P); scales [L, P, K/(P g), N].
#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

#if defined(__AVX512F__)
constexpr int MR = 4;
constexpr int NV = 4;
#else
constexpr int MR = 3;
constexpr int NV = 2;
#endif
constexpr int NB = NV * VL;
constexpr int PREFETCH = 24;  // rows ahead

struct Weight {
  const int8_t* data;    // [K/P, N]
  const float* scales;   // [P, K/(P g), N]
  int64_t K, N, group, pack;
};

// rows [m0, m0 + R) times the NV-vector column block at n0
template <int R, int P>
void block(const float* x, const Weight& w, float* y, int64_t m0, int64_t n0) {
  vf acc[R][NV] = {};
  const int64_t rows = w.K / P, groups = rows / w.group;
  for (int64_t g = 0; g < groups; ++g) {
    vf scale[P][NV];
    for (int p = 0; p < P; ++p)
      for (int v = 0; v < NV; ++v) scale[p][v] = load(w.scales + (p * groups + g) * w.N + n0 + v * VL);
    const int64_t r_end = (g + 1) * w.group;
    for (int64_t r = g * w.group; r < r_end; ++r) {
      const int8_t* q = w.data + r * w.N + n0;
      for (int line = 0; line < NB; line += 64) __builtin_prefetch(q + PREFETCH * w.N + line);
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

template <int P>
void columns(const float* x, const Weight& w, float* y, int64_t M, int64_t n0) {
  int64_t m = 0;
  for (; m + MR <= M; m += MR) block<MR, P>(x, w, y, m, n0);
  switch (M - m) {
    case 1: block<1, P>(x, w, y, m, n0); break;
    case 2: block<2, P>(x, w, y, m, n0); break;
#if defined(__AVX512F__)
    case 3: block<3, P>(x, w, y, m, n0); break;
#endif
    default: break;
  }
}

float weight_at(const Weight& w, int64_t k, int64_t n) {
  const int64_t rows = w.K / w.pack, groups = rows / w.group;
  const int64_t p = k / rows, r = k % rows;
  int32_t b = w.data[r * w.N + n];
  int32_t q = w.pack == 1 ? b : (p == 0 ? (b << 28) >> 28 : b >> 4);
  return float(q) * w.scales[(p * groups + r / w.group) * w.N + n];
}

ffi::Error QuantMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                       ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                       ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size) {
  auto xd = x.dimensions(), dd = data.dimensions(), sd = scales.dimensions();
  const int64_t pack = 8 / bits;
  if (xd.size() != 2 || dd.size() != 3 || sd.size() != 4 || (bits != 8 && bits != 4))
    return ffi::Error::InvalidArgument("quant_matmul: x [M, K], data [L, K/P, N], scales [L, P, G, N]");
  const int64_t M = xd[0], K = xd[1], L = dd[0], N = dd[2];
  if (dd[1] * pack != K || sd[1] != pack || sd[2] * group_size * pack != K || sd[3] != N)
    return ffi::Error::InvalidArgument("quant_matmul: shapes of x, data and scales disagree");
  const int64_t layer = std::clamp<int64_t>(index.typed_data()[0], 0, L - 1);
  const Weight w{data.typed_data() + layer * dd[1] * N, scales.typed_data() + layer * sd[1] * sd[2] * N,
                 K, N, group_size, pack};
  const float* xp = x.typed_data();
  float* yp = y->typed_data();
  const int64_t blocks = N / NB;
  parallel_for(pool, blocks, [&](int64_t b) {
    if (pack == 1) columns<1>(xp, w, yp, M, b * NB);
    else columns<2>(xp, w, yp, M, b * NB);
  });
  for (int64_t m = 0; m < M; ++m)  // columns past the last whole block
    for (int64_t n = blocks * NB; n < N; ++n) {
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
                                  .Attr<int64_t>("group_size"));
