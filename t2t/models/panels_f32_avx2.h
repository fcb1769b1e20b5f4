// Float32 products of a few rows against weights packed in column panels, with AVX2 and FMA:
// `PanelRows` as panels_f32_avx512.h defines it (same panels [P, K, 32], same result), for x86
// processors without AVX-512F (Zen 3, Intel client cores). Shared by small_dots_f32_avx512.cc
// and decoder_step_f32.cc when they are built for AVX2 (libraries `F32_PANELS_AVX2` and
// `DECODER_STEP_F32_AVX2` in t2t/models/small_dots.py).
//
// AVX2 has 16 vector registers of 8 floats, so AVX-512's tile of 8 rows x 32 columns (32
// accumulators here) does not fit. A tile here is 6 rows x 16 columns (12 accumulators, the
// half panel row's 2 vectors, a broadcast), and the panel is walked in blocks of `kBlock` rows
// (8 KB) so that the tiles after the block's first read it from L1: each weight byte still comes
// from memory once. The tiles of a block share out the prefetch of the next block into L2, a row
// every few iterations each, so the memory is kept busy while the later tiles compute. Measured
// against other tiles (2 x 32; 16 or 128-row blocks; prefetch to L1, or by the first tile alone)
// in a two-thread stream of 180 MB of panels on a Zen 4 VM (benchmarks/EXPERIMENTS.md, "Float32
// decoding without AVX-512"): 21-23 GB/s for 8 rows, 9.4-9.7 for 32, where AVX-512's tile
// streams 23-24 and 10.5-10.9.
#ifndef T2T_MODELS_PANELS_F32_AVX2_H_
#define T2T_MODELS_PANELS_F32_AVX2_H_

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace t2t {
namespace avx2 {

constexpr int kPanel = 32;   // columns of a panel: four 8-float vectors
constexpr int kRows = 6;     // A rows of a tile (2 x 6 accumulators)
constexpr int kBlock = 64;   // panel rows (128 bytes each) a block: 8 KB, kept in L1

// The rows of the next block a tile prefetches into L2: one every `every` of its iterations,
// from `next` up to `end`.
struct Ahead {
  const float* next;
  const float* end;
  int every;
};

// sums[m0 .. m0 + MR, c0 .. c0 + 16) += A[m0 .. m0 + MR, k0 .. k1) x panel[k0 .. k1, c0 .. c0 + 16),
// sums [M, 32].
template <int MR>
inline void PanelTile(const float* A, const float* panel, float* sums, int K, int k0, int k1,
                      int m0, int c0, Ahead ahead) {
  __m256 acc[2 * MR];
  for (int m = 0; m < MR; ++m) {
    acc[2 * m] = _mm256_loadu_ps(sums + (m0 + m) * kPanel + c0);
    acc[2 * m + 1] = _mm256_loadu_ps(sums + (m0 + m) * kPanel + c0 + 8);
  }
  const float* a = A + size_t(m0) * K;
  int count = ahead.every;
  for (int k = k0; k < k1; ++k) {
    if (--count == 0) {
      count = ahead.every;
      if (ahead.next < ahead.end) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead.next), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(ahead.next + 16), _MM_HINT_T1);
        ahead.next += kPanel;
      }
    }
    const float* row = panel + size_t(k) * kPanel + c0;
    const __m256 w0 = _mm256_loadu_ps(row), w1 = _mm256_loadu_ps(row + 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_broadcast_ss(a + size_t(m) * K + k);
      acc[2 * m] = _mm256_fmadd_ps(av, w0, acc[2 * m]);
      acc[2 * m + 1] = _mm256_fmadd_ps(av, w1, acc[2 * m + 1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(sums + (m0 + m) * kPanel + c0, acc[2 * m]);
    _mm256_storeu_ps(sums + (m0 + m) * kPanel + c0 + 8, acc[2 * m + 1]);
  }
}

// C[:, n0 .. n0 + 32) = A [M, K] x panel [K, 32] (the columns that exist in C [M, N]).
inline void PanelRows(const float* A, const float* panel, float* C, int M, int K, int N, int n0) {
  thread_local std::vector<float> sums;
  sums.assign(size_t(M) * kPanel, 0.0f);
  const int tiles = 2 * ((M + kRows - 1) / kRows);      // row groups x two column halves
  const int share = (kBlock + tiles - 1) / tiles;        // next-block rows a tile prefetches
  for (int k0 = 0; k0 < K; k0 += kBlock) {
    const int k1 = std::min(K, k0 + kBlock);
    const int every = std::max(1, (k1 - k0) / share);
    for (int t = 0; t < tiles; ++t) {
      const int m0 = (t / 2) * kRows, c0 = (t % 2) * 16;
      const int first = std::min(K, k1 + t * share), last = std::min(K, first + share);
      const Ahead ahead{panel + size_t(first) * kPanel, panel + size_t(last) * kPanel, every};
      switch (std::min(kRows, M - m0)) {
        case 6: PanelTile<6>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
        case 5: PanelTile<5>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
        case 4: PanelTile<4>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
        case 3: PanelTile<3>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
        case 2: PanelTile<2>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
        default: PanelTile<1>(A, panel, sums.data(), K, k0, k1, m0, c0, ahead); break;
      }
    }
  }
  const int valid = std::min(kPanel, N - n0);
  for (int m = 0; m < M; ++m)
    std::copy(sums.data() + size_t(m) * kPanel, sums.data() + size_t(m) * kPanel + valid,
              C + size_t(m) * N + n0);
}

}  // namespace avx2
}  // namespace t2t

#endif  // T2T_MODELS_PANELS_F32_AVX2_H_
