// Float32 pieces shared by t2t's whole-sequence attention kernels: small_dots_f32.cc's
// (inference), decoder_step_f32.cc's and attention_train_f32.cc's (training, with dropout): e^x, a
// row's softmax, a 6-row register-tiled product, the packing of its right-hand operand into
// strips, and the dropout's row steps. Written once over a vector width (`vec_f32.h`) in
// `t2t::tiles`, and named at AVX2 + FMA width in `t2t::f32` (tiles of 6 x 16, 8 lanes); the
// AVX-512 names (6 x 32, 16 lanes) are in attention_tiles_f32_avx512.h.
#ifndef T2T_MODELS_ATTENTION_TILES_F32_H_
#define T2T_MODELS_ATTENTION_TILES_F32_H_

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "vec_f32.h"

namespace t2t {
namespace tiles {

constexpr int kTileRows = 6;

// e^x for x <= 0: 2^n e^r with n = round(x log2 e), |r| <= ln2 / 2, and a degree-7 Taylor
// polynomial (relative error < 1e-8). Below -87 (where e^x is no longer a normal float) it gives
// 0, as XLA's exp does with denormals flushed to zero. The same value to the bit at each width.
template <class S>
inline typename S::V ExpNonPositive(typename S::V x) {
  const typename S::V limited = S::Max(x, S::Set1(-87.0f));
  const typename S::V n = S::RoundNearest(S::Mul(limited, S::Set1(1.44269504088896341f)));
  typename S::V r = S::Fnmadd(n, S::Set1(0.693145751953125f), limited);
  r = S::Fnmadd(n, S::Set1(1.428606765330187e-06f), r);
  typename S::V p = S::Set1(1.0f / 5040);
  p = S::Fmadd(p, r, S::Set1(1.0f / 720));
  p = S::Fmadd(p, r, S::Set1(1.0f / 120));
  p = S::Fmadd(p, r, S::Set1(1.0f / 24));
  p = S::Fmadd(p, r, S::Set1(1.0f / 6));
  p = S::Fmadd(p, r, S::Set1(0.5f));
  p = S::Fmadd(p, r, S::Set1(1.0f));
  p = S::Fmadd(p, r, S::Set1(1.0f));
  return S::ZeroBelow(x, -87.0f, S::Mul(p, S::Pow2(n)));
}

// logits [L] + bias [L] -> softmax weights, in place; L a multiple of S::kLanes.
template <class S>
inline void Softmax(float* logits, const float* bias, int L) {
  typename S::V vmax = S::Set1(-INFINITY);
  for (int i = 0; i < L; i += S::kLanes) {
    const typename S::V x = S::Add(S::Load(logits + i), S::Load(bias + i));
    S::Store(logits + i, x);
    vmax = S::Max(vmax, x);
  }
  const typename S::V m = S::Set1(S::ReduceMax(vmax));
  typename S::V vsum = S::Zero();
  for (int i = 0; i < L; i += S::kLanes) {
    const typename S::V e = ExpNonPositive<S>(S::Sub(S::Load(logits + i), m));
    S::Store(logits + i, e);
    vsum = S::Add(vsum, e);
  }
  const typename S::V inverse = S::Set1(1.0f / S::ReduceSum(vsum));
  for (int i = 0; i < L; i += S::kLanes) {
    S::Store(logits + i, S::Mul(S::Load(logits + i), inverse));
  }
}

// c[r][0:2 kLanes] = sum_k a(r, k) * b[k][0:2 kLanes] for r < MR, b packed [K][2 kLanes].
// a(r, k) is a[r * lda + k], or with kTransposedA a[k * lda + r] (a stored [K, rows]); with
// kAccumulate the sums are added to c instead of written over it. The twelve sums are named
// variables, not an array: GCC keeps an array of vectors on the stack and stores it back every k
// (measured: half the speed).
template <class S, int MR, bool kTransposedA, bool kAccumulate>
inline void Tile(const float* a, size_t lda, const float* b, int K, float* c, size_t ldc) {
  using V = typename S::V;
  constexpr int kCols = 2 * S::kLanes;
  V c00 = S::Zero(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
    c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const size_t rs = kTransposedA ? 1 : lda, ks = kTransposedA ? lda : 1;
  for (int k = 0; k < K; ++k, b += kCols, a += ks) {
    const V b0 = S::Load(b), b1 = S::Load(b + S::kLanes);
    V x = S::Broadcast(a);
    c00 = S::Fmadd(x, b0, c00);
    c01 = S::Fmadd(x, b1, c01);
    if constexpr (MR > 1) {
      x = S::Broadcast(a + rs);
      c10 = S::Fmadd(x, b0, c10);
      c11 = S::Fmadd(x, b1, c11);
    }
    if constexpr (MR > 2) {
      x = S::Broadcast(a + 2 * rs);
      c20 = S::Fmadd(x, b0, c20);
      c21 = S::Fmadd(x, b1, c21);
    }
    if constexpr (MR > 3) {
      x = S::Broadcast(a + 3 * rs);
      c30 = S::Fmadd(x, b0, c30);
      c31 = S::Fmadd(x, b1, c31);
    }
    if constexpr (MR > 4) {
      x = S::Broadcast(a + 4 * rs);
      c40 = S::Fmadd(x, b0, c40);
      c41 = S::Fmadd(x, b1, c41);
    }
    if constexpr (MR > 5) {
      x = S::Broadcast(a + 5 * rs);
      c50 = S::Fmadd(x, b0, c50);
      c51 = S::Fmadd(x, b1, c51);
    }
  }
  const V sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    for (int h = 0; h < 2; ++h) {
      float* at = cr + h * S::kLanes;
      S::Store(at, kAccumulate ? S::Add(S::Load(at), sums[r][h]) : sums[r][h]);
    }
  }
}

// c [rows, 2 kLanes * strips] = (or, with kAccumulate, +=) a [rows, K] x packed b, strips of
// [K][2 kLanes] one after another (a as in Tile). Strips outermost when a strip is small (q k^T:
// [D][cols], kept in L1 while the rows pass), rows outermost when it is not ([L][cols] each; a
// panel of 6 rows then stays in L1).
template <class S, bool kTransposedA, bool kAccumulate>
void TiledProduct(const float* a, size_t lda, int rows, const float* b, int K, int strips,
                  float* c, size_t ldc, bool rows_outer) {
  constexpr int kCols = 2 * S::kLanes;
  auto tile = [&](int r, int s) {
    const float* strip = b + size_t(s) * K * kCols;
    const float* ar = kTransposedA ? a + r : a + r * lda;
    float* cr = c + r * ldc + s * kCols;
    switch (rows - r < kTileRows ? rows - r : kTileRows) {
      case 6: Tile<S, 6, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 5: Tile<S, 5, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 4: Tile<S, 4, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 3: Tile<S, 3, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      case 2: Tile<S, 2, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
      default: Tile<S, 1, kTransposedA, kAccumulate>(ar, lda, strip, K, cr, ldc); break;
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

// x [n, depth] (row i at x + i * ld) as the right-hand operand x^T: strips of cols = 2 kLanes
// rows of x, out[s][d][j] = x[cols s + j][d]; n a multiple of cols (k as the logits' q k^T
// needs it).
template <class S>
inline void PackTransposedStrips(const float* x, size_t ld, int n, int depth, float* out) {
  constexpr int kCols = 2 * S::kLanes;
  for (int s = 0; s < n / kCols; ++s) {
    float* strip = out + size_t(s) * depth * kCols;
    const float* first = x + size_t(s) * kCols * ld;
    for (int d = 0; d < depth; ++d)
      for (int j = 0; j < kCols; ++j) strip[d * kCols + j] = first[j * ld + d];
  }
}

// x [depth, n] (row i at x + i * ld) as the right-hand operand: strips of cols = 2 kLanes
// columns, out[s][i][j] = x[i][cols s + j]; n a multiple of cols (v as weights v needs it).
template <class S>
inline void PackStrips(const float* x, size_t ld, int depth, int n, float* out) {
  constexpr int kCols = 2 * S::kLanes;
  for (int s = 0; s < n / kCols; ++s) {
    float* strip = out + size_t(s) * depth * kCols;
    for (int i = 0; i < depth; ++i) {
      const float* row = x + size_t(i) * ld + s * kCols;
      S::Store(strip + i * kCols, S::Load(row));
      S::Store(strip + i * kCols + S::kLanes, S::Load(row + S::kLanes));
    }
  }
}

// dropped [L] = p * keep * scale (keep: bytes of 0 or 1); L a multiple of kLanes.
template <class S>
inline void DropoutRow(const float* p, const uint8_t* keep, float scale, int L, float* dropped) {
  const typename S::V vscale = S::Set1(scale);
  for (int j = 0; j < L; j += S::kLanes) {
    S::Store(dropped + j, S::Mul(S::Load(p + j), S::KeepScale(keep + j, vscale)));
  }
}

// The training attention's backward elementwise step for one query row of L (a multiple of
// kLanes), given its P row `p` and keep flags: d [L] holds dW = d_out v^T on entry and d_logits
// on return, d_logits = P * (dP - rowsum(dP * P)) with dP = dW * keep * scale; `dropped`
// receives P * keep * scale and `d_logits` a copy of d (the kernel's d_logits result).
template <class S>
inline void SoftmaxDropoutBackwardRow(const float* p, const uint8_t* keep, typename S::V scale,
                                      int L, float* d, float* dropped, float* d_logits) {
  typename S::V acc = S::Zero();
  for (int j = 0; j < L; j += S::kLanes) {
    const typename S::V m = S::KeepScale(keep + j, scale), pj = S::Load(p + j);
    const typename S::V dp = S::Mul(S::Load(d + j), m);
    S::Store(d + j, dp);
    S::Store(dropped + j, S::Mul(pj, m));
    acc = S::Fmadd(dp, pj, acc);
  }
  const typename S::V delta = S::Set1(S::ReduceSum(acc));
  for (int j = 0; j < L; j += S::kLanes) {
    const typename S::V ds = S::Mul(S::Load(p + j), S::Sub(S::Load(d + j), delta));
    S::Store(d + j, ds);
    S::Store(d_logits + j, ds);
  }
}

}  // namespace tiles

// The pieces at AVX2 + FMA width: tiles of 6 x 16, rows of 8 lanes.
namespace f32 {

using Lanes8 = t2t::vec::Avx2;
constexpr int kTileRows = tiles::kTileRows;
constexpr int kTileCols = 2 * Lanes8::kLanes;

inline __m256 ExpNonPositive(__m256 x) { return tiles::ExpNonPositive<Lanes8>(x); }
inline float ReduceMax(__m256 v) { return Lanes8::ReduceMax(v); }
inline float ReduceSum(__m256 v) { return Lanes8::ReduceSum(v); }
inline void Softmax(float* logits, const float* bias, int L) {
  tiles::Softmax<Lanes8>(logits, bias, L);
}

template <int MR, bool kTransposedA, bool kAccumulate>
inline void Tile(const float* a, size_t lda, const float* b, int K, float* c, size_t ldc) {
  tiles::Tile<Lanes8, MR, kTransposedA, kAccumulate>(a, lda, b, K, c, ldc);
}

template <bool kTransposedA = false, bool kAccumulate = false>
void TiledProduct(const float* a, size_t lda, int rows, const float* b, int K, int strips,
                  float* c, size_t ldc, bool rows_outer) {
  tiles::TiledProduct<Lanes8, kTransposedA, kAccumulate>(a, lda, rows, b, K, strips, c, ldc,
                                                    rows_outer);
}

inline void PackTransposedStrips(const float* x, size_t ld, int n, int depth, float* out) {
  tiles::PackTransposedStrips<Lanes8>(x, ld, n, depth, out);
}

inline void PackStrips(const float* x, size_t ld, int depth, int n, float* out) {
  tiles::PackStrips<Lanes8>(x, ld, depth, n, out);
}

inline void DropoutRow(const float* p, const uint8_t* keep, float scale, int L, float* dropped) {
  tiles::DropoutRow<Lanes8>(p, keep, scale, L, dropped);
}

inline void SoftmaxDropoutBackwardRow(const float* p, const uint8_t* keep, float scale, int L,
                                      float* d, float* dropped, float* d_logits) {
  tiles::SoftmaxDropoutBackwardRow<Lanes8>(p, keep, Lanes8::Set1(scale), L, d, dropped, d_logits);
}

}  // namespace f32
}  // namespace t2t

#endif  // T2T_MODELS_ATTENTION_TILES_F32_H_
