// A float32 decoding step's products on x86 CPUs with AVX-512F: a few rows (M <= 64) against
// weights packed in column panels, and the encoder-decoder attention over its cache. Loaded by
// t2t/models/small_dots.py as XLA FFI handlers (library `F32_AVX512`). Built a second time with
// AVX2 + FMA only (library `F32_PANELS_AVX2`, panels_f32_avx2.h's tiles): the packing and the
// panel product alone, as t2t_f32_pack_panels_avx2 and t2t_f32_panel_product_avx2, for
// processors without AVX-512F, whose attention is small_dots_f32.cc's t2t_f32_attention.
//
//   t2t_f32_pack_panels: W [K, N] (nk = 0) or [N, K] (nk = 1) -> panels [ceil(N / 32), K, 32],
//     columns N..32 * ceil(N / 32) zero. A custom call with no loop-carried operand, so XLA
//     hoists it out of a decoding loop and packs each weight once per decode.
//   t2t_f32_panel_product: A [M, K] x panels -> C [M, N] (N from the result's shape).
//   t2t_f32_attention_avx512: softmax(q k + bias) v as t2t_f32_attention computes it, q [B, H,
//     Q, D], k [B, H, D, L], v [B, H, L, D] (D and L multiples of 32), both products by
//     register tiles of up to 4 rows x 64 or 2 rows x 128 columns over k and v as they lie.
//
// Why panels. A decoding step reads each weight once for 8 rows (32 with 4 beams), so the
// product is bound by how fast one thread can stream W. The NT product (dot products along K,
// small_dots_f32.cc) reaches ~8-10 GB/s a thread on a Zen 4 VM whose one-thread NumPy sum streams
// ~24 GB/s: each W vector feeds only the FMAs of the A rows held in registers, and a tile of 8
// rows does not fit AVX2's 16 registers. Here a panel holds 32 consecutive columns of W, row k of
// the panel (32 floats, two cache lines) after row k - 1, so a tile of 8 A rows x 32 columns
// keeps its 16 accumulators in 16 of AVX-512's 32 registers, reads the panel once as one
// contiguous stream and broadcasts each A element: ~15-23 GB/s a thread on the same VM
// (benchmarks/EXPERIMENTS.md, "Float32 decoding on Zen 4: weights in panels, AVX-512").
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include <vector>

#include "attention_tiles_f32.h"
#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__)
#include "panels_f32_avx512.h"
using t2t::avx512::kPanel;
using t2t::avx512::PanelRows;
using t2t::avx512::RowProduct;
#define T2T_PANELS_TARGET(name) name
#else   // the AVX2 build (F32_PANELS_AVX2): the panels only, its targets named ..._avx2
#include "panels_f32_avx2.h"
using t2t::avx2::kPanel;
using t2t::avx2::PanelRows;
#define T2T_PANELS_TARGET(name) name##_avx2
#endif

namespace ffi = xla::ffi;
using t2t::ParallelFor;
using t2t::f32::Softmax;

namespace {

ffi::Error PanelProduct(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer panels,
                        ffi::Result<ffi::AnyBuffer> c, int64_t chunk) {
  const auto ad = a.dimensions(), pd = panels.dimensions(), cd = c->dimensions();
  if (a.element_type() != ffi::DataType::F32 || panels.element_type() != ffi::DataType::F32 ||
      c->element_type() != ffi::DataType::F32 || ad.size() != 2 || pd.size() != 3 ||
      cd.size() != 2) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_panel_product: expects float32 A [M, K], panels [P, K, 32] -> C [M, N]");
  }
  const int M = int(ad[0]), K = int(ad[1]), P = int(pd[0]), N = int(cd[1]);
  if (pd[1] != K || pd[2] != kPanel || cd[0] != M || (N + kPanel - 1) / kPanel != P ||
      chunk <= 0) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_panel_product: needs A [M, K], panels [ceil(N / 32), K, 32], C [M, N], "
        "chunk > 0");
  }
  const auto* A = static_cast<const float*>(a.untyped_data());
  const auto* W = static_cast<const float*>(panels.untyped_data());
  auto* C = static_cast<float*>(c->untyped_data());
  const int width = int(chunk);
  ParallelFor(pool, (P + width - 1) / width, [=](int item) {
    for (int p = item * width; p < std::min(P, (item + 1) * width); ++p)
      PanelRows(A, W + size_t(p) * K * kPanel, C, M, K, N, p * kPanel);
  });
  return ffi::Error::Success();
}

ffi::Error PackPanels(ffi::ThreadPool pool, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                      int64_t nk) {
  const auto wd = w.dimensions(), od = out->dimensions();
  if (w.element_type() != ffi::DataType::F32 || out->element_type() != ffi::DataType::F32 ||
      wd.size() != 2 || od.size() != 3) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_pack_panels: expects float32 W [K, N] or [N, K] -> [ceil(N / 32), K, 32]");
  }
  const int K = int(nk ? wd[1] : wd[0]), N = int(nk ? wd[0] : wd[1]), P = int(od[0]);
  if (od[1] != K || od[2] != kPanel || (N + kPanel - 1) / kPanel != P) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_pack_panels: the result must be [ceil(N / 32), K, 32]");
  }
  const auto* W = static_cast<const float*>(w.untyped_data());
  auto* T = static_cast<float*>(out->untyped_data());
  ParallelFor(pool, P, [=](int p) {
    float* panel = T + size_t(p) * K * kPanel;
    const int n0 = p * kPanel, valid = std::min(kPanel, N - n0);
    if (valid < kPanel) std::fill(panel, panel + size_t(K) * kPanel, 0.0f);
    if (nk) {   // W [N, K]: 32 rows of W become the panel's 32 columns
      for (int n = 0; n < valid; ++n) {
        const float* src = W + size_t(n0 + n) * K;
        for (int k = 0; k < K; ++k) panel[size_t(k) * kPanel + n] = src[k];
      }
    } else {    // W [K, N]: each row of W gives the panel 32 consecutive floats
      for (int k = 0; k < K; ++k)
        std::copy(W + size_t(k) * N + n0, W + size_t(k) * N + n0 + valid,
                  panel + size_t(k) * kPanel);
    }
  });
  return ffi::Error::Success();
}

#if defined(__AVX512F__)
// --- The encoder-decoder attention of a decoding step ----------------------------------------
constexpr int kBlockRows = 64;  // query rows whose logits [rows, L] one work item keeps in cache

ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out) {
  return t2t::FusedAttention<float>(
      "t2t_f32_attention_avx512", ffi::DataType::F32, pool, q, k, v, bias, *out, kBlockRows,
      [](const float* q, const float* k, const float* v, const float* bias, float* out, int rows,
         int D, int L) {
        thread_local std::vector<float> logits;
        logits.resize(size_t(rows) * L);
        RowProduct(q, D, k, L, logits.data(), L, rows, D, L);
        for (int row = 0; row < rows; ++row) {
          Softmax(logits.data() + size_t(row) * L, bias + size_t(row) * L, L);
        }
        RowProduct(logits.data(), L, v, D, out, D, rows, L, D);
      });
}
#endif

}  // namespace

// W, the panels, and whether W is [N, K] (else [K, N]).
XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_PANELS_TARGET(t2t_f32_pack_panels), PackPanels,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("nk"));
// A [M, K], the panels, the result, and the panels one thread takes at a time.
XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_PANELS_TARGET(t2t_f32_panel_product), PanelProduct,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("chunk"));
#if defined(__AVX512F__)
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_attention_avx512, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
#endif
