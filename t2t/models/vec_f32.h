// Float32 vector operations at two widths, for kernels written once and built for AVX2 + FMA
// (`Avx2`, 8 lanes) or AVX-512F (`Avx512`, 16 lanes, where the compiler targets it). Each is a
// thin name for one intrinsic (or a fixed sequence of them), so a template over these gives the
// same instructions as code written against either width directly.
#ifndef T2T_MODELS_VEC_F32_H_
#define T2T_MODELS_VEC_F32_H_

#include <immintrin.h>

#include <cstdint>

namespace t2t {
namespace vec {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Broadcast(const float* x) { return _mm256_broadcast_ss(x); }
  static V Load(const float* x) { return _mm256_loadu_ps(x); }
  static void Store(float* x, V v) { _mm256_storeu_ps(x, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }     // a * b + c
  static V Fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }   // c - a * b
  static V RoundNearest(V x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^n for whole-number lanes n in [-126, 127] (the exponent field set directly).
  static V Pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // y where x >= limit, else 0.
  static V ZeroBelow(V x, float limit, V y) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_LT_OQ), y);
  }
  // kLanes keep flags (bytes of 0 or 1) -> floats, each `scale` or 0.
  static V KeepScale(const uint8_t* keep, V scale) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(keep));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), scale);
  }
  static float ReduceMax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
  }
  static float ReduceSum(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
  }
};

#if defined(__AVX512F__)
struct Avx512 {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Broadcast(const float* x) { return _mm512_set1_ps(*x); }
  static V Load(const float* x) { return _mm512_loadu_ps(x); }
  static void Store(float* x, V v) { _mm512_storeu_ps(x, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V RoundNearest(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V Pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static V ZeroBelow(V x, float limit, V y) {
    return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_LT_OQ), y);
  }
  static V KeepScale(const uint8_t* keep, V scale) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keep));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), scale);
  }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static float ReduceSum(V v) { return _mm512_reduce_add_ps(v); }
};
#endif

}  // namespace vec
}  // namespace t2t

#endif  // T2T_MODELS_VEC_F32_H_
