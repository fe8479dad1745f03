// y[M, N] = x[M, K] @ dequantize(qw[index]) for the few rows of a decode or verify step, the
// int8 / int4 weights read once for all M rows and never expanded in memory: each weight vector
// is converted and scaled in registers (weight-only: exact to float rounding). Layout as
// weight.py: data [L, K/P, N] int8, one byte holding plane 0's row r (low nibble for int4) and
// plane 1's row r (high nibble), plane p being rows [p K/P, (p+1) K/P); scales [L, P, K/(P g), N].
// With a tile t the columns come in panels of t, data [L, N/t, K/P, t] and scales
// [L, N/t, P, K/(P g), t]: a panel is one contiguous read, and a thread takes whole panels.
//
// specjax_quant_matmul_a8 is the same product with int8 activations (W8A8 / W4A8, the
// reference's act_bits=8): each row of x rounded to int8 with one scale, the products of a group
// summed exactly in int32 (AVX-512 VNNI where the host has it), then scaled per group in float.
#include <string>
#include <vector>

#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

#if defined(__AVX512F__)
constexpr int MR = 4;
constexpr int NV = 4;
constexpr int HALF_ROWS = 8;  // up to 8 rows: each half of the block (2 vectors) at once
#else
constexpr int MR = 3;
constexpr int NV = 2;
constexpr int HALF_ROWS = 0;
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

// The V weight vectors of row r (of every plane) of the column block at n0, converted and scaled.
template <int P, int V = NV>
inline void convert_row(const int8_t* q, const vf (&scale)[P][V], vf (&wv)[P][V]) {
  for (int v = 0; v < V; ++v) {
    vi b = load_i8(q + v * VL);
    if constexpr (P == 1) {
      wv[0][v] = to_float(b) * scale[0][v];
    } else {  // sign-extended byte: low nibble by shifts, high nibble by an arithmetic shift
      wv[0][v] = to_float((b << 28) >> 28) * scale[0][v];
      wv[P - 1][v] = to_float(b >> 4) * scale[P - 1][v];
    }
  }
}

template <int P, int V = NV>
inline void load_scales(const Weight& w, const float* scales, int64_t g, vf (&scale)[P][V]) {
  const int64_t groups = w.K / P / w.group;
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < V; ++v) scale[p][v] = load(scales + (p * groups + g) * w.stride() + v * VL);
}

// acc[i] += x's row m0 + i times the weight row: the FMAs every path shares (same order, so the
// converted and the buffered paths give the same bits)
template <int R, int P, int V = NV>
inline void accumulate(vf (&acc)[R][V], const float* x, int64_t K, int64_t rows, int64_t m0, int64_t r,
                       const vf (&wv)[P][V]) {
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < P; ++p) {
      vf xv = splat(x[(m0 + i) * K + p * rows + r]);
      for (int v = 0; v < V; ++v) acc[i][v] += xv * wv[p][v];
    }
}

// rows [m0, m0 + R) times the V-vector column block at n0, converting each weight vector in
// registers
template <int R, int P, int V = NV>
void block(const float* x, const Weight& w, float* y, int64_t m0, int64_t n0) {
  vf acc[R][V] = {};
  const int64_t rows = w.K / P, groups = rows / w.group, stride = w.stride();
  const int8_t* data = w.data_at(n0);
  for (int64_t g = 0; g < groups; ++g) {
    vf scale[P][V], wv[P][V];
    load_scales<P, V>(w, w.scales_at(n0), g, scale);
    for (int64_t r = g * w.group; r < (g + 1) * w.group; ++r) {
      const int8_t* q = data + r * stride;
      for (int line = 0; line < V * VL; line += 64) __builtin_prefetch(q + PREFETCH * stride + line);
      convert_row<P, V>(q, scale, wv);
      accumulate<R, P, V>(acc, x, w.K, rows, m0, r, wv);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) store(y + (m0 + i) * w.N + n0 + v * VL, acc[i][v]);
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

template <int P>
void columns(const float* x, const Weight& w, float* y, int64_t M, int64_t n0) {
  if (M <= MR) return with_rows<MR>(M, [&](auto r) { block<decltype(r)::value, P>(x, w, y, 0, n0); });
  if constexpr (HALF_ROWS > 0) {  // a verify's rows: one half of the block, then the other (from L2)
    if (M <= HALF_ROWS)
      return with_rows<HALF_ROWS>(M, [&](auto r) {
        for (int h = 0; h < NV; h += 2) block<decltype(r)::value, P, 2>(x, w, y, 0, n0 + h * VL);
      });
  }
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
    with_rows<MR>(M - m, [&](auto r) { block_from_buffer<decltype(r)::value, P>(x, w, buffer, g, y, m, n0); });
  }
}

float weight_at(const Weight& w, int64_t k, int64_t n) {
  const int64_t rows = w.K / w.pack, groups = rows / w.group;
  const int64_t p = k / rows, r = k % rows;
  int32_t b = w.data_at(n)[r * w.stride()];
  int32_t q = w.pack == 1 ? b : (p == 0 ? (b << 28) >> 28 : b >> 4);
  return float(q) * w.scales_at(n)[(p * groups + r / w.group) * w.stride()];
}

// Layer `index` of the weight stack, or (`error` set) why x, data and scales do not fit each
// other and the kernel's column block.
struct LayerWeight {
  Weight w;
  const char* error;
};

LayerWeight layer_weight(ffi::Buffer<ffi::F32>& x, ffi::Buffer<ffi::S8>& data, ffi::Buffer<ffi::F32>& scales,
                         ffi::Buffer<ffi::S32>& index, int64_t bits, int64_t group_size, int64_t tile,
                         int64_t block) {
  auto xd = x.dimensions(), dd = data.dimensions(), sd = scales.dimensions();
  const int64_t pack = bits == 4 ? 2 : 1, panel_axes = tile ? 1 : 0;
  if (xd.size() != 2 || dd.size() != 3 + panel_axes || sd.size() != 4 + panel_axes ||
      (bits != 8 && bits != 4) || (tile && tile % block) || group_size > MAX_GROUP || group_size % 4)
    return {{}, "x [M, K], data [L, K/P, N], scales [L, P, G, N] (or their panels of a tile that is a "
                "multiple of the kernel's column block)"};
  const int64_t K = xd[1], L = dd[0], N = tile ? dd[1] * tile : dd[2];
  const int64_t d1 = dd[1 + panel_axes], s1 = sd[1 + panel_axes], s2 = sd[2 + panel_axes];
  const bool panels_agree = tile ? dd[3] == tile && sd[4] == tile && sd[1] == dd[1] : sd[3] == N;
  if (d1 * pack != K || s1 != pack || s2 * group_size * pack != K || !panels_agree)
    return {{}, "shapes of x, data and scales disagree"};
  const int64_t layer = std::clamp<int64_t>(index.typed_data()[0], 0, L - 1);
  return {{data.typed_data() + layer * d1 * N, scales.typed_data() + layer * s1 * s2 * N, K, N, group_size,
           pack, tile},
          nullptr};
}

ffi::Error QuantMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                       ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                       ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size,
                       int64_t tile) {
  const LayerWeight layer = layer_weight(x, data, scales, index, bits, group_size, tile, NB);
  if (layer.error) return ffi::Error::InvalidArgument(std::string("quant_matmul: ") + layer.error);
  const Weight& w = layer.w;
  const int64_t M = x.dimensions()[0], K = w.K, N = w.N, pack = w.pack;
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

// ---- int8 activations -----------------------------------------------------------------------------

// x [M, K] rounded per row as the reference rounds it (scale = max|x| / 127, round half to even,
// clip to +-127), with each group's sum of the rounded values (for the weights' offset, below).
struct Rows8 {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M]
  std::vector<int32_t> sums;  // [M, K / group]
};

// Round one row (the vector loop and its scalar tail round alike: adding and taking off 1.5 * 2^23
// rounds |v| <= 127 to the nearest integer, ties to even, as the reference's jnp.round).
void round_row(const float* row, int64_t K, int64_t group, int8_t* q, float* scale, int32_t* sums) {
  vf vmax = vf{};
  int64_t k = 0;
  for (; k + VL <= K; k += VL) {
    vf v = load(row + k);
    v = v < 0 ? -v : v;
    vmax = vmax > v ? vmax : v;
  }
  float amax = 0.f;
  for (int i = 0; i < VL; ++i) amax = std::max(amax, vmax[i]);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
  *scale = amax / 127.f;
  const float safe = *scale == 0.f ? 1.f : *scale, magic = 12582912.f;
  for (k = 0; k + VL <= K; k += VL) {
    vf v = load(row + k) / safe;
    v = v < -127.f ? splat(-127.f) : v;
    v = v > 127.f ? splat(127.f) : v;
    vi r = __builtin_convertvector((v + magic) - magic, vi);
    for (int i = 0; i < VL; ++i) q[k + i] = int8_t(r[i]);
  }
  for (; k < K; ++k) {
    const float v = std::min(127.f, std::max(-127.f, row[k] / safe));
    q[k] = int8_t((v + magic) - magic);
  }
  for (int64_t g = 0; g < K / group; ++g) {
    int32_t s = 0;
    for (int64_t i = g * group; i < (g + 1) * group; ++i) s += q[i];
    sums[g] = s;
  }
}

Rows8 round_rows(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, int64_t group) {
  Rows8 r{std::vector<int8_t>(M * K), std::vector<float>(M), std::vector<int32_t>(M * (K / group))};
  parallel_for(pool, M, [&](int64_t m) {
    round_row(x + m * K, K, group, &r.q[m * K], &r.scale[m], &r.sums[m * (K / group)]);
  });
  return r;
}

constexpr int A8_COLS = 64;  // a column block: 4 vectors of 16 int32 (AVX-512) / 64 scalars

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// vpdpbusd multiplies unsigned by signed bytes, four at a time into each int32 lane: the weights
// go in as unsigned (int8 + 128, int4 + 8: a flip of the sign bits) and the offset times the
// group's sum of x comes off after. Four rows of 64 weight bytes are transposed so that each
// int32 lane holds one column's 4 rows; lane (c, d) of vector j (128-bit chunk c, dword d) is then
// column 16 c + 4 j + d of the block, and the scales and outputs move the same way (a transpose
// of 128-bit chunks, which is its own inverse).
constexpr int A8_MR = 3;  // rows of a block in the panel path (their sums fill the registers)

inline void chunk_transpose(__m512 (&v)[4]) {
  const __m512 a = _mm512_shuffle_f32x4(v[0], v[1], 0x44), b = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  const __m512 c = _mm512_shuffle_f32x4(v[2], v[3], 0x44), d = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  v[0] = _mm512_shuffle_f32x4(a, c, 0x88);
  v[1] = _mm512_shuffle_f32x4(a, c, 0xDD);
  v[2] = _mm512_shuffle_f32x4(b, d, 0x88);
  v[3] = _mm512_shuffle_f32x4(b, d, 0xDD);
}

// The P planes' unsigned weights of rows [r, r + 4) (each plane's own rows r..r+3) of the block at q.
template <int P>
inline void quad(const int8_t* q, int64_t stride, __m512i (&out)[P][4]) {
  const __m512i r0 = _mm512_loadu_si512(q), r1 = _mm512_loadu_si512(q + stride);
  const __m512i r2 = _mm512_loadu_si512(q + 2 * stride), r3 = _mm512_loadu_si512(q + 3 * stride);
  const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
  const __m512i c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
  const __m512i t[4] = {_mm512_unpacklo_epi16(a, c), _mm512_unpackhi_epi16(a, c),
                        _mm512_unpacklo_epi16(b, d), _mm512_unpackhi_epi16(b, d)};
  const __m512i flip = _mm512_set1_epi8(P == 1 ? char(0x80) : char(0x88)), low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i u = _mm512_xor_si512(t[j], flip);
    if constexpr (P == 1) {
      out[0][j] = u;
    } else {
      out[0][j] = _mm512_and_si512(u, low);
      out[1][j] = _mm512_and_si512(_mm512_srli_epi16(u, 4), low);
    }
  }
}

struct A8Block {  // one column block's group: where its weights, scales and activations are
  const Rows8& x;
  int64_t K, rows, groups, g, group, offset;
  float* acc;  // [M, 64] float sums so far, columns in the transposed order
};

// sum + the products of a's unsigned and b's signed bytes, four to a lane (vpdpbusd), in sum's
// own register: with the intrinsic GCC 12 copies each accumulator to another register and back
// around every instruction.
inline __m512i dpbusd(__m512i sum, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(a), "v"(b));
  return sum;
}

// Row i's int32 sums start at -offset x (its group sum of x), so that adding the unsigned
// weights' products leaves the signed weights' products, exactly.
inline __m512i a8_start(const A8Block& b, int64_t m, int p) {
  return _mm512_set1_epi32(int32_t(-b.offset * b.x.sums[m * (b.K / b.group) + p * b.groups + b.g]));
}

// sum[p][i] += x's row m0 + i, group g, plane p0 + p, times the unsigned weights
template <int R, int Q, typename Weights>
inline void a8_sums(const A8Block& b, int64_t m0, int p0, Weights weights, __m512i (&sum)[Q][R][4]) {
  for (int64_t qd = 0; qd < b.group / 4; ++qd) {
    __m512i w[Q][4];
    weights(qd, w);
    for (int p = 0; p < Q; ++p)
      for (int i = 0; i < R; ++i) {
        int32_t xq;
        std::memcpy(&xq, &b.x.q[(m0 + i) * b.K + (p0 + p) * b.rows + b.g * b.group + 4 * qd], 4);
        const __m512i xv = _mm512_set1_epi32(xq);
        for (int j = 0; j < 4; ++j) sum[p][i][j] = dpbusd(sum[p][i][j], w[p][j], xv);
      }
  }
}

// rows [m0, m0 + R): acc += x's group g times the weights of planes [p0, p0 + Q) (int32 sums,
// then scaled per plane, plane by plane: every path adds a row's floats in the same order)
template <int R, int Q, typename Weights>
inline void a8_rows(const A8Block& b, int64_t m0, int p0, const __m512 (*scale)[4], Weights weights) {
  __m512i sum[Q][R][4];
  for (int p = 0; p < Q; ++p)
    for (int i = 0; i < R; ++i) {
      const __m512i start = a8_start(b, m0 + i, p0 + p);
      for (int j = 0; j < 4; ++j) sum[p][i][j] = start;
    }
  a8_sums<R, Q>(b, m0, p0, weights, sum);
  for (int i = 0; i < R; ++i) {
    float* acc = b.acc + (m0 + i) * A8_COLS;
    for (int p = 0; p < Q; ++p)
      for (int j = 0; j < 4; ++j)
        _mm512_storeu_ps(acc + 16 * j, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[p][i][j]), scale[p0 + p][j],
                                                       _mm512_loadu_ps(acc + 16 * j)));
  }
}

// rows [m0, m0 + R) of y's column block: x times every group of the block's converted weights
// (`panel`: group, plane, quad; `scale`: group, plane, in the transposed order), the float sums
// held in registers over all of K
template <int R, int P>
void a8_panel_rows(const Rows8& x, const Weight& w, const __m512i* panel, const __m512* scale, float* y,
                   int64_t m0, int64_t n0) {
  const int64_t rows = w.K / P, groups = rows / w.group, quads = w.group / 4;
  __m512 acc[R][4];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const A8Block b{x, w.K, rows, groups, g, w.group, P == 1 ? 128 : 8, nullptr};
    for (int p = 0; p < P; ++p) {
      __m512i sum[1][R][4];
      for (int i = 0; i < R; ++i) {
        const __m512i start = a8_start(b, m0 + i, p);
        for (int j = 0; j < 4; ++j) sum[0][i][j] = start;
      }
      const __m512i* weights = panel + (g * P + p) * quads * 4;
      auto plane = [&](int64_t qd, __m512i (&out)[1][4]) {
        for (int j = 0; j < 4; ++j) out[0][j] = weights[qd * 4 + j];
      };
      a8_sums<R, 1>(b, m0, p, plane, sum);
      const __m512* s = scale + (g * P + p) * 4;
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[0][i][j]), s[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    chunk_transpose(acc[i]);
    const __m512 s = _mm512_set1_ps(x.scale[m0 + i]);
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + (m0 + i) * w.N + n0 + 16 * j, _mm512_mul_ps(acc[i][j], s));
  }
}

template <int P>
void a8_columns(const Rows8& x, const Weight& w, float* y, int64_t M, int64_t n0) {
  const int64_t rows = w.K / P, groups = rows / w.group, stride = w.stride(), quads = w.group / 4;
  const int8_t* data = w.data_at(n0);
  const float* scales = w.scales_at(n0);
  auto transposed_scales = [&](int64_t g, __m512 (&scale)[P][4]) {
    for (int p = 0; p < P; ++p) {
      for (int j = 0; j < 4; ++j) scale[p][j] = _mm512_loadu_ps(scales + (p * groups + g) * stride + 16 * j);
      chunk_transpose(scale[p]);
    }
  };
  constexpr int DIRECT = 4 / P;  // rows whose sums of every plane fit the registers at once
  if (M <= DIRECT) {  // one register block: each group straight from the converted vectors
    static thread_local std::vector<float> acc;
    acc.assign(M * A8_COLS, 0.f);
    for (int64_t g = 0; g < groups; ++g) {
      __m512 scale[P][4];
      transposed_scales(g, scale);
      const A8Block b{x, w.K, rows, groups, g, w.group, P == 1 ? 128 : 8, acc.data()};
      const int8_t* q = data + g * w.group * stride;
      auto converted = [&](int64_t qd, __m512i (&out)[P][4]) { quad<P>(q + 4 * qd * stride, stride, out); };
      with_rows<DIRECT>(M, [&](auto r) { a8_rows<decltype(r)::value, P>(b, 0, 0, scale, converted); });
    }
    for (int64_t m = 0; m < M; ++m) {
      __m512 v[4];
      for (int j = 0; j < 4; ++j) v[j] = _mm512_loadu_ps(acc.data() + m * A8_COLS + 16 * j);
      chunk_transpose(v);
      const __m512 s = _mm512_set1_ps(x.scale[m]);
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + m * w.N + n0 + 16 * j, _mm512_mul_ps(v[j], s));
    }
    return;
  }
  // More rows: the block's whole K is converted once into a buffer (L2), and blocks of A8_MR
  // rows read it from there with their float sums in registers. (Converting runs ahead of the
  // sums here, so it asks for the rows PREFETCH ahead; measured slower in the direct path, where
  // the sums between the loads hide them.)
  static thread_local std::vector<__m512i> panel;
  static thread_local std::vector<__m512> panel_scales;
  panel.resize(groups * P * quads * 4);
  panel_scales.resize(groups * P * 4);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t qd = 0; qd < quads; ++qd) {
      const int8_t* rows4 = data + (g * w.group + 4 * qd) * stride;
      for (int i = 0; i < 4; ++i) __builtin_prefetch(rows4 + (PREFETCH + i) * stride);
      __m512i out[P][4];
      quad<P>(rows4, stride, out);
      for (int p = 0; p < P; ++p)
        for (int j = 0; j < 4; ++j) panel[((g * P + p) * quads + qd) * 4 + j] = out[p][j];
    }
    __m512 scale[P][4];
    transposed_scales(g, scale);
    for (int p = 0; p < P; ++p)
      for (int j = 0; j < 4; ++j) panel_scales[(g * P + p) * 4 + j] = scale[p][j];
  }
  const int64_t whole = M - M % A8_MR;
  for (int64_t m0 = 0; m0 < whole; m0 += A8_MR)
    a8_panel_rows<A8_MR, P>(x, w, panel.data(), panel_scales.data(), y, m0, n0);
  with_rows<A8_MR>(M - whole, [&](auto r) {
    a8_panel_rows<decltype(r)::value, P>(x, w, panel.data(), panel_scales.data(), y, whole, n0);
  });
}
#else
// Portable: the same sums, a row of x at a time, each weight row's 64 columns at once (which
// the compiler vectorizes).
template <int P>
void a8_columns(const Rows8& x, const Weight& w, float* y, int64_t M, int64_t n0) {
  const int64_t rows = w.K / P, groups = rows / w.group, stride = w.stride();
  const int8_t* data = w.data_at(n0);
  const float* scales = w.scales_at(n0);
  for (int64_t m = 0; m < M; ++m) {
    float acc[A8_COLS] = {};
    for (int64_t g = 0; g < groups; ++g)
      for (int p = 0; p < P; ++p) {
        int32_t sum[A8_COLS] = {};
        for (int64_t r = g * w.group; r < (g + 1) * w.group; ++r) {
          const int32_t xq = x.q[m * w.K + p * rows + r];
          const int8_t* row = data + r * stride;
          for (int c = 0; c < A8_COLS; ++c) {
            const int32_t b = row[c];
            sum[c] += (P == 1 ? b : p == 0 ? (b << 28) >> 28 : b >> 4) * xq;
          }
        }
        const float* scale = scales + (p * groups + g) * stride;
        for (int c = 0; c < A8_COLS; ++c) acc[c] += float(sum[c]) * scale[c];
      }
    for (int c = 0; c < A8_COLS; ++c) y[m * w.N + n0 + c] = acc[c] * x.scale[m];
  }
}
#endif

ffi::Error QuantMatmulA8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                         ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                         ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size, int64_t tile) {
  const LayerWeight layer = layer_weight(x, data, scales, index, bits, group_size, tile, A8_COLS);
  if (layer.error) return ffi::Error::InvalidArgument(std::string("quant_matmul_a8: ") + layer.error);
  const Weight& w = layer.w;
  const int64_t M = x.dimensions()[0], K = w.K, N = w.N, pack = w.pack;
  const Rows8 xr = round_rows(pool, x.typed_data(), M, K, group_size);
  float* yp = y->typed_data();
  const int64_t blocks = N / A8_COLS;
  parallel_for(pool, blocks, [&](int64_t u) {
    if (pack == 1) a8_columns<1>(xr, w, yp, M, u * A8_COLS);
    else a8_columns<2>(xr, w, yp, M, u * A8_COLS);
  });
  for (int64_t m = 0; m < M; ++m)  // columns past the last whole block (row-major layout only)
    for (int64_t n = blocks * A8_COLS; n < N; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += float(xr.q[m * K + k]) * weight_at(w, k, n);
      yp[m * N + n] = s * xr.scale[m];
    }
  return ffi::Error::Success();
}

// Both handlers take x, data, scales and index, and the weight format's attributes.
auto binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S8>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S32>>()
      .Ret<ffi::Buffer<ffi::F32>>()
      .Attr<int64_t>("bits")
      .Attr<int64_t>("group_size")
      .Attr<int64_t>("tile");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_quant_matmul, QuantMatmul, binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_quant_matmul_a8, QuantMatmulA8, binding());
