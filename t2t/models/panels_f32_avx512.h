// Float32 register tiles with AVX-512F for a decoding step's products, shared by
// small_dots_f32_avx512.cc (one product or one attention a call) and decoder_step_f32.cc (a whole
// decoder layer a call): products of a few rows against weights packed in column panels
// (`PanelRows`), and row-major products with the accumulators in registers (`RowProduct`).
#ifndef T2T_MODELS_PANELS_F32_AVX512_H_
#define T2T_MODELS_PANELS_F32_AVX512_H_

#include <immintrin.h>

#include <algorithm>
#include <cstddef>

namespace t2t {
namespace avx512 {

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
inline void PanelRows(const float* A, const float* panel, float* C, int M, int K, int N, int n0) {
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
inline void RowProduct(const float* A, size_t lda, const float* W, size_t ldw, float* C, size_t ldc,
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

}  // namespace avx512
}  // namespace t2t

#endif  // T2T_MODELS_PANELS_F32_AVX512_H_
