// Whole-sequence attention with dropout on its weights, forward and backward, for models whose
// matmul operands are bf16 (`T5Config.matmul_dtype`), on x86 CPUs with AVX512_BF16: the same
// work as attention_train_f32.cc, with its six products done by VDPBF16PS (pairs of bf16
// products summed into float32) instead of float32 FMAs. Loaded by t2t/models/small_dots.py
// (library ATTENTION_TRAIN_BF16) as XLA FFI handlers and used by t2t/models/train_attention.py.
//
// Each product's operands are rounded to bf16 (to nearest even) where XLA's bf16 path rounds
// them (t2t/models/matmuls.py's `_mixed_einsum`, forward and backward): q, k, v (already bf16
// values), the dropped weights P * keep * scale, d_out, and d_logits for d_q and d_k. The softmax,
// the dropout and the backward's elementwise steps stay float32, so the result is XLA's bf16
// attention up to float32 summation order. On a Zen 4 the bf16 dot products run at ~1.8x the
// float32 FMAs' rate (the `--precision bf16` roof in benchmarks/EXPERIMENTS.md).
//
//   t2t_bf16_attention_train_fwd, t2t_bf16_attention_train_bwd: the operands, results and
//   attribute of attention_train_f32.cc's two handlers (float32 buffers throughout); D and L
//   multiples of 32, Q any.
//
// The products' layout: a register tile is 6 rows x 32 columns of float32 sums (12 zmm). Its
// right-hand operand is packed in strips of 32 columns, [K / 2][32] pairs (two bf16 in a 32-bit
// word, consecutive in the reduced dimension, an odd K's last pair completed by a zero); its
// left-hand rows are bf16 rows read a pair at a time, broadcast to the 16 lanes. d_v and d_k are
// computed transposed (d_v^T [D, L] = d_out^T (P * keep * scale)), so that every operand that
// is a block of query rows packs with two-row interleaves rather than a transpose, and written
// into their [B, L, H, D] rows once, after the last block.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_tiles_f32.h"
#include "attention_train_common.h"
#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using t2t::ParallelFor;
using t2t::f32::Softmax;
using namespace t2t::attention_train;

namespace {

constexpr int kRows = 6;             // a register tile's rows
constexpr int kCols = 32;            // and its columns: two zmm of float32 sums a row
constexpr int kForwardBlock = 96;    // query rows of a forward work item: their P [96, L] in L2
constexpr int kBackwardBlock = 96;   // query rows a backward step takes

// float32 -> bf16 bits, rounded to nearest even, as XLA's convert does (a NaN stays a NaN).
inline uint16_t Bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

inline __m256i Bf16x16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// Sixteen pairs (even[i], odd[i]), each a 32-bit word with `even` in its low half.
inline __m512i Pairs(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(Bf16x16(even)),
                         _mm512_slli_epi32(_mm512_cvtepu16_epi32(Bf16x16(odd)), 16));
}

// n float32 (n even) -> n bf16, i.e. n / 2 pairs.
inline void ToBf16(const float* x, int n, uint16_t* out) {
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), Bf16x16(_mm512_loadu_ps(x + i)));
  }
  for (; i < n; ++i) out[i] = Bf16(x[i]);
}

// x [rows, depth] (row i at x + i * ld) -> bf16 rows [rows][depth], depth even: a left-hand
// operand whose pairs run along its rows (lda = depth / 2 pairs).
inline void RowsToBf16(const float* x, size_t ld, int rows, int depth, uint16_t* out) {
  for (int r = 0; r < rows; ++r) ToBf16(x + size_t(r) * ld, depth, out + size_t(r) * depth);
}

// x [depth, n] (row i at x + i * ld), n a multiple of 32, as a right-hand operand reduced over
// its rows: out[s][p][j] = (x[2p][32s + j], x[2p + 1][32s + j]), (depth + 1) / 2 pairs a strip.
inline void PackPairsAcrossRows(const float* x, size_t ld, int depth, int n, uint32_t* out) {
  const int pairs = (depth + 1) / 2;
  const __m512 zero = _mm512_setzero_ps();
  for (int s = 0; s < n / kCols; ++s) {
    uint32_t* strip = out + size_t(s) * pairs * kCols;
    for (int p = 0; p < pairs; ++p) {
      const float* even = x + size_t(2 * p) * ld + s * kCols;
      const float* odd = even + ld;
      const bool has_odd = 2 * p + 1 < depth;
      for (int half = 0; half < kCols; half += 16) {
        const __m512 o = has_odd ? _mm512_loadu_ps(odd + half) : zero;
        _mm512_storeu_si512(strip + size_t(p) * kCols + half,
                            Pairs(_mm512_loadu_ps(even + half), o));
      }
    }
  }
}

// x [n, depth] (row i at x + i * ld), n a multiple of 32 and depth even, as a right-hand operand
// reduced over its columns (x^T): out[s][p][j] = (x[32s + j][2p], x[32s + j][2p + 1]).
inline void PackPairsAlongRows(const float* x, size_t ld, int n, int depth, uint32_t* out) {
  const int pairs = depth / 2;
  thread_local std::vector<uint32_t> row;
  row.resize(pairs);
  for (int i = 0; i < n; ++i) {
    ToBf16(x + size_t(i) * ld, depth, reinterpret_cast<uint16_t*>(row.data()));
    uint32_t* strip = out + size_t(i / kCols) * pairs * kCols + i % kCols;
    for (int p = 0; p < pairs; ++p) strip[size_t(p) * kCols] = row[p];
  }
}

// x [rows, depth] (row i at x + i * ld) as a left-hand operand x^T [depth, rows] reduced over
// the rows: out[d][p] = (x[2p][d], x[2p + 1][d]), (rows + 1) / 2 pairs a row of out; depth a
// multiple of 16.
inline void TransposePairs(const float* x, size_t ld, int rows, int depth, uint32_t* out) {
  const int pairs = (rows + 1) / 2;
  alignas(64) uint32_t words[16];
  for (int p = 0; p < pairs; ++p) {
    const float* even = x + size_t(2 * p) * ld;
    const bool has_odd = 2 * p + 1 < rows;
    for (int d = 0; d < depth; d += 16) {
      const __m512 o = has_odd ? _mm512_loadu_ps(even + ld + d) : _mm512_setzero_ps();
      _mm512_store_si512(words, Pairs(_mm512_loadu_ps(even + d), o));
      for (int i = 0; i < 16; ++i) out[size_t(d + i) * pairs + p] = words[i];
    }
  }
}

// c[r][0:32] (+)= sum_p a[r * lda + p] . b[p][0:32] for r < MR: a's pairs broadcast, b one
// strip. Named sums, not an array (attention_tiles_f32.h's Tile says why).
template <int MR, bool kAccumulate>
inline void Tile(const uint32_t* a, size_t lda, const uint32_t* b, int pairs, float* c,
                 size_t ldc) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int p = 0; p < pairs; ++p, b += kCols, ++a) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
    __m512bh x = (__m512bh)_mm512_set1_epi32(int(a[0]));
    c00 = _mm512_dpbf16_ps(c00, x, b0);
    c01 = _mm512_dpbf16_ps(c01, x, b1);
    if constexpr (MR > 1) {
      x = (__m512bh)_mm512_set1_epi32(int(a[lda]));
      c10 = _mm512_dpbf16_ps(c10, x, b0);
      c11 = _mm512_dpbf16_ps(c11, x, b1);
    }
    if constexpr (MR > 2) {
      x = (__m512bh)_mm512_set1_epi32(int(a[2 * lda]));
      c20 = _mm512_dpbf16_ps(c20, x, b0);
      c21 = _mm512_dpbf16_ps(c21, x, b1);
    }
    if constexpr (MR > 3) {
      x = (__m512bh)_mm512_set1_epi32(int(a[3 * lda]));
      c30 = _mm512_dpbf16_ps(c30, x, b0);
      c31 = _mm512_dpbf16_ps(c31, x, b1);
    }
    if constexpr (MR > 4) {
      x = (__m512bh)_mm512_set1_epi32(int(a[4 * lda]));
      c40 = _mm512_dpbf16_ps(c40, x, b0);
      c41 = _mm512_dpbf16_ps(c41, x, b1);
    }
    if constexpr (MR > 5) {
      x = (__m512bh)_mm512_set1_epi32(int(a[5 * lda]));
      c50 = _mm512_dpbf16_ps(c50, x, b0);
      c51 = _mm512_dpbf16_ps(c51, x, b1);
    }
  }
  const __m512 sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    for (int h = 0; h < 2; ++h) {
      const __m512 sum = kAccumulate ? _mm512_add_ps(_mm512_loadu_ps(cr + 16 * h), sums[r][h])
                                     : sums[r][h];
      _mm512_storeu_ps(cr + 16 * h, sum);
    }
  }
}

// c [rows, 32 * strips] (+)= a [rows, 2 * pairs] (bf16 rows, lda pairs apart) x b (strips of
// [pairs][32] one after another). Strips outermost when a strip is small (it stays in L1 while
// the rows pass), rows outermost when it is not (a panel of 6 rows then stays in L1).
template <bool kAccumulate>
void Product(const uint32_t* a, size_t lda, int rows, const uint32_t* b, int pairs, int strips,
             float* c, size_t ldc, bool rows_outer) {
  auto tile = [&](int r, int s) {
    const uint32_t* strip = b + size_t(s) * pairs * kCols;
    const uint32_t* ar = a + r * lda;
    float* cr = c + r * ldc + s * kCols;
    switch (std::min(rows - r, kRows)) {
      case 6: Tile<6, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
      case 5: Tile<5, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
      case 4: Tile<4, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
      case 3: Tile<3, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
      case 2: Tile<2, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
      default: Tile<1, kAccumulate>(ar, lda, strip, pairs, cr, ldc); break;
    }
  };
  if (rows_outer) {
    for (int r = 0; r < rows; r += kRows)
      for (int s = 0; s < strips; ++s) tile(r, s);
  } else {
    for (int s = 0; s < strips; ++s)
      for (int r = 0; r < rows; r += kRows) tile(r, s);
  }
}

const uint32_t* AsPairs(const uint16_t* x) { return reinterpret_cast<const uint32_t*>(x); }

ffi::Error Forward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer bias, ffi::AnyBuffer keep, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> probs, float scale) {
  static const char* kName = "t2t_bf16_attention_train_fwd";
  ForwardOperands o;
  if (auto error = ReadForward(kName, kCols, q, k, v, bias, keep, *out, *probs, o);
      error.failure()) {
    return error;
  }
  const int B = o.s.B, Q = o.s.Q, H = o.s.H, D = o.s.D, L = o.s.L;
  const size_t row = o.s.row;
  // k^T as [L / 32][D / 2][32] pairs and v as [D / 32][L / 2][32] for every (batch row, head).
  thread_local std::vector<uint32_t> packed;
  const size_t pair_words = size_t(L) * D;
  packed.resize(size_t(B) * H * pair_words);
  uint32_t* const packed_data = packed.data();
  ParallelFor(pool, B * H, [=](int pair) {
    const size_t offset = size_t(pair / H) * L * row + size_t(pair % H) * D;
    uint32_t* keys = packed_data + size_t(pair) * pair_words;
    PackPairsAlongRows(o.k + offset, row, L, D, keys);
    PackPairsAcrossRows(o.v + offset, row, L, D, keys + pair_words / 2);
  });
  const int blocks = (Q + kForwardBlock - 1) / kForwardBlock;
  const __m256 vscale = _mm256_set1_ps(scale);
  ParallelFor(pool, B * H * blocks, [=](int item) {
    const int pair = item / blocks, r0 = (item % blocks) * kForwardBlock;
    const int b = pair / H, h = pair % H, rows = std::min(kForwardBlock, Q - r0);
    const uint32_t* keys = packed_data + size_t(pair) * pair_words;
    const uint32_t* values = keys + pair_words / 2;
    const size_t first = (size_t(pair) * Q + r0) * L;   // P's and keep's [rows, L] block
    float* p = o.probs + first;
    thread_local std::vector<uint16_t> q_bf16, dropped_bf16;
    thread_local std::vector<float> dropped;
    q_bf16.resize(size_t(kForwardBlock) * D);
    dropped_bf16.resize(size_t(kForwardBlock) * L);
    dropped.resize(L);
    RowsToBf16(o.q + (size_t(b) * Q + r0) * row + size_t(h) * D, row, rows, D, q_bf16.data());
    Product<false>(AsPairs(q_bf16.data()), D / 2, rows, keys, D / 2, L / kCols, p, L, false);
    const float* brows = o.bias + b * o.bias_b + h * o.bias_h + size_t(r0) * L;
    for (int r = 0; r < rows; ++r) {
      float* pr = p + size_t(r) * L;
      Softmax(pr, brows + size_t(r) * L, L);
      const uint8_t* mr = o.keep + first + size_t(r) * L;
      for (int j = 0; j < L; j += 8) {
        _mm256_storeu_ps(dropped.data() + j,
                         _mm256_mul_ps(_mm256_loadu_ps(pr + j), KeepScale(mr + j, vscale)));
      }
      ToBf16(dropped.data(), L, dropped_bf16.data() + size_t(r) * L);
    }
    float* orows = o.out + (size_t(b) * Q + r0) * row + size_t(h) * D;
    Product<false>(AsPairs(dropped_bf16.data()), L / 2, rows, values, L / 2, D / kCols, orows,
                   row, true);
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer probs, ffi::AnyBuffer keep, ffi::AnyBuffer d_out,
                    ffi::Result<ffi::AnyBuffer> d_q, ffi::Result<ffi::AnyBuffer> d_k,
                    ffi::Result<ffi::AnyBuffer> d_v, ffi::Result<ffi::AnyBuffer> d_logits,
                    float scale) {
  static const char* kName = "t2t_bf16_attention_train_bwd";
  BackwardOperands o;
  if (auto error = ReadBackward(kName, kCols, q, k, v, probs, keep, d_out, *d_q, *d_k, *d_v,
                                *d_logits, o);
      error.failure()) {
    return error;
  }
  const int Q = o.s.Q, H = o.s.H, D = o.s.D, L = o.s.L;
  const size_t row = o.s.row;
  const __m256 vscale = _mm256_set1_ps(scale);
  // One work item per (batch row, head), its query rows in blocks: P and keep are read once and
  // d_logits written once; d_v^T and d_k^T [D, L] are sums over the blocks, kept in float32.
  ParallelFor(pool, o.s.B * H, [=](int pair) {
    const int b = pair / H, h = pair % H;
    const size_t q_offset = size_t(b) * Q * row + size_t(h) * D;
    const size_t kv_offset = size_t(b) * L * row + size_t(h) * D;
    const size_t block_floats = size_t(kBackwardBlock) * L;
    const int max_pairs = (kBackwardBlock + 1) / 2;
    thread_local std::vector<uint32_t> words;
    thread_local std::vector<float> floats;
    thread_local std::vector<uint16_t> halves;
    words.resize(size_t(L) * D + size_t(2) * D * max_pairs + size_t(2) * L * max_pairs);
    floats.resize(size_t(2) * D * L + 2 * block_floats);
    halves.resize(size_t(kBackwardBlock) * D + block_floats);
    uint32_t* const v_strips = words.data();                  // v^T: [L / 32][D / 2][32]
    uint32_t* const k_strips = v_strips + size_t(L) * D / 2;  // k: [D / 32][L / 2][32]
    uint32_t* const g_t = k_strips + size_t(L) * D / 2;       // the block's d_out^T [D][pairs]
    uint32_t* const q_t = g_t + size_t(D) * max_pairs;        // and its q^T
    uint32_t* const w_strips = q_t + size_t(D) * max_pairs;   // P * keep * scale [L/32][pairs][32]
    uint32_t* const s_strips = w_strips + size_t(L) * max_pairs;   // d_logits, the same way
    float* const dv_t = floats.data();                        // d_v^T [D, L]
    float* const dk_t = dv_t + size_t(D) * L;                 // d_k^T [D, L]
    float* const dp = dk_t + size_t(D) * L;                   // a block's dW, then d_logits
    float* const dropped = dp + block_floats;                 // P * keep * scale [rows, L]
    uint16_t* const g_bf16 = halves.data();                   // the block's d_out [rows][D]
    uint16_t* const s_bf16 = g_bf16 + size_t(kBackwardBlock) * D;   // its d_logits [rows][L]
    PackPairsAlongRows(o.v + kv_offset, row, L, D, v_strips);
    PackPairsAcrossRows(o.k + kv_offset, row, L, D, k_strips);
    for (int r0 = 0; r0 < Q; r0 += kBackwardBlock) {
      const int rows = std::min(kBackwardBlock, Q - r0), pairs = (rows + 1) / 2;
      const size_t first = (size_t(pair) * Q + r0) * L;
      const float* g = o.d_out + q_offset + size_t(r0) * row;
      const float* qrows = o.q + q_offset + size_t(r0) * row;
      RowsToBf16(g, row, rows, D, g_bf16);
      Product<false>(AsPairs(g_bf16), D / 2, rows, v_strips, D / 2, L / kCols, dp, L,
                     false);   // dW = d_out v^T
      for (int r = 0; r < rows; ++r) {
        const size_t at = first + size_t(r) * L;
        SoftmaxDropoutBackwardRow(o.probs + at, o.keep + at, vscale, L, dp + size_t(r) * L,
                                  dropped + size_t(r) * L, o.d_logits + at);
        ToBf16(dp + size_t(r) * L, L, s_bf16 + size_t(r) * L);
      }
      // d_q = d_logits k, this block's rows of it.
      Product<false>(AsPairs(s_bf16), L / 2, rows, k_strips, L / 2, D / kCols,
                     o.d_q + q_offset + size_t(r0) * row, row, true);
      // d_v^T += d_out^T (P * keep * scale) and d_k^T += q^T d_logits over this block's rows.
      TransposePairs(g, row, rows, D, g_t);
      TransposePairs(qrows, row, rows, D, q_t);
      PackPairsAcrossRows(dropped, L, rows, L, w_strips);
      PackPairsAcrossRows(dp, L, rows, L, s_strips);
      if (r0 == 0) {
        Product<false>(g_t, pairs, D, w_strips, pairs, L / kCols, dv_t, L, true);
        Product<false>(q_t, pairs, D, s_strips, pairs, L / kCols, dk_t, L, true);
      } else {
        Product<true>(g_t, pairs, D, w_strips, pairs, L / kCols, dv_t, L, true);
        Product<true>(q_t, pairs, D, s_strips, pairs, L / kCols, dk_t, L, true);
      }
    }
    // [D, L] -> [L] rows of D, 16 positions at a time: each d reads one cache line of d_v^T
    // while the 16 rows being written stay in L1.
    for (int l0 = 0; l0 < L; l0 += 16) {
      for (int d = 0; d < D; ++d) {
        const float* dv_row = dv_t + size_t(d) * L + l0;
        const float* dk_row = dk_t + size_t(d) * L + l0;
        for (int l = 0; l < 16; ++l) {
          o.d_v[kv_offset + size_t(l0 + l) * row + d] = dv_row[l];
          o.d_k[kv_offset + size_t(l0 + l) * row + d] = dk_row[l];
        }
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_bf16_attention_train_fwd, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_bf16_attention_train_bwd, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale"));
