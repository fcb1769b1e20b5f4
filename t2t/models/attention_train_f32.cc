// Whole-sequence attention with dropout on its weights, forward and backward, in float32 on x86
// CPUs with AVX2 and FMA: the training step's encoder self-attention and encoder-decoder
// attention. Loaded by t2t/models/small_dots.py (library ATTENTION_TRAIN_F32) as XLA FFI handlers
// and used by t2t/models/train_attention.py.
//
// XLA computes a T5-small layer's training attention (batch 8, 8 heads, 512 x 512) as ~10 fusions
// that each pass over [8, 8, 512, 512] float32 tensors (logits, softmax, dropout, their
// gradients), ~55-67 GFLOP/s on a 2-core Zen 3 (benchmarks/EXPERIMENTS.md). Here one work item is
// one (batch row, head): its products run through attention_tiles_f32.h's 6 x 16 register tiles
// and the elementwise steps are done row by row while the row is in cache.
//
//   t2t_f32_attention_train_fwd: q [B, Q, H, D], k and v [B, L, H, D], bias [B or 1, H or 1, Q, L],
//     keep (bool) [B, H, Q, L], attribute scale (1 / keep probability) ->
//     out [B, Q, H, D] = (P * keep * scale) v and P [B, H, Q, L] = softmax(q k^T + bias).
//   t2t_f32_attention_train_bwd: q, k, v, P, keep, d_out [B, Q, H, D], scale ->
//     d_q, d_k, d_v and d_logits [B, H, Q, L] (the bias's gradient before any broadcast sum):
//       dW = d_out v^T,  dP = dW * keep * scale,  d_logits = P * (dP - rowsum(dP * P)),
//       d_v = (P * keep * scale)^T d_out,  d_q = d_logits k,  d_k = d_logits^T q.
// D and L multiples of 16; Q any.
//
// Built with -DT2T_ATTENTION_AVX512 (library ATTENTION_TRAIN_F32_AVX512), the same source runs on
// attention_tiles_f32_avx512.h's 6 x 32 tiles of zmm sums and registers
// t2t_f32_avx512_attention_train_fwd / _bwd, for D and L multiples of 32.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_tiles_f32.h"
#include "attention_train_common.h"
#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

#if defined(T2T_ATTENTION_AVX512)
#include "attention_tiles_f32_avx512.h"
#endif

namespace ffi = xla::ffi;
using t2t::ParallelFor;
using namespace t2t::attention_train;

#if defined(T2T_ATTENTION_AVX512)
using namespace t2t::f32_avx512;
#define T2T_ATTENTION_FWD t2t_f32_avx512_attention_train_fwd
#define T2T_ATTENTION_BWD t2t_f32_avx512_attention_train_bwd
#define T2T_ATTENTION_NAME "t2t_f32_avx512_attention_train"
#else
using namespace t2t::f32;
#define T2T_ATTENTION_FWD t2t_f32_attention_train_fwd
#define T2T_ATTENTION_BWD t2t_f32_attention_train_bwd
#define T2T_ATTENTION_NAME "t2t_f32_attention_train"
#endif

namespace {

constexpr int kForwardBlock = 96;    // query rows of a forward work item: their P [96, L] in L2
constexpr int kBackwardBlock = 96;   // query rows a backward step takes: two [96, L] in L2

ffi::Error Forward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer bias, ffi::AnyBuffer keep, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> probs, float scale) {
  static const char* kName = T2T_ATTENTION_NAME "_fwd";
  ForwardOperands o;
  if (auto error = ReadForward(kName, kTileCols, q, k, v, bias, keep, *out, *probs, o);
      error.failure()) {
    return error;
  }
  const int B = o.s.B, Q = o.s.Q, H = o.s.H, D = o.s.D, L = o.s.L;
  const size_t row = o.s.row;
  // k as [L / 16][D][16] and v as [D / 16][L][16] for every (batch row, head), packed once.
  thread_local std::vector<float> packed;
  const size_t pair_floats = size_t(2) * L * D;
  packed.resize(size_t(B) * H * pair_floats);
  float* const packed_data = packed.data();
  ParallelFor(pool, B * H, [=](int pair) {
    const size_t offset = size_t(pair / H) * L * row + size_t(pair % H) * D;
    float* keys = packed_data + size_t(pair) * pair_floats;
    PackTransposedStrips(o.k + offset, row, L, D, keys);
    PackStrips(o.v + offset, row, L, D, keys + size_t(L) * D);
  });
  const int blocks = (Q + kForwardBlock - 1) / kForwardBlock;
  ParallelFor(pool, B * H * blocks, [=](int item) {
    const int pair = item / blocks, r0 = (item % blocks) * kForwardBlock;
    const int b = pair / H, h = pair % H, rows = std::min(kForwardBlock, Q - r0);
    const float* keys = packed_data + size_t(pair) * pair_floats;
    const float* values = keys + size_t(L) * D;
    const size_t first = (size_t(pair) * Q + r0) * L;   // P's and keep's [rows, L] block
    float* p = o.probs + first;
    const float* qrows = o.q + (size_t(b) * Q + r0) * row + size_t(h) * D;
    TiledProduct(qrows, row, rows, keys, D, L / kTileCols, p, L, false);
    const float* brows = o.bias + b * o.bias_b + h * o.bias_h + size_t(r0) * L;
    thread_local std::vector<float> dropped;
    dropped.resize(size_t(kForwardBlock) * L);
    for (int r = 0; r < rows; ++r) {
      float* pr = p + size_t(r) * L;
      Softmax(pr, brows + size_t(r) * L, L);
      DropoutRow(pr, o.keep + first + size_t(r) * L, scale, L, dropped.data() + size_t(r) * L);
    }
    float* orows = o.out + (size_t(b) * Q + r0) * row + size_t(h) * D;
    TiledProduct(dropped.data(), L, rows, values, L, D / kTileCols, orows, row, true);
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer probs, ffi::AnyBuffer keep, ffi::AnyBuffer d_out,
                    ffi::Result<ffi::AnyBuffer> d_q, ffi::Result<ffi::AnyBuffer> d_k,
                    ffi::Result<ffi::AnyBuffer> d_v, ffi::Result<ffi::AnyBuffer> d_logits,
                    float scale) {
  static const char* kName = T2T_ATTENTION_NAME "_bwd";
  BackwardOperands o;
  if (auto error = ReadBackward(kName, kTileCols, q, k, v, probs, keep, d_out, *d_q, *d_k, *d_v,
                                *d_logits, o);
      error.failure()) {
    return error;
  }
  const int Q = o.s.Q, H = o.s.H, D = o.s.D, L = o.s.L;
  const size_t row = o.s.row;
  const int strips = L / kTileCols;
  // One work item per (batch row, head), its query rows in blocks whose [rows, L] pieces stay in
  // L2: P and keep are read once and d_logits written once. d_v and d_k [L, D] are sums over the
  // blocks, each block's part a product whose left operand is read transposed in place
  // (attention_tiles_f32.h's kTransposedA), so they accumulate in their own [B, L, H, D] rows.
  ParallelFor(pool, o.s.B * H, [=](int pair) {
    const int b = pair / H, h = pair % H;
    const size_t q_offset = size_t(b) * Q * row + size_t(h) * D;
    const size_t kv_offset = size_t(b) * L * row + size_t(h) * D;
    thread_local std::vector<float> buffer;
    const size_t block_floats = size_t(kBackwardBlock) * L;
    buffer.resize(size_t(2) * L * D + 2 * block_floats + size_t(2) * D * kBackwardBlock);
    float* const v_strips = buffer.data();                 // v^T as [L / 16][D][16]
    float* const k_strips = v_strips + size_t(L) * D;      // k as [D / 16][L][16]
    float* const dp = k_strips + size_t(L) * D;            // a block's dW, dP, then d_logits [rows, L]
    float* const dropped = dp + block_floats;              // P * keep * scale, [rows, L]
    float* const g_strips = dropped + block_floats;        // the block's d_out, [D / 16][rows][16]
    float* const q_strips = g_strips + size_t(D) * kBackwardBlock;   // and its q, the same way
    PackTransposedStrips(o.v + kv_offset, row, L, D, v_strips);
    PackStrips(o.k + kv_offset, row, L, D, k_strips);
    for (int r0 = 0; r0 < Q; r0 += kBackwardBlock) {
      const int rows = std::min(kBackwardBlock, Q - r0);
      const size_t first = (size_t(pair) * Q + r0) * L;
      const float* g = o.d_out + q_offset + size_t(r0) * row;
      const float* qrows = o.q + q_offset + size_t(r0) * row;
      TiledProduct(g, row, rows, v_strips, D, strips, dp, L, false);   // dW = d_out v^T
      for (int r = 0; r < rows; ++r) {
        const size_t at = first + size_t(r) * L;
        SoftmaxDropoutBackwardRow(o.probs + at, o.keep + at, scale, L, dp + size_t(r) * L,
                                  dropped + size_t(r) * L, o.d_logits + at);
      }
      // d_q = d_logits k, this block's rows of it.
      TiledProduct(dp, L, rows, k_strips, L, D / kTileCols,
                   o.d_q + q_offset + size_t(r0) * row, row, true);
      // d_v += (P * keep * scale)^T d_out and d_k += d_logits^T q over this block's rows.
      PackStrips(g, row, rows, D, g_strips);
      PackStrips(qrows, row, rows, D, q_strips);
      float* const dv = o.d_v + kv_offset;
      float* const dk = o.d_k + kv_offset;
      if (r0 == 0) {
        TiledProduct<true, false>(dropped, L, L, g_strips, rows, D / kTileCols, dv, row, true);
        TiledProduct<true, false>(dp, L, L, q_strips, rows, D / kTileCols, dk, row, true);
      } else {
        TiledProduct<true, true>(dropped, L, L, g_strips, rows, D / kTileCols, dv, row, true);
        TiledProduct<true, true>(dp, L, L, q_strips, rows, D / kTileCols, dk, row, true);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_ATTENTION_FWD, Forward,
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_ATTENTION_BWD, Backward,
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
