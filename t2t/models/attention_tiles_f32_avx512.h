// attention_tiles_f32.h's pieces at AVX-512 width, for attention_train_f32.cc built with
// -DT2T_ATTENTION_AVX512: e^x and a row's softmax on 16 lanes, a 6 x 32 register-tiled product
// (two zmm of sums a row, twelve in all), the packing of its right-hand operand into strips of 32
// columns, and the dropout's row steps. On cores that run two 512-bit FMAs a cycle (Intel's
// Xeons, AMD's Zen 5) each FMA does twice the AVX2 tile's work; Zen 4 splits a 512-bit operation
// into two 256-bit halves, where the AVX2 build is kept (train_attention.prefers_avx512).
#ifndef T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_
#define T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace t2t {
namespace f32_avx512 {

// e^x for x <= 0, the polynomial and range reduction of attention_tiles_f32.h's ExpNonPositive
// (so both builds give the same value to the bit), 0 below -87.
inline __m512 ExpNonPositive(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i scale =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), p, _mm512_castsi512_ps(scale));
}

// logits [L] + bias [L] -> softmax weights, in place; L a multiple of 16.
inline void Softmax(float* logits, const float* bias, int L) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int i = 0; i < L; i += 16) {
    const __m512 x = _mm512_add_ps(_mm512_loadu_ps(logits + i), _mm512_loadu_ps(bias + i));
    _mm512_storeu_ps(logits + i, x);
    vmax = _mm512_max_ps(vmax, x);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int i = 0; i < L; i += 16) {
    const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(logits + i), m));
    _mm512_storeu_ps(logits + i, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  for (int i = 0; i < L; i += 16) {
    _mm512_storeu_ps(logits + i, _mm512_mul_ps(_mm512_loadu_ps(logits + i), inverse));
  }
}

constexpr int kTileRows = 6;
constexpr int kTileCols = 32;

// c[r][0:32] = sum_k a(r, k) * b[k][0:32] for r < MR, b packed [K][32]; a(r, k) and kAccumulate
// as in attention_tiles_f32.h's Tile. The twelve sums are named variables for the reason given
// there (an array of vectors is kept on the stack).
template <int MR, bool kTransposedA, bool kAccumulate>
inline void Tile(const float* a, size_t lda, const float* b, int K, float* c, size_t ldc) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const size_t rs = kTransposedA ? 1 : lda, ks = kTransposedA ? lda : 1;
  for (int k = 0; k < K; ++k, b += kTileCols, a += ks) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    __m512 x = _mm512_set1_ps(a[0]);
    c00 = _mm512_fmadd_ps(x, b0, c00);
    c01 = _mm512_fmadd_ps(x, b1, c01);
    if constexpr (MR > 1) {
      x = _mm512_set1_ps(a[rs]);
      c10 = _mm512_fmadd_ps(x, b0, c10);
      c11 = _mm512_fmadd_ps(x, b1, c11);
    }
    if constexpr (MR > 2) {
      x = _mm512_set1_ps(a[2 * rs]);
      c20 = _mm512_fmadd_ps(x, b0, c20);
      c21 = _mm512_fmadd_ps(x, b1, c21);
    }
    if constexpr (MR > 3) {
      x = _mm512_set1_ps(a[3 * rs]);
      c30 = _mm512_fmadd_ps(x, b0, c30);
      c31 = _mm512_fmadd_ps(x, b1, c31);
    }
    if constexpr (MR > 4) {
      x = _mm512_set1_ps(a[4 * rs]);
      c40 = _mm512_fmadd_ps(x, b0, c40);
      c41 = _mm512_fmadd_ps(x, b1, c41);
    }
    if constexpr (MR > 5) {
      x = _mm512_set1_ps(a[5 * rs]);
      c50 = _mm512_fmadd_ps(x, b0, c50);
      c51 = _mm512_fmadd_ps(x, b1, c51);
    }
  }
  const __m512 sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if constexpr (kAccumulate) {
      _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_loadu_ps(cr), sums[r][0]));
      _mm512_storeu_ps(cr + 16, _mm512_add_ps(_mm512_loadu_ps(cr + 16), sums[r][1]));
    } else {
      _mm512_storeu_ps(cr, sums[r][0]);
      _mm512_storeu_ps(cr + 16, sums[r][1]);
    }
  }
}

// c [rows, 32 * strips] = (or += ) a [rows, K] x packed b, strips of [K][32] one after another;
// the loop order as in attention_tiles_f32.h's TiledProduct.
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

// x [n, depth] (row i at x + i * ld) as the right-hand operand x^T: strips of 32 rows of x,
// out[s][d][j] = x[32 s + j][d]; n a multiple of 32.
inline void PackTransposedStrips(const float* x, size_t ld, int n, int depth, float* out) {
  for (int s = 0; s < n / kTileCols; ++s) {
    float* strip = out + size_t(s) * depth * kTileCols;
    const float* first = x + size_t(s) * kTileCols * ld;
    for (int d = 0; d < depth; ++d)
      for (int j = 0; j < kTileCols; ++j) strip[d * kTileCols + j] = first[j * ld + d];
  }
}

// x [depth, n] (row i at x + i * ld) as the right-hand operand: strips of 32 columns,
// out[s][i][j] = x[i][32 s + j]; n a multiple of 32.
inline void PackStrips(const float* x, size_t ld, int depth, int n, float* out) {
  for (int s = 0; s < n / kTileCols; ++s) {
    float* strip = out + size_t(s) * depth * kTileCols;
    for (int i = 0; i < depth; ++i) {
      const float* row = x + size_t(i) * ld + s * kTileCols;
      _mm512_storeu_ps(strip + i * kTileCols, _mm512_loadu_ps(row));
      _mm512_storeu_ps(strip + i * kTileCols + 16, _mm512_loadu_ps(row + 16));
    }
  }
}

// 16 keep flags (bytes of 0 or 1) -> 16 floats, each `scale` or 0.
inline __m512 KeepScale(const uint8_t* keep, __m512 scale) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keep));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), scale);
}

// dropped [L] = p * keep * scale; L a multiple of 16.
inline void DropoutRow(const float* p, const uint8_t* keep, float scale, int L, float* dropped) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int j = 0; j < L; j += 16) {
    _mm512_storeu_ps(dropped + j, _mm512_mul_ps(_mm512_loadu_ps(p + j), KeepScale(keep + j, vscale)));
  }
}

// attention_train_common.h's SoftmaxDropoutBackwardRow on 16 lanes: d [L] holds dW on entry
// and d_logits = P * (dP - rowsum(dP * P)) on return, dP = dW * keep * scale; `dropped`
// receives P * keep * scale and `d_logits` a copy of d. L a multiple of 16.
inline void SoftmaxDropoutBackwardRow(const float* p, const uint8_t* keep, float scale, int L,
                                      float* d, float* dropped, float* d_logits) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  for (int j = 0; j < L; j += 16) {
    const __m512 m = KeepScale(keep + j, vscale), pj = _mm512_loadu_ps(p + j);
    const __m512 dp = _mm512_mul_ps(_mm512_loadu_ps(d + j), m);
    _mm512_storeu_ps(d + j, dp);
    _mm512_storeu_ps(dropped + j, _mm512_mul_ps(pj, m));
    acc = _mm512_fmadd_ps(dp, pj, acc);
  }
  const __m512 delta = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
  for (int j = 0; j < L; j += 16) {
    const __m512 ds = _mm512_mul_ps(_mm512_loadu_ps(p + j),
                                    _mm512_sub_ps(_mm512_loadu_ps(d + j), delta));
    _mm512_storeu_ps(d + j, ds);
    _mm512_storeu_ps(d_logits + j, ds);
  }
}

}  // namespace f32_avx512
}  // namespace t2t

#endif  // T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_
