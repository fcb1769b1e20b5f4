// Float32 pieces shared by t2t's whole-sequence attention kernels (AVX2 + FMA): small_dots_f32.cc's
// (inference) and attention_train_f32.cc's (training, with dropout): e^x, a row's softmax, a
// 6 x 16 register-tiled product, and the packing of its right-hand operand into strips.
#ifndef T2T_MODELS_ATTENTION_TILES_F32_H_
#define T2T_MODELS_ATTENTION_TILES_F32_H_

#include <immintrin.h>

#include <cmath>
#include <cstddef>

namespace t2t {
namespace f32 {

// e^x for x <= 0: 2^n e^r with n = round(x log2 e), |r| <= ln2 / 2, and a degree-7 Taylor
// polynomial (relative error < 1e-8). Below -87 (where e^x is no longer a normal float) it gives
// 0, as XLA's exp does with denormals flushed to zero.
inline __m256 ExpNonPositive(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i scale =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
}

inline float ReduceMax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

inline float ReduceSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// logits [L] + bias [L] -> softmax weights, in place; L a multiple of 8.
void Softmax(float* logits, const float* bias, int L) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int i = 0; i < L; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(logits + i), _mm256_loadu_ps(bias + i));
    _mm256_storeu_ps(logits + i, x);
    vmax = _mm256_max_ps(vmax, x);
  }
  const __m256 m = _mm256_set1_ps(ReduceMax(vmax));
  __m256 vsum = _mm256_setzero_ps();
  for (int i = 0; i < L; i += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(logits + i), m));
    _mm256_storeu_ps(logits + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / ReduceSum(vsum));
  for (int i = 0; i < L; i += 8) {
    _mm256_storeu_ps(logits + i, _mm256_mul_ps(_mm256_loadu_ps(logits + i), inverse));
  }
}

constexpr int kTileRows = 6;
constexpr int kTileCols = 16;

// c[r][0:16] = sum_k a(r, k) * b[k][0:16] for r < MR, b packed [K][16]. a(r, k) is a[r * lda + k],
// or with kTransposedA a[k * lda + r] (a stored [K, rows]); with kAccumulate the sums are added
// to c instead of written over it. The twelve sums are named variables,
// not an array: GCC keeps an array of __m256 on the stack and stores it back every k (measured:
// half the speed).
template <int MR, bool kTransposedA, bool kAccumulate>
inline void Tile(const float* a, size_t lda, const float* b, int K, float* c, size_t ldc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const size_t rs = kTransposedA ? 1 : lda, ks = kTransposedA ? lda : 1;
  for (int k = 0; k < K; ++k, b += kTileCols, a += ks) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 x = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(x, b0, c00);
    c01 = _mm256_fmadd_ps(x, b1, c01);
    if constexpr (MR > 1) {
      x = _mm256_broadcast_ss(a + rs);
      c10 = _mm256_fmadd_ps(x, b0, c10);
      c11 = _mm256_fmadd_ps(x, b1, c11);
    }
    if constexpr (MR > 2) {
      x = _mm256_broadcast_ss(a + 2 * rs);
      c20 = _mm256_fmadd_ps(x, b0, c20);
      c21 = _mm256_fmadd_ps(x, b1, c21);
    }
    if constexpr (MR > 3) {
      x = _mm256_broadcast_ss(a + 3 * rs);
      c30 = _mm256_fmadd_ps(x, b0, c30);
      c31 = _mm256_fmadd_ps(x, b1, c31);
    }
    if constexpr (MR > 4) {
      x = _mm256_broadcast_ss(a + 4 * rs);
      c40 = _mm256_fmadd_ps(x, b0, c40);
      c41 = _mm256_fmadd_ps(x, b1, c41);
    }
    if constexpr (MR > 5) {
      x = _mm256_broadcast_ss(a + 5 * rs);
      c50 = _mm256_fmadd_ps(x, b0, c50);
      c51 = _mm256_fmadd_ps(x, b1, c51);
    }
  }
  const __m256 sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if constexpr (kAccumulate) {
      _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), sums[r][0]));
      _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), sums[r][1]));
    } else {
      _mm256_storeu_ps(cr, sums[r][0]);
      _mm256_storeu_ps(cr + 8, sums[r][1]);
    }
  }
}

// c [rows, 16 * strips] = (or, with kAccumulate, +=) a [rows, K] x packed b, strips of [K][16]
// one after another (a as in Tile). Strips outermost when a strip is small (q k^T: [D][16], kept in L1 while the rows
// pass), rows outermost when it is not ([L][16] each; a panel of 6 rows then stays in L1).
template <bool kTransposedA = false, bool kAccumulate = false>
void TiledProduct(const float* a, size_t lda, int rows, const float* b, int K, int strips,
                  float* c, size_t ldc, bool rows_outer) {
  auto tile = [&](int r, int s) {
    const float* strip = b + size_t(s) * K * kTileCols;
    const float* ar = kTransposedA ? a + r : a + r * lda;
    float* cr = c + r * ldc + s * kTileCols;
    switch (rows - r < kTileRows ? rows - r : kTileRows) {
      case 6: Tile<6, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 5: Tile<5, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 4: Tile<4, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 3: Tile<3, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 2: Tile<2, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      default: Tile<1, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
    }
  };
  if (rows_outer) {
    for (int r = 0; r < rows; r += kTileRows)
      for (int s = 0; s < strips; ++s) tile(r, s);
  } else {
    for (int s = 0; s < strips; ++s)
      for (int r = 0; r < rows; r += kTileRows) tile(r, s);
  }
}

// x [n, depth] (row i at x + i * ld) as the right-hand operand x^T: strips of 16 rows of x,
// out[s][d][j] = x[16 s + j][d]; n a multiple of 16 (k as the logits' q k^T needs it).
inline void PackTransposedStrips(const float* x, size_t ld, int n, int depth, float* out) {
  for (int s = 0; s < n / kTileCols; ++s) {
    float* strip = out + size_t(s) * depth * kTileCols;
    const float* first = x + size_t(s) * kTileCols * ld;
    for (int d = 0; d < depth; ++d)
      for (int j = 0; j < kTileCols; ++j) strip[d * kTileCols + j] = first[j * ld + d];
  }
}

// x [depth, n] (row i at x + i * ld) as the right-hand operand: strips of 16 columns,
// out[s][i][j] = x[i][16 s + j]; n a multiple of 16 (v as weights v needs it).
inline void PackStrips(const float* x, size_t ld, int depth, int n, float* out) {
  for (int s = 0; s < n / kTileCols; ++s) {
    float* strip = out + size_t(s) * depth * kTileCols;
    for (int i = 0; i < depth; ++i) {
      const float* row = x + size_t(i) * ld + s * kTileCols;
      _mm256_storeu_ps(strip + i * kTileCols, _mm256_loadu_ps(row));
      _mm256_storeu_ps(strip + i * kTileCols + 8, _mm256_loadu_ps(row + 8));
    }
  }
}

}  // namespace f32
}  // namespace t2t

#endif  // T2T_MODELS_ATTENTION_TILES_F32_H_
