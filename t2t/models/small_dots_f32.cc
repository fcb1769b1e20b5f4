// float32 matrix products with a few rows (M <= 64) and fused attention, for decoding on x86 CPUs
// with AVX2 and FMA (no AVX-512 needed). Loaded by t2t/models/small_dots.py as XLA FFI handlers.
//
// A float32 decoding step multiplies 8 rows (batch 8, one token; 32 with 4 beams) by every weight
// matrix of the decoder and by the tied embedding: ~166 MB of float32 weights for T5-small, and
// reads the encoder-decoder attention's ~100 MB cache. XLA's CPU dot streams the weights at
// ~5-15 GB/s on one thread (Zen 3, benchmarks/EXPERIMENTS.md); here both threads stream them, each
// tile keeping its accumulators in registers for the whole contraction.
//
//   t2t_f32_nt: A [M, K] x W [N, K] -> C [M, N]   (K a multiple of 8, N even)
//   t2t_f32_transpose: W [K, N] -> W^T [N, K] (hoisted out of a decoding loop, unlike XLA's)
//   t2t_f32_attention: softmax(q k + bias) v, q [B, H, Q, D], k [B, H, D, L], v [B, H, L, D]
//     (D and L multiples of 32), any Q; float32 throughout.
//   t2t_f32_sequence_attention: softmax(q k^T + bias) v for whole sequences (the encoder at
//     inference) in the model's own layout, q [B, Q, H, D], k and v [B, L, H, D], bias [B or 1,
//     H or 1, Q, L] -> [B, Q, H, D] (D and L multiples of 16): both products by a register-tiled
//     6 x 16 micro-kernel, as a GEMM library would, the logits of a block of rows kept in cache.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_tiles_f32.h"
#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using t2t::ParallelFor;
using namespace t2t::f32;

namespace {

// The four sums of a, b, c and d's lanes, in that order.
inline __m128 Sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// --- NT: one tile of 2 W rows x MR (<= 4) A rows --------------------------------------------
// acc[2 * m + n] holds 8 partial sums of row m of A against row n of W: eight accumulators, two
// W and four A vectors a step, in registers. The 2 W rows are contiguous (2 K floats), read from
// memory by the first rows of A (which prefetch the next tile's at the rate they read their own)
// and from cache after. Of 1, 2 or 4 W rows a tile, 2 was the fastest on a Zen 3 for the decode
// step's shapes (8 or 32 rows against [32128, 512], [2048, 512], [512, 2048], [512, 512]).
constexpr int kNW = 2;   // W rows of a tile
constexpr int kMR = 4;   // A rows of a full tile

template <int MR>
inline void NTTile(const float* A, const float* W, float* C, int K, int N, int n0, int m0) {
  constexpr int kAcc = kNW * MR;
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_setzero_ps();
  const float* w0 = W + size_t(n0) * K;
  const float* a0 = A + size_t(m0) * K;
  const char* next_tile = reinterpret_cast<const char*>(w0 + kNW * size_t(K));
  for (int k = 0; k < K; k += 8) {
    if (m0 == 0) {  // one line (kNW * 32 bytes) of W a step
      const int offset = k * 4 * kNW;
      _mm_prefetch(next_tile + offset, _MM_HINT_T0);
    }
    __m256 w[kNW];
    for (int n = 0; n < kNW; ++n) w[n] = _mm256_loadu_ps(w0 + size_t(n) * K + k);
    for (int m = 0; m < MR; ++m) {
      const __m256 a = _mm256_loadu_ps(a0 + size_t(m) * K + k);
      for (int n = 0; n < kNW; ++n) acc[kNW * m + n] = _mm256_fmadd_ps(w[n], a, acc[kNW * m + n]);
    }
  }
  alignas(32) float sums[8];
  for (int i = 0; i < kAcc; i += 4) {
    _mm_store_ps(sums + i, Sum4(acc[i], acc[std::min(i + 1, kAcc - 1)],
                                acc[std::min(i + 2, kAcc - 1)], acc[std::min(i + 3, kAcc - 1)]));
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < kNW; ++n) C[size_t(m0 + m) * N + n0 + n] = sums[kNW * m + n];
}

void NTRows(const float* A, const float* W, float* C, int M, int K, int N, int n_begin,
            int n_end) {
  for (int n0 = n_begin; n0 < n_end; n0 += kNW) {
    for (int m0 = 0; m0 < M; m0 += kMR) {
      switch (std::min(kMR, M - m0)) {
        case 4: NTTile<4>(A, W, C, K, N, n0, m0); break;
        case 3: NTTile<3>(A, W, C, K, N, n0, m0); break;
        case 2: NTTile<2>(A, W, C, K, N, n0, m0); break;
        default: NTTile<1>(A, W, C, K, N, n0, m0); break;
      }
    }
  }
}

ffi::Error MatmulNT(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer w,
                    ffi::Result<ffi::AnyBuffer> c, int64_t chunk) {
  const auto ad = a.dimensions(), wd = w.dimensions(), cd = c->dimensions();
  if (a.element_type() != ffi::DataType::F32 || w.element_type() != ffi::DataType::F32 ||
      c->element_type() != ffi::DataType::F32 || ad.size() != 2 || wd.size() != 2 ||
      cd.size() != 2) {
    return ffi::Error::InvalidArgument("t2t_f32_nt: expects 2-D float32 operands and result");
  }
  const int M = int(ad[0]), K = int(ad[1]), N = int(wd[0]);
  if (wd[1] != K || K % 8 != 0 || N % kNW != 0 || chunk % kNW != 0 || chunk <= 0 || cd[0] != M ||
      cd[1] != N) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_nt: needs A [M, K] x W [N, K] -> [M, N], K a multiple of 8, N and chunk even");
  }
  const auto* A = static_cast<const float*>(a.untyped_data());
  const auto* W = static_cast<const float*>(w.untyped_data());
  auto* C = static_cast<float*>(c->untyped_data());
  const int width = int(chunk);
  ParallelFor(pool, (N + width - 1) / width, [=](int i) {
    NTRows(A, W, C, M, K, N, i * width, std::min(N, (i + 1) * width));
  });
  return ffi::Error::Success();
}

// --- W [K, N] -> W^T [N, K], for NT products over a [K, N] weight (`weights_reused`) ---------
// A custom call, unlike XLA's transpose, is hoisted out of a decoding loop by XLA's
// loop-invariant code motion, so the transpose runs once per decode, not once per token.
constexpr int kTransposeBlock = 32;

ffi::Error Transpose(ffi::ThreadPool pool, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out) {
  const auto wd = w.dimensions(), od = out->dimensions();
  if (w.element_type() != ffi::DataType::F32 || out->element_type() != ffi::DataType::F32 ||
      wd.size() != 2 || od.size() != 2 || od[0] != wd[1] || od[1] != wd[0]) {
    return ffi::Error::InvalidArgument("t2t_f32_transpose: expects float32 [K, N] -> [N, K]");
  }
  const int K = int(wd[0]), N = int(wd[1]);
  const auto* W = static_cast<const float*>(w.untyped_data());
  auto* T = static_cast<float*>(out->untyped_data());
  const int row_blocks = (K + kTransposeBlock - 1) / kTransposeBlock;
  ParallelFor(pool, row_blocks, [=](int block) {
    const int k0 = block * kTransposeBlock, k1 = std::min(K, k0 + kTransposeBlock);
    for (int n0 = 0; n0 < N; n0 += kTransposeBlock) {
      const int n1 = std::min(N, n0 + kTransposeBlock);
      for (int n = n0; n < n1; ++n)
        for (int k = k0; k < k1; ++k) T[size_t(n) * K + k] = W[size_t(k) * N + n];
    }
  });
  return ffi::Error::Success();
}

// --- NN: one tile of MR (<= 2) A rows x 32 columns of W [K, N] -------------------------------
// For one row, even and odd k go to two sets of accumulators (eight independent FMA chains).
template <int MR>
inline void NNTile(const float* A, const float* W, float* C, int K, int N, int n0) {
  constexpr int kSets = MR == 1 ? 2 : 1;
  __m256 acc[kSets][MR][4];
  for (int s = 0; s < kSets; ++s)
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 4; ++j) acc[s][m][j] = _mm256_setzero_ps();
  const float* w = W + n0;
  for (int k = 0; k < K; k += kSets) {
    for (int s = 0; s < kSets; ++s) {
      const float* row = w + size_t(k + s) * N;
      __m256 wv[4];
      for (int j = 0; j < 4; ++j) wv[j] = _mm256_loadu_ps(row + 8 * j);
      for (int m = 0; m < MR; ++m) {
        const __m256 av = _mm256_broadcast_ss(A + size_t(m) * K + k + s);
        for (int j = 0; j < 4; ++j) acc[s][m][j] = _mm256_fmadd_ps(av, wv[j], acc[s][m][j]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    float* c = C + size_t(m) * N + n0;
    for (int j = 0; j < 4; ++j) {
      __m256 sum = acc[0][m][j];
      if (kSets == 2) sum = _mm256_add_ps(sum, acc[kSets - 1][m][j]);
      _mm256_storeu_ps(c + 8 * j, sum);
    }
  }
}

// A [M, K] x W [K, N] -> C [M, N], N a multiple of 32 (K even for a single row).
void NNRows(const float* A, const float* W, float* C, int M, int K, int N) {
  for (int m0 = 0; m0 < M; m0 += 2) {
    const float* a = A + size_t(m0) * K;
    float* c = C + size_t(m0) * N;
    for (int n0 = 0; n0 < N; n0 += 32) {
      if (M - m0 >= 2) {
        NNTile<2>(a, W, c, K, N, n0);
      } else {
        NNTile<1>(a, W, c, K, N, n0);
      }
    }
  }
}

// --- Attention, fused: softmax(q k + bias) v ----------------------------------------------
// As small_dots.cc's t2t_bf16_attention, in float32: for each (batch row, head) and block of
// query rows, logits = q K + bias, softmax, out = weights V, the logits of a block kept in cache
// (e^x and the softmax: attention_tiles_f32.h).

constexpr int kBlockRows = 64;  // query rows whose logits [rows, L] one work item keeps in cache

ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out) {
  return t2t::FusedAttention<float>(
      "t2t_f32_attention", ffi::DataType::F32, pool, q, k, v, bias, *out, kBlockRows,
      [](const float* q, const float* k, const float* v, const float* bias, float* out, int rows,
         int D, int L) {
        thread_local std::vector<float> logits;
        logits.resize(size_t(rows) * L);
        NNRows(q, k, logits.data(), rows, D, L);
        for (int row = 0; row < rows; ++row) {
          Softmax(logits.data() + size_t(row) * L, bias + size_t(row) * L, L);
        }
        NNRows(logits.data(), v, out, rows, L, D);
      });
}

// --- Whole-sequence attention: softmax(q k^T + bias) v in [B, Q|L, H, D] layouts -------------
// For one (batch row, head) and a block of query rows: logits [rows, L] = q k^T by 6 x 16
// micro-tiles over k packed as [L / 16][D][16] (16 keys a strip), bias and softmax row by row,
// then out [rows, D] = weights v by micro-tiles over v packed as [D / 16][L][16]. A micro-tile
// keeps its 6 x 16 sums in 12 registers for the whole contraction and reads its 6 rows of A in
// place (a row's D or L floats stay in L1), so only k and v are repacked, once per work item.
constexpr int kSequenceBlock = 96;   // query rows of a work item: logits [96, L] in L2

ffi::Error SequenceAttention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                             ffi::AnyBuffer v, ffi::AnyBuffer bias,
                             ffi::Result<ffi::AnyBuffer> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), bd = bias.dimensions();
  const auto od = out->dimensions();
  const auto f32 = ffi::DataType::F32;
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || bd.size() != 4 || od.size() != 4 ||
      q.element_type() != f32 || k.element_type() != f32 || v.element_type() != f32 ||
      bias.element_type() != f32 || out->element_type() != f32) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_sequence_attention: expects float32 q [B, Q, H, D], k and v [B, L, H, D], "
        "bias [B or 1, H or 1, Q, L] and a float32 result [B, Q, H, D]");
  }
  const int B = int(qd[0]), Q = int(qd[1]), H = int(qd[2]), D = int(qd[3]), L = int(kd[1]);
  if (kd[0] != B || kd[2] != H || kd[3] != D || vd[0] != B || vd[1] != L || vd[2] != H ||
      vd[3] != D || (bd[0] != B && bd[0] != 1) || (bd[1] != H && bd[1] != 1) || bd[2] != Q ||
      bd[3] != L || od[0] != B || od[1] != Q || od[2] != H || od[3] != D || D % kTileCols != 0 ||
      L % kTileCols != 0) {
    return ffi::Error::InvalidArgument(
        "t2t_f32_sequence_attention: shapes disagree, or D or L is not a multiple of 16");
  }
  const auto* Qp = static_cast<const float*>(q.untyped_data());
  const auto* Kp = static_cast<const float*>(k.untyped_data());
  const auto* Vp = static_cast<const float*>(v.untyped_data());
  const auto* Bp = static_cast<const float*>(bias.untyped_data());
  auto* Op = static_cast<float*>(out->untyped_data());
  const size_t bias_b = bd[0] == 1 ? 0 : size_t(bd[1]) * Q * L;
  const size_t bias_h = bd[1] == 1 ? 0 : size_t(Q) * L;
  const size_t row = size_t(H) * D;   // stride between positions in q, k, v and out
  // Every (batch row, head)'s k as [L / 16][D][16] and v as [D / 16][L][16], packed once in a
  // buffer the calling thread keeps (so its pages are not faulted in again every call).
  thread_local std::vector<float> packed;
  const size_t pair_floats = size_t(2) * L * D;
  packed.resize(size_t(B) * H * pair_floats);
  float* const packed_data = packed.data();
  ParallelFor(pool, B * H, [=](int pair) {
    const int b = pair / H, h = pair % H;
    const float* kbh = Kp + size_t(b) * L * row + size_t(h) * D;
    const float* vbh = Vp + size_t(b) * L * row + size_t(h) * D;
    float* keys = packed_data + size_t(pair) * pair_floats;
    PackTransposedStrips(kbh, row, L, D, keys);
    PackStrips(vbh, row, L, D, keys + size_t(L) * D);
  });
  const int blocks = (Q + kSequenceBlock - 1) / kSequenceBlock;
  ParallelFor(pool, B * H * blocks, [=](int item) {
    const int pair = item / blocks, r0 = (item % blocks) * kSequenceBlock;
    const int b = pair / H, h = pair % H, rows = std::min(kSequenceBlock, Q - r0);
    const float* keys = packed_data + size_t(pair) * pair_floats;
    const float* values = keys + size_t(L) * D;
    thread_local std::vector<float> logits;
    logits.resize(size_t(kSequenceBlock) * L);
    const float* qrows = Qp + (size_t(b) * Q + r0) * row + size_t(h) * D;
    TiledProduct(qrows, row, rows, keys, D, L / kTileCols, logits.data(), L, false);
    const float* brows = Bp + b * bias_b + h * bias_h + size_t(r0) * L;
    for (int r = 0; r < rows; ++r) Softmax(logits.data() + size_t(r) * L, brows + size_t(r) * L, L);
    float* orows = Op + (size_t(b) * Q + r0) * row + size_t(h) * D;
    TiledProduct(logits.data(), L, rows, values, L, D / kTileCols, orows, row, true);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_transpose, Transpose,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_attention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
// A [M, K], W [N, K], the result, and the rows of W one thread takes at a time.
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_nt, MatmulNT,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("chunk"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_f32_sequence_attention, SequenceAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
