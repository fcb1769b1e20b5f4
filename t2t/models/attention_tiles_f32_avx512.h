// attention_tiles_f32.h's pieces at AVX-512 width, for attention_train_f32.cc built with
// -DT2T_ATTENTION_AVX512: e^x and a row's softmax on 16 lanes, a 6 x 32 register-tiled product
// (two zmm of sums a row, twelve in all), the packing of its right-hand operand into strips of 32
// columns, and the dropout's row steps; the same source as the AVX2 names (`t2t::tiles` over
// vec_f32.h's `Avx512`). On cores that run two 512-bit FMAs a cycle (Intel's Xeons, AMD's Zen 5)
// each FMA does twice the AVX2 tile's work; Zen 4 splits a 512-bit operation into two 256-bit
// halves, where the AVX2 build is kept (train_attention.prefers_avx512).
#ifndef T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_
#define T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "attention_tiles_f32.h"
#include "vec_f32.h"

namespace t2t {
namespace f32_avx512 {

using Lanes16 = t2t::vec::Avx512;
constexpr int kTileRows = tiles::kTileRows;
constexpr int kTileCols = 2 * Lanes16::kLanes;

inline __m512 ExpNonPositive(__m512 x) { return tiles::ExpNonPositive<Lanes16>(x); }
inline void Softmax(float* logits, const float* bias, int L) {
  tiles::Softmax<Lanes16>(logits, bias, L);
}

template <int MR, bool kTransposedA, bool kAccumulate>
inline void Tile(const float* a, size_t lda, const float* b, int K, float* c, size_t ldc) {
  tiles::Tile<Lanes16, MR, kTransposedA, kAccumulate>(a, lda, b, K, c, ldc);
}

template <bool kTransposedA = false, bool kAccumulate = false>
void TiledProduct(const float* a, size_t lda, int rows, const float* b, int K, int strips,
                  float* c, size_t ldc, bool rows_outer) {
  tiles::TiledProduct<Lanes16, kTransposedA, kAccumulate>(a, lda, rows, b, K, strips, c, ldc,
                                                    rows_outer);
}

inline void PackTransposedStrips(const float* x, size_t ld, int n, int depth, float* out) {
  tiles::PackTransposedStrips<Lanes16>(x, ld, n, depth, out);
}

inline void PackStrips(const float* x, size_t ld, int depth, int n, float* out) {
  tiles::PackStrips<Lanes16>(x, ld, depth, n, out);
}

inline __m512 KeepScale(const uint8_t* keep, __m512 scale) {
  return Lanes16::KeepScale(keep, scale);
}

inline void DropoutRow(const float* p, const uint8_t* keep, float scale, int L, float* dropped) {
  tiles::DropoutRow<Lanes16>(p, keep, scale, L, dropped);
}

inline void SoftmaxDropoutBackwardRow(const float* p, const uint8_t* keep, float scale, int L,
                                      float* d, float* dropped, float* d_logits) {
  tiles::SoftmaxDropoutBackwardRow<Lanes16>(p, keep, Lanes16::Set1(scale), L, d, dropped, d_logits);
}

}  // namespace f32_avx512
}  // namespace t2t

#endif  // T2T_MODELS_ATTENTION_TILES_F32_AVX512_H_
