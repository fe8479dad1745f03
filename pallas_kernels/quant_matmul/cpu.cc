// y[M, N] = x[M, K] @ dequantize(qw[index]) for the few rows of a decode or verify step, the
// int8 / int4 weights read once for all M rows and never expanded in memory: each weight vector
// is converted and scaled in registers (weight-only: exact to float rounding). Layout as
// weight.py: data [L, K/P, N] int8, one byte holding plane 0's row r (low nibble for int4) and
// plane 1's row r (high nibble), plane p being rows [p K/P, (p+1) K/P); scales [L, P, K/(P g), N].
// With a tile t the columns come in panels of t, data [L, N/t, K/P, t] and scales
// [L, N/t, P, K/(P g), t]: a panel is one contiguous read, and a thread takes whole panels.
// In quads (the int8-activation kernel's layout, weight.py's `quads`) each 4 rows of the data
// (or of a panel) are stored column by column, a column's 4 bytes together, offset to unsigned.
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
// How far ahead the weights are asked for, as the float kernel does (24 rows of a 256-byte panel
// row); at 24 rows of 64 bytes the int8 decode step ran 5-9% slower.
constexpr int PREFETCH_BYTES = 6 * 1024;
constexpr int PREFETCH_ROWS = PREFETCH_BYTES / 64;    // rows of a 64-column panel, a byte a column
constexpr int PREFETCH_QUADS = PREFETCH_BYTES / 256;  // quads of 4 such rows
constexpr int MAX_GROUP = 128;  // weight.py's largest group size

struct Weight {
  const int8_t* data;    // [K/P, N], or panels [N/t, K/P, t]
  const float* scales;   // [P, K/(P g), N], or panels [N/t, P, K/(P g), t]
  int64_t K, N, group, pack, tile;
  bool quads;

  // Column n0 onwards: where its first data row (in quads: its first quad's 4 bytes) and its
  // first scale row start, and the distance between consecutive rows of either (N row-major; t
  // in a panel, whose t columns hold n0; a quad's rows are 4 strides apart).
  int64_t stride() const { return tile ? tile : N; }
  const int8_t* data_at(int64_t n0) const {
    const int64_t column = (tile ? n0 % tile : n0) * (quads ? 4 : 1);
    return (tile ? data + (n0 / tile) * (K / pack) * tile : data) + column;
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
      for (int line = 0; line < V * VL; line += 64) __builtin_prefetch(q + PREFETCH_ROWS * stride + line);
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
      for (int line = 0; line < NB; line += 64) __builtin_prefetch(q + PREFETCH_ROWS * stride + line);
      convert_row<P>(q, scale, wv);
      for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v) store(buffer + (j * P + p) * NB + v * VL, wv[p][v]);
    }
    const int64_t m = M - M % MR;
    for (int64_t m0 = 0; m0 < m; m0 += MR) block_from_buffer<MR, P>(x, w, buffer, g, y, m0, n0);
    with_rows<MR>(M - m, [&](auto r) { block_from_buffer<decltype(r)::value, P>(x, w, buffer, g, y, m, n0); });
  }
}

// A byte of a weight in quads (`Weight::quads`, as signed: the stored offset taken off).
inline int32_t quad_byte(const Weight& w, const int8_t* column, int64_t r) {
  return int8_t(column[(r / 4) * 4 * w.stride() + r % 4] ^ (w.pack == 1 ? 0x80 : 0x88));
}

float weight_at(const Weight& w, int64_t k, int64_t n) {
  const int64_t rows = w.K / w.pack, groups = rows / w.group;
  const int64_t p = k / rows, r = k % rows;
  int32_t b = w.quads ? quad_byte(w, w.data_at(n), r) : w.data_at(n)[r * w.stride()];
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
                         bool quads, int64_t block) {
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
           pack, tile, quads},
          nullptr};
}

ffi::Error QuantMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                       ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                       ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size,
                       int64_t tile, bool quads) {
  const LayerWeight layer = layer_weight(x, data, scales, index, bits, group_size, tile, quads, NB);
  if (layer.error) return ffi::Error::InvalidArgument(std::string("quant_matmul: ") + layer.error);
  if (quads) return ffi::Error::InvalidArgument("quant_matmul: weights in quads are for int8 activations");
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

// Fewer values than this are rounded on the calling thread: waking another for a verify's rows
// cost more than it saved (SmolLM2's 2-8-token forward on Q4_0 ~4% faster rounded alone).
constexpr int64_t ROUND_ALONE = 1 << 16;

Rows8 round_rows(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, int64_t group) {
  Rows8 r{std::vector<int8_t>(M * K), std::vector<float>(M), std::vector<int32_t>(M * (K / group))};
  auto round = [&](int64_t m) {
    round_row(x + m * K, K, group, &r.q[m * K], &r.scale[m], &r.sums[m * (K / group)]);
  };
  if (M * K < ROUND_ALONE) for (int64_t m = 0; m < M; ++m) round(m);
  else parallel_for(pool, M, round);
  return r;
}

constexpr int A8_COLS = 64;  // a column block: 4 vectors of 16 int32 (AVX-512) / 64 scalars

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// vpdpbusd multiplies unsigned by signed bytes, four at a time into each int32 lane: in quads a
// weight vector of 64 bytes is 16 columns' 4 consecutive rows, stored unsigned (the weight + 128,
// a nibble + 8), so it goes in as loaded (int4: each nibble masked out); the offset times the
// group's sum of x comes off (each sum starts at minus it). Lane d of vector j is column 16 j + d.
constexpr int A8_MR = 3;            // rows of a block over all of K: float and int32 sums in registers
constexpr int A8_GROUPWISE_MR = 4;   // rows of a block over one group: int32 sums in registers
constexpr int A8_GROUPWISE_ROWS = 16;  // the most rows that take the weights group by group (a8_columns)

// sum + the products of a's unsigned and b's signed bytes, four to a lane, in sum's own register:
// with the intrinsic GCC 12 copies each accumulator to another register and back around every
// instruction.
inline __m512i dpbusd(__m512i sum, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(a), "v"(b));
  return sum;
}

// Plane p's unsigned weights of the quad at q (4 vectors, 256 bytes).
template <int P>
inline void plane_weights(const int8_t* q, int p, __m512i (&w)[4]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_loadu_si512(q + 64 * j);
    if constexpr (P == 1) w[j] = v;
    else w[j] = _mm512_and_si512(p == 0 ? v : _mm512_srli_epi16(v, 4), low);
  }
}

// The column block at n0 as a8_group reads it, its divisions done once.
struct A8Block {
  const int8_t* data;    // the block's first quad
  const float* scales;   // its first scale row
  int64_t K, rows, groups, quads, quad_stride, stride;  // rows a plane, groups a plane, quads a group
};

// Rows [m0, m0 + R) times group g of plane p of the column block: the products summed in int32
// registers, then handed to add(i, j, sums of row m0 + i's vector j as floats, their scales) to
// scale and add up. `prefetch` asks for the weights PREFETCH_QUADS ahead (the block that reads
// them first from memory). With SPLIT (int4) the weights come from `split`, the planes apart
// (`split_planes`), rather than from the data.
template <int R, int P, bool SPLIT, typename Add>
__attribute__((always_inline)) inline void a8_group(const Rows8& x, const A8Block& c, int64_t m0,
                                                    int64_t g, int p, bool prefetch,
                                                    const __m512i* split, Add add) {
  constexpr int32_t offset = P == 1 ? 128 : 8;
  const int64_t gp = p * c.groups + g;  // the group's index among all of K's
  __m512i sum[R][4];
  for (int i = 0; i < R; ++i) {
    const __m512i start = _mm512_set1_epi32(-offset * x.sums[(m0 + i) * c.groups * P + gp]);
    for (int j = 0; j < 4; ++j) sum[i][j] = start;
  }
  const int8_t* xq = &x.q[m0 * c.K + p * c.rows + g * c.quads * 4];
  for (int64_t t = 0; t < c.quads; ++t) {
    const int8_t* q = c.data + (g * c.quads + t) * c.quad_stride;
    __m512i wv[4];
    if constexpr (SPLIT) {
      for (int j = 0; j < 4; ++j) wv[j] = split[((2 * g + p) * c.quads + t) * 4 + j];
    } else {
      if (prefetch && p == 0)
        for (int line = 0; line < 256; line += 64) __builtin_prefetch(q + PREFETCH_QUADS * c.quad_stride + line);
      plane_weights<P>(q, p, wv);
    }
    for (int i = 0; i < R; ++i) {
      int32_t four;
      std::memcpy(&four, xq + i * c.K + 4 * t, 4);
      const __m512i xv = _mm512_set1_epi32(four);
      for (int j = 0; j < 4; ++j) sum[i][j] = dpbusd(sum[i][j], wv[j], xv);
    }
  }
  const float* s = c.scales + gp * c.stride;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) add(i, j, _mm512_cvtepi32_ps(sum[i][j]), _mm512_loadu_ps(s + 16 * j));
}

// The column block's int4 weights with the planes apart, [group][plane][quad][4 vectors], in a
// buffer of this thread's (L2): many blocks of rows then read them without masking and shifting
// each time.
const __m512i* split_planes(const Weight& w, int64_t n0) {
  static thread_local std::vector<__m512i> split;
  const int64_t quads = w.K / 8, per_group = w.group / 4, quad_stride = 4 * w.stride();
  split.resize(quads * 8);
  const int8_t* data = w.data_at(n0);
  for (int64_t qd = 0; qd < quads; ++qd) {
    const int8_t* q = data + qd * quad_stride;
    for (int line = 0; line < 256; line += 64) __builtin_prefetch(q + PREFETCH_QUADS * quad_stride + line);
    for (int p = 0; p < 2; ++p) {
      __m512i plane[4];
      plane_weights<2>(q, p, plane);
      const int64_t at = ((qd / per_group * 2 + p) * per_group + qd % per_group) * 4;
      for (int j = 0; j < 4; ++j) split[at + j] = plane[j];
    }
  }
  return split.data();
}

// y's column block at n0, rows [0, M). Every row adds its groups in the same order, whatever its
// block and however many rows there are. Three regimes, by measurement:
// - up to A8_MR rows, one block over all of K, every sum in registers;
// - up to A8_GROUPWISE_ROWS (a verify's rows), group by group, every block of rows in turn (cut as
//   evenly as can be: 8 rows are 4 + 4), so the weights stream from memory once and each group
//   is read by all rows while in L1; the float sums, which no longer fit the registers, wait in
//   L1 (SmolLM2's 8-token forward on Q8_0 / Q4_0: 11% faster than blocks over all of K in turn);
// - past that (prefill), blocks of A8_MR rows over all of K in turn, the first reading the
//   weights from memory and the others from L2 (int4: the planes split once for all blocks):
//   its sums all in registers, 20-30% faster than group by group at 64 rows and more.
template <int P>
void a8_columns(const Rows8& x, const Weight& w, float* y, int64_t M, int64_t n0) {
  const int64_t rows = w.K / P;
  const A8Block c{w.data_at(n0), w.scales_at(n0), w.K, rows, rows / w.group, w.group / 4,
                  4 * w.stride(), w.stride()};
  auto store = [&](int64_t m, int j, __m512 v) {
    _mm512_storeu_ps(y + m * w.N + n0 + 16 * j, _mm512_mul_ps(v, _mm512_set1_ps(x.scale[m])));
  };
  auto over_k = [&](int64_t m0, auto rows_, auto split_planes_first, const __m512i* split) {
    constexpr int R = decltype(rows_)::value;
    constexpr bool SPLIT = decltype(split_planes_first)::value;
    __m512 acc[R][4] = {};
    for (int64_t g = 0; g < c.groups; ++g)
      for (int p = 0; p < P; ++p)
        a8_group<R, P, SPLIT>(x, c, m0, g, p, m0 == 0, split,
                              [&](int i, int j, __m512 sum, __m512 scale) {
                                acc[i][j] = _mm512_fmadd_ps(sum, scale, acc[i][j]);
                              });
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < 4; ++j) store(m0 + i, j, acc[i][j]);
  };
  if (M <= A8_MR) return with_rows<A8_MR>(M, [&](auto r) { over_k(0, r, std::false_type{}, nullptr); });
  if (M > A8_GROUPWISE_ROWS) {
    auto blocks = [&](auto split_planes_first) {
      const __m512i* split = decltype(split_planes_first)::value ? split_planes(w, n0) : nullptr;
      const int64_t whole = M - M % A8_MR;
      for (int64_t m0 = 0; m0 < whole; m0 += A8_MR)
        over_k(m0, std::integral_constant<int, A8_MR>{}, split_planes_first, split);
      with_rows<A8_MR>(M - whole, [&](auto r) { over_k(whole, r, split_planes_first, split); });
    };
    if (P == 2) blocks(std::true_type{});
    else blocks(std::false_type{});
    return;
  }
  alignas(64) float acc[A8_GROUPWISE_ROWS * A8_COLS] = {};
  const int64_t blocks = (M + A8_GROUPWISE_MR - 1) / A8_GROUPWISE_MR, even = M / blocks, longer = M % blocks;
  for (int64_t g = 0; g < c.groups; ++g)
    for (int p = 0; p < P; ++p)
      for (int64_t b = 0, m0 = 0; b < blocks; ++b) {
        const int64_t r = even + (b < longer);
        auto add = [&](int i, int j, __m512 sum, __m512 scale) {
          float* a = acc + (m0 + i) * A8_COLS + 16 * j;
          _mm512_storeu_ps(a, _mm512_fmadd_ps(sum, scale, _mm512_loadu_ps(a)));
        };
        with_rows<A8_GROUPWISE_MR>(r, [&](auto R) {
          a8_group<decltype(R)::value, P, false>(x, c, m0, g, p, b == 0, nullptr, add);
        });
        m0 += r;
      }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) store(m, j, _mm512_load_ps(acc + m * A8_COLS + 16 * j));
}
#else
// Portable: the same sums, each quad's 4 rows of 64 columns taken out of quads once (the plane's
// signed values) and multiplied into every row of x, a row's 64 columns at once (loops the
// compiler vectorizes).
template <int P>
void a8_columns(const Rows8& x, const Weight& w, float* y, int64_t M, int64_t n0) {
  const int64_t rows = w.K / P, groups = rows / w.group, quad_stride = 4 * w.stride();
  const int8_t* data = w.data_at(n0);
  const float* scales = w.scales_at(n0);
  static thread_local std::vector<float> acc;
  static thread_local std::vector<int32_t> sum;
  acc.assign(M * A8_COLS, 0.f);
  sum.resize(M * A8_COLS);
  for (int64_t g = 0; g < groups; ++g)
    for (int p = 0; p < P; ++p) {
      std::fill(sum.begin(), sum.end(), 0);
      for (int64_t qd = g * w.group / 4; qd < (g + 1) * w.group / 4; ++qd) {
        int32_t quad[4][A8_COLS];
        const int8_t* q = data + qd * quad_stride;
        for (int c = 0; c < A8_COLS; ++c) {  // a column's 4 bytes as one word: shifts take each value out
          uint32_t word;
          std::memcpy(&word, q + 4 * c, 4);
          word ^= P == 1 ? 0x80808080u : 0x88888888u;
          const int bits = P == 1 ? 8 : 4, low = P == 1 ? 0 : 4 * p;
          for (int i = 0; i < 4; ++i) quad[i][c] = int32_t(word << (32 - bits - 8 * i - low)) >> (32 - bits);
        }
        for (int64_t m = 0; m < M; ++m)
          for (int i = 0; i < 4; ++i) {
            const int32_t xq = x.q[m * w.K + p * rows + 4 * qd + i];
            for (int c = 0; c < A8_COLS; ++c) sum[m * A8_COLS + c] += quad[i][c] * xq;
          }
      }
      const float* scale = scales + (p * groups + g) * w.stride();
      for (int64_t m = 0; m < M; ++m)
        for (int c = 0; c < A8_COLS; ++c) acc[m * A8_COLS + c] += float(sum[m * A8_COLS + c]) * scale[c];
    }
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < A8_COLS; ++c) y[m * w.N + n0 + c] = acc[m * A8_COLS + c] * x.scale[m];
}
#endif

ffi::Error QuantMatmulA8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> data,
                         ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::S32> index,
                         ffi::ResultBuffer<ffi::F32> y, int64_t bits, int64_t group_size, int64_t tile,
                         bool quads) {
  const LayerWeight layer = layer_weight(x, data, scales, index, bits, group_size, tile, quads, A8_COLS);
  if (layer.error) return ffi::Error::InvalidArgument(std::string("quant_matmul_a8: ") + layer.error);
  if (!quads) return ffi::Error::InvalidArgument("quant_matmul_a8: int8 activations read weights in quads");
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
      .Attr<int64_t>("tile")
      .Attr<bool>("quads");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_quant_matmul, QuantMatmul, binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_quant_matmul_a8, QuantMatmulA8, binding());
