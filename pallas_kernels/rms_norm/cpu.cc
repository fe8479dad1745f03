// RMSNorm of the few rows of a decode or verify step: y = x / sqrt(mean(x^2) + eps) * (offset + w).
// Each row is summed by the same code whatever the number of rows (XLA's reduction is not: a row
// normed alone and among seven others can differ in the last bit), so a verify pass and the
// decode steps it replaces give the same bits. The rows are few and short: no thread pool.
#include "pallas_kernels/ffi/cpu_common.h"

namespace ffi = xla::ffi;
using namespace specjax_cpu;

namespace {

ffi::Error RmsNorm(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y,
                   float eps, float offset) {
  auto xd = x.dimensions();
  if (xd.size() != 2 || w.dimensions().size() != 1 || w.dimensions()[0] != xd[1])
    return ffi::Error::InvalidArgument("rms_norm: x [M, D] and w [D]");
  const int64_t M = xd[0], D = xd[1], D0 = D - D % VL;
  const float* wp = w.typed_data();
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.typed_data() + m * D;
    float* yr = y->typed_data() + m * D;
    vf squares{};
    for (int64_t d = 0; d < D0; d += VL) squares += load(xr + d) * load(xr + d);
    float sum = hsum(squares);
    for (int64_t d = D0; d < D; ++d) sum += xr[d] * xr[d];
    const float r = 1.f / std::sqrt(sum / float(D) + eps);
    for (int64_t d = 0; d < D; ++d) yr[d] = (offset + wp[d]) * (xr[d] * r);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_rms_norm, RmsNorm,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps")
                                  .Attr<float>("offset"));
