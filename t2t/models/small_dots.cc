// bf16 x bf16 -> f32 matrix products with a few rows (M <= 64), for one-token decoding on x86 CPUs
// with AVX512_BF16. Loaded by t2t/models/small_dots.py as XLA FFI handlers.
//
// At 8 rows XLA's CPU dot runs these products (the decoder's projections, FFN and tied logits) at
// ~60 GFLOP/s a core and ~5-15 GB/s of weights, so a decode step streams its ~77 MB of bf16
// weights slower than the memory allows. Here each output tile keeps its accumulators in
// registers for the whole contraction, reads the weights with software prefetch, and splits the
// columns among XLA's intra-op threads (benchmarks/EXPERIMENTS.md, "A kernel of our own").
//
//   t2t_bf16_nn: A [M, K] x W [K, N] -> C [M, N]   (K even, N a multiple of 32)
//   t2t_bf16_nt: A [M, K] x W [N, K] -> C [M, N]   (K a multiple of 32, N a multiple of 4)
//   t2t_bf16_attention: softmax(q k + bias) v, q [B, H, Q, D], k [B, H, D, L], v [B, H, L, D]
//     (D and L multiples of 32); the products are the NN tiles', so any Q.
//
// Products are accumulated in float32 by VDPBF16PS, two terms of the contraction at a time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using t2t::ParallelFor;

namespace {

constexpr int kNNPrefetchRows = 16;    // W rows ahead of the NN tile's current row pair
constexpr int kNTPrefetchBytes = 4096;  // bytes ahead of the NT tile's current position

// --- NN: one tile of MR rows x 32 columns --------------------------------------------------
// A column pair (2k, 2k+1) of W rows, interleaved by 16-bit unpacks, feeds VDPBF16PS with the
// broadcast pair A[m, 2k:2k+2]. unpacklo/hi interleave within 128-bit lanes, so the two
// accumulators hold the 32 columns in the order {0-3, 8-11, 16-19, 24-27} / {4-7, ...}; the
// stores put them back in order.
template <int MR>
inline void NNTile(const uint16_t* A, const uint16_t* W, float* C, int K, int N, int n0) {
  __m512 lo_acc[MR], hi_acc[MR];
  for (int m = 0; m < MR; ++m) {
    lo_acc[m] = _mm512_setzero_ps();
    hi_acc[m] = _mm512_setzero_ps();
  }
  const uint16_t* w = W + n0;
  for (int k = 0; k < K; k += 2) {
    if (k + kNNPrefetchRows + 1 < K) {
      _mm_prefetch(reinterpret_cast<const char*>(w + size_t(k + kNNPrefetchRows) * N), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + size_t(k + kNNPrefetchRows + 1) * N),
                   _MM_HINT_T0);
    }
    const __m512i r0 = _mm512_loadu_si512(w + size_t(k) * N);
    const __m512i r1 = _mm512_loadu_si512(w + size_t(k + 1) * N);
    const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
    const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      __builtin_memcpy(&pair, A + size_t(m) * K + k, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      lo_acc[m] = _mm512_dpbf16_ps(lo_acc[m], lo, a);
      hi_acc[m] = _mm512_dpbf16_ps(hi_acc[m], hi, a);
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int m = 0; m < MR; ++m) {
    float* c = C + size_t(m) * N + n0;
    _mm512_storeu_ps(c, _mm512_permutex2var_ps(lo_acc[m], first, hi_acc[m]));
    _mm512_storeu_ps(c + 16, _mm512_permutex2var_ps(lo_acc[m], second, hi_acc[m]));
  }
}

void NNColumns(const uint16_t* A, const uint16_t* W, float* C, int M, int K, int N, int n_begin,
               int n_end) {
  for (int n0 = n_begin; n0 < n_end; n0 += 32) {
    for (int m0 = 0; m0 < M; m0 += 8) {
      const uint16_t* a = A + size_t(m0) * K;
      float* c = C + size_t(m0) * N;
      switch (std::min(8, M - m0)) {
        case 8: NNTile<8>(a, W, c, K, N, n0); break;
        case 7: NNTile<7>(a, W, c, K, N, n0); break;
        case 6: NNTile<6>(a, W, c, K, N, n0); break;
        case 5: NNTile<5>(a, W, c, K, N, n0); break;
        case 4: NNTile<4>(a, W, c, K, N, n0); break;
        case 3: NNTile<3>(a, W, c, K, N, n0); break;
        case 2: NNTile<2>(a, W, c, K, N, n0); break;
        default: NNTile<1>(a, W, c, K, N, n0); break;
      }
    }
  }
}

// --- NT: one tile of 4 W rows x MR (<= 4) A rows --------------------------------------------
// Sixteen accumulators acc[4 * n + m] each hold 16 partial sums along K; Reduce16 adds each
// one's lanes, leaving the 16 sums in one vector in the order kReducedOrder gives.
inline __m512 AddHalves(__m512 a, __m512 b) {  // 256-bit halves: a's sums in 0-7, b's in 8-15
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
inline __m512 AddQuarters(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}
inline __m512 AddPairs(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m512 AddNeighbours(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}
inline __m512 Reduce16(const __m512* v) {
  __m512 l1[8], l2[4];
  for (int i = 0; i < 8; ++i) l1[i] = AddHalves(v[2 * i], v[2 * i + 1]);
  for (int i = 0; i < 4; ++i) l2[i] = AddQuarters(l1[2 * i], l1[2 * i + 1]);
  return AddNeighbours(AddPairs(l2[0], l2[1]), AddPairs(l2[2], l2[3]));
}

struct ReducedOrder {  // lane -> accumulator index, found by reducing accumulators of known sums
  int acc[16];
  ReducedOrder() {
    __m512 v[16];
    for (int i = 0; i < 16; ++i) v[i] = _mm512_set1_ps(float(i));
    alignas(64) float out[16];
    _mm512_store_ps(out, Reduce16(v));
    for (int lane = 0; lane < 16; ++lane) acc[lane] = int(out[lane] / 16.0f + 0.5f);
  }
};
const ReducedOrder kReducedOrder;

template <int MR>
inline void NTTile(const uint16_t* A, const uint16_t* W, float* C, int K, int N, int n0, int m0) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const uint16_t* w0 = W + size_t(n0) * K;
  const uint16_t* a0 = A + size_t(m0) * K;
  const char* ahead = reinterpret_cast<const char*>(w0) + kNTPrefetchBytes;
  for (int k = 0; k < K; k += 32) {
    const char* p = ahead + (k / 32) * 256;  // 4 lines each step: 4 KB of W per 16 steps
    _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(p + 64, _MM_HINT_T0);
    _mm_prefetch(p + 128, _MM_HINT_T0);
    _mm_prefetch(p + 192, _MM_HINT_T0);
    __m512bh w[4], a[MR];
    for (int n = 0; n < 4; ++n) w[n] = (__m512bh)_mm512_loadu_si512(w0 + size_t(n) * K + k);
    for (int m = 0; m < MR; ++m) a[m] = (__m512bh)_mm512_loadu_si512(a0 + size_t(m) * K + k);
    for (int n = 0; n < 4; ++n)
      for (int m = 0; m < MR; ++m) acc[4 * n + m] = _mm512_dpbf16_ps(acc[4 * n + m], w[n], a[m]);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, Reduce16(acc));
  for (int lane = 0; lane < 16; ++lane) {
    const int i = kReducedOrder.acc[lane], n = i / 4, m = i % 4;
    if (m < MR) C[size_t(m0 + m) * N + n0 + n] = out[lane];
  }
}

void NTRows(const uint16_t* A, const uint16_t* W, float* C, int M, int K, int N, int n_begin,
            int n_end) {
  for (int n0 = n_begin; n0 < n_end; n0 += 4) {
    for (int m0 = 0; m0 < M; m0 += 4) {
      switch (std::min(4, M - m0)) {
        case 4: NTTile<4>(A, W, C, K, N, n0, m0); break;
        case 3: NTTile<3>(A, W, C, K, N, n0, m0); break;
        case 2: NTTile<2>(A, W, C, K, N, n0, m0); break;
        default: NTTile<1>(A, W, C, K, N, n0, m0); break;
      }
    }
  }
}

// W [K, N] (transposed = false) or [N, K] (true): the columns (rows) of W are split into chunks.
template <bool kTransposed>
ffi::Error Matmul(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer w,
                  ffi::Result<ffi::AnyBuffer> c, int64_t chunk) {
  const char* name = kTransposed ? "t2t_bf16_nt" : "t2t_bf16_nn";
  const auto ad = a.dimensions(), wd = w.dimensions(), cd = c->dimensions();
  if (a.element_type() != ffi::DataType::BF16 || w.element_type() != ffi::DataType::BF16 ||
      c->element_type() != ffi::DataType::F32 || ad.size() != 2 || wd.size() != 2 ||
      cd.size() != 2) {
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": expects 2-D bf16 operands and a 2-D float32 result");
  }
  const int M = int(ad[0]), K = int(ad[1]), N = int(wd[kTransposed ? 0 : 1]);
  const int step = kTransposed ? 4 : 32;  // W rows (NT) or columns (NN) of one tile
  const bool fits = kTransposed ? K % 32 == 0 : K % 2 == 0;
  if (wd[kTransposed ? 1 : 0] != K || !fits || N % step != 0 || chunk % step != 0 || chunk <= 0 ||
      cd[0] != M || cd[1] != N) {
    return ffi::Error::InvalidArgument(
        std::string(name) + (kTransposed ? ": needs A [M, K] x W [N, K] -> [M, N], K a multiple "
                                           "of 32, N and chunk of 4"
                                         : ": needs A [M, K] x W [K, N] -> [M, N], K even, N "
                                           "and chunk multiples of 32"));
  }
  const auto* A = static_cast<const uint16_t*>(a.untyped_data());
  const auto* W = static_cast<const uint16_t*>(w.untyped_data());
  auto* C = static_cast<float*>(c->untyped_data());
  const int width = int(chunk);
  ParallelFor(pool, (N + width - 1) / width, [=](int i) {
    const int begin = i * width, end = std::min(N, (i + 1) * width);
    if (kTransposed) {
      NTRows(A, W, C, M, K, N, begin, end);
    } else {
      NNColumns(A, W, C, M, K, N, begin, end);
    }
  });
  return ffi::Error::Success();
}

// --- Attention, fused: softmax(q k + bias) v ----------------------------------------------
// For each (batch row, head) and block of query rows: logits = q K + bias, softmax in float32,
// weights rounded to bf16, out = weights V: the same operations and roundings as the unfused
// einsums, with the softmax read from a block of logits in cache instead of passes over
// [B, H, Q, L] arrays. The two products reuse the NN tiles above (K [D, L] and V [L, D] are
// row-major right-hand operands). Used for a decoding step's encoder-decoder attention over its
// cache and for whole-sequence attention without dropout (the encoder at inference).

// e^x for x <= 0 (as softmax needs): 2^n e^r with n = round(x log2 e), |r| <= ln2 / 2, and a
// degree-7 Taylor polynomial (relative error < 1e-8); x below -104 gives 0, as expf does.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
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
  return _mm512_scalef_ps(p, n);
}

// logits [L] (+ bias [L]) -> bf16 softmax weights [L]; L a multiple of 16.
void SoftmaxToBf16(float* logits, const float* bias, uint16_t* weights, int L) {
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
  // Times the sum's reciprocal, as XLA computes the softmax.
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  for (int i = 0; i < L; i += 16) {
    const __m256bh w = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(logits + i), inverse));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(weights + i), (__m256i)w);
  }
}

constexpr int kBlockRows = 64;  // query rows whose logits [rows, L] one work item keeps in cache

ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out) {
  return t2t::FusedAttention<uint16_t>(
      "t2t_bf16_attention", ffi::DataType::BF16, pool, q, k, v, bias, *out, kBlockRows,
      [](const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* bias, float* out,
         int rows, int D, int L) {
        thread_local std::vector<float> logits;
        thread_local std::vector<uint16_t> weights;
        logits.resize(size_t(rows) * L);
        weights.resize(size_t(rows) * L);
        NNColumns(q, k, logits.data(), rows, D, L, 0, L);
        for (int row = 0; row < rows; ++row) {
          SoftmaxToBf16(logits.data() + size_t(row) * L, bias + size_t(row) * L,
                        weights.data() + size_t(row) * L, L);
        }
        NNColumns(weights.data(), v, out, rows, L, D, 0, D);
      });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_bf16_attention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
// A [M, K], W, the result, and the chunk of W's columns (rows) one thread takes at a time.
static auto MatmulBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("chunk");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_bf16_nn, Matmul<false>, MatmulBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_bf16_nt, Matmul<true>, MatmulBinding());
