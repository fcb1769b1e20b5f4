// A float32 decoding step's products on x86 CPUs with AVX-512F: a few rows (M <= 64) against
// weights packed in column panels, and the encoder-decoder attention over its cache. Loaded by
// t2t/models/small_dots.py as XLA FFI handlers (library `F32_AVX512`); where the processor lacks
// AVX-512F, small_dots_f32.cc's AVX2 kernels (t2t_f32_nt, t2t_f32_attention) serve instead.
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
// (benchmarks/README.md, "Float32 decoding on Zen 4: weights in panels, AVX-512").
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include <vector>

#include "attention_tiles_f32.h"
#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using t2t::ParallelFor;
using t2t::f32::Softmax;

namespace {

constexpr int kPanel = 32;      // columns of a panel: two 16-float vectors
constexpr int kRowsTile = 8;    // A rows a tile keeps in registers (2 x 8 accumulators)
constexpr int kAhead = 32;      // panel rows (128 bytes each) prefetched ahead

// Columns of a panel that exist in C: all 32 but in the last panel of an N not a multiple of 32.
inline __mmask16 Lanes(int valid) {
  return valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max(valid, 0)) - 1u);
}

// C[m0 .. m0 + MR, n0 .. n0 + 32) = A[m0 .. m0 + MR, :] x panel, panel [K, 32].
template <int MR>
inline void PanelTile(const float* A, const float* panel, float* C, int K, int N, int n0,
                      int m0) {
  __m512 acc[2 * MR];
  for (int i = 0; i < 2 * MR; ++i) acc[i] = _mm512_setzero_ps();
  const float* a = A + size_t(m0) * K;
  for (int k = 0; k < K; ++k) {
    const float* row = panel + size_t(k) * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(row + kAhead * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(row + kAhead * kPanel + 16), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(row), w1 = _mm512_loadu_ps(row + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 av = _mm512_set1_ps(a[size_t(m) * K + k]);
      acc[2 * m] = _mm512_fmadd_ps(av, w0, acc[2 * m]);
      acc[2 * m + 1] = _mm512_fmadd_ps(av, w1, acc[2 * m + 1]);
    }
  }
  const __mmask16 lo = Lanes(N - n0), hi = Lanes(N - n0 - 16);
  for (int m = 0; m < MR; ++m) {
    float* c = C + size_t(m0 + m) * N + n0;
    _mm512_mask_storeu_ps(c, lo, acc[2 * m]);
    _mm512_mask_storeu_ps(c + 16, hi, acc[2 * m + 1]);
  }
}

// One panel against all M rows, 8 at a time: the panel comes from memory for the first 8 and
// from cache (64 KB for K = 512) for the rest.
void PanelRows(const float* A, const float* panel, float* C, int M, int K, int N, int n0) {
  for (int m0 = 0; m0 < M; m0 += kRowsTile) {
    switch (std::min(kRowsTile, M - m0)) {
      case 8: PanelTile<8>(A, panel, C, K, N, n0, m0); break;
      case 7: PanelTile<7>(A, panel, C, K, N, n0, m0); break;
      case 6: PanelTile<6>(A, panel, C, K, N, n0, m0); break;
      case 5: PanelTile<5>(A, panel, C, K, N, n0, m0); break;
      case 4: PanelTile<4>(A, panel, C, K, N, n0, m0); break;
      case 3: PanelTile<3>(A, panel, C, K, N, n0, m0); break;
      case 2: PanelTile<2>(A, panel, C, K, N, n0, m0); break;
      default: PanelTile<1>(A, panel, C, K, N, n0, m0); break;
    }
  }
}

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

// --- The encoder-decoder attention of a decoding step ----------------------------------------
// C [MR, 16 NV] (row stride ldc) = A [MR, K] (row stride lda) x W [K, 16 NV] (row stride ldw):
// MR x NV accumulators (at most 16) in registers, each A element broadcast.
template <int MR, int NV>
inline void RowTile(const float* A, size_t lda, const float* W, size_t ldw, float* C, size_t ldc,
                    int K) {
  __m512 acc[MR * NV];
  for (int i = 0; i < MR * NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    __m512 w[NV];
    for (int j = 0; j < NV; ++j) w[j] = _mm512_loadu_ps(W + size_t(k) * ldw + 16 * j);
    for (int m = 0; m < MR; ++m) {
      const __m512 a = _mm512_set1_ps(A[size_t(m) * lda + k]);
      for (int j = 0; j < NV; ++j) acc[NV * m + j] = _mm512_fmadd_ps(a, w[j], acc[NV * m + j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(C + size_t(m) * ldc + 16 * j, acc[NV * m + j]);
}

// The widest tile of MR rows that fits the columns left: 128 columns for one or two rows, 64 for
// three or four, then 32 and 16.
template <int MR>
inline int RowTiles(const float* A, size_t lda, const float* W, size_t ldw, float* C, size_t ldc,
                    int K, int n0, int N) {
  const int left = N - n0;
  if (MR <= 2 && left >= 128) { RowTile<MR, 8>(A, lda, W + n0, ldw, C + n0, ldc, K); return 128; }
  if (left >= 64) { RowTile<MR, 4>(A, lda, W + n0, ldw, C + n0, ldc, K); return 64; }
  if (left >= 32) { RowTile<MR, 2>(A, lda, W + n0, ldw, C + n0, ldc, K); return 32; }
  RowTile<MR, 1>(A, lda, W + n0, ldw, C + n0, ldc, K);
  return 16;
}

// C [M, N] = A [M, K] x W [K, N], all row-major with the given row strides; N a multiple of 16.
void RowProduct(const float* A, size_t lda, const float* W, size_t ldw, float* C, size_t ldc,
                int M, int K, int N) {
  for (int m0 = 0; m0 < M; m0 += 4) {
    const float* a = A + size_t(m0) * lda;
    float* c = C + size_t(m0) * ldc;
    for (int n0 = 0; n0 < N;) {
      switch (std::min(4, M - m0)) {
        case 4: n0 += RowTiles<4>(a, lda, W, ldw, c, ldc, K, n0, N); break;
        case 3: n0 += RowTiles<3>(a, lda, W, ldw, c, ldc, K, n0, N); break;
        case 2: n0 += RowTiles<2>(a, lda, W, ldw, c, ldc, K, n0, N); break;
        default: n0 += RowTiles<1>(a, lda, W, ldw, c, ldc, K, n0, N); break;
      }
    }
  }
}

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

}  // namespace

// W, the panels, and whether W is [N, K] (else [K, N]).
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_pack_panels, PackPanels,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("nk"));
// A [M, K], the panels, the result, and the panels one thread takes at a time.
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_panel_product, PanelProduct,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("chunk"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_attention_avx512, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
