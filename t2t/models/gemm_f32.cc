// float32 matrix products of whole sequences (GEMM) for x86 CPUs with AVX2 and FMA, or AVX-512F,
// as an XLA FFI handler; loaded by t2t/models/gemm.py for the weight products' backward pass.
//
// Why: in T5-small's float32 gradient program XLA:CPU materialises transposed copies of large
// activation gradients to feed its dot ([8 * 512, 2048] for every encoder FFN's weight gradient,
// [32128, 8 * 114] for the tied embedding's), ~1.2 s of a ~10 s step on a 2-core Zen 3
// (benchmarks/EXPERIMENTS.md, "Float32 on Zen 3"). This GEMM reads either operand
// transposed in place, so none is copied; on plain products it is about as fast as XLA's dot.
// It is the textbook blocked GEMM (Goto's algorithm, as BLIS and OpenBLAS organise it):
//   for each block of NC columns of op(B) and KC of its rows: pack that [KC, NC] block into
//   strips of NR columns, [KC][NR] each (it stays in the L3 cache);
//     for each block of MC rows of op(A): pack its [MC, KC] into panels of MR rows, [KC][MR];
//       for each strip and panel: the MR x NR micro-kernel, its 12 accumulators in registers
//       for the whole KC, adds into C (the first KC block writes C).
// Packing also takes care of the transposes (op(X) = X or X^T) and of ragged edges (zeros).
// Rows or columns of C are shared among XLA's intra-op threads in chunks; each chunk packs its
// own blocks.
//
//   t2t_f32_gemm: C [M, N] = op(A) [M, K] x op(B) [K, N], A [M, K] or (transpose_a) [K, M],
//     B [K, N] or (transpose_b) [N, K]; any sizes; float32, row-major.
//   t2t_f32_gemm_avx512 (this source built with -DT2T_GEMM_AVX512): the same with AVX-512 vectors
//     of 16 and a 12 x 32 micro-tile (24 of the 32 registers accumulate). Each element of C is
//     summed over k in the same order by both builds, so they agree to the bit. Where a core has
//     two full-width 512-bit FMA units (Intel Xeon), it does twice the AVX2 build's work a cycle.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using t2t::ParallelFor;

namespace {

#if defined(T2T_GEMM_AVX512)
using Vec = __m512;
constexpr int kLanes = 16;
constexpr int kMR = 12;    // rows of a micro-tile: 12 x 2 vectors of 16 = 24 accumulators
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Load(const float* p) { return _mm512_load_ps(p); }
inline Vec LoadU(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm512_store_ps(p, v); }
inline void StoreU(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
#else
using Vec = __m256;
constexpr int kLanes = 8;
constexpr int kMR = 6;     // rows of a micro-tile: 6 x 2 vectors of 8 = 12 accumulators
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Load(const float* p) { return _mm256_load_ps(p); }
inline Vec LoadU(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm256_store_ps(p, v); }
inline void StoreU(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
#endif
constexpr int kNR = 2 * kLanes;            // columns of a micro-tile: two vectors
constexpr int kAlign = kLanes * 4;         // bytes: the packed strips' aligned loads
constexpr int kKC = 256;   // depth of a packed block: a [KC][NR] strip (16 / 32 KB) fits in L1
constexpr int kMC = 96;    // rows of a packed A block, [MC][KC] = 96 KB, in L2 (a multiple of MR)
constexpr int kNC = 2048;  // columns of a packed B block, [KC][NC] = 2 MB, in L3
static_assert(kMC % kMR == 0, "A blocks hold whole panels");

// C [MR, NR] (+)= a [kc][MR] x b [kc][NR]; ACCUMULATE adds into C, else overwrites it.
template <bool ACCUMULATE>
inline void MicroKernel(int kc, const float* __restrict a, const float* __restrict b, float* c,
                        size_t ldc) {
  Vec acc[kMR][2];
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = Zero();
  for (int k = 0; k < kc; ++k, a += kMR, b += kNR) {
    const Vec b0 = Load(b), b1 = Load(b + kLanes);
    for (int i = 0; i < kMR; ++i) {
      const Vec x = Broadcast(a + i);
      acc[i][0] = Fma(x, b0, acc[i][0]);
      acc[i][1] = Fma(x, b1, acc[i][1]);
    }
  }
  for (int i = 0; i < kMR; ++i) {
    float* row = c + size_t(i) * ldc;
    if (ACCUMULATE) {
      acc[i][0] = Add(acc[i][0], LoadU(row));
      acc[i][1] = Add(acc[i][1], LoadU(row + kLanes));
    }
    StoreU(row, acc[i][0]);
    StoreU(row + kLanes, acc[i][1]);
  }
}

// Rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into panels of MR rows, out[panel][k][MR];
// rows past the end are zeros. A is [M, K] (lda = K) or, transposed, [K, M] (lda = M).
void PackA(const float* A, size_t lda, bool transposed, int i0, int mc, int p0, int kc,
           float* out) {
  for (int ib = 0; ib < mc; ib += kMR, out += size_t(kMR) * kc) {
    const int rows = std::min(kMR, mc - ib);
    if (!transposed) {
      for (int r = 0; r < rows; ++r) {
        const float* src = A + size_t(i0 + ib + r) * lda + p0;
        for (int k = 0; k < kc; ++k) out[k * kMR + r] = src[k];
      }
    } else {
      for (int k = 0; k < kc; ++k) {
        const float* src = A + size_t(p0 + k) * lda + i0 + ib;
        for (int r = 0; r < rows; ++r) out[k * kMR + r] = src[r];
      }
    }
    for (int r = rows; r < kMR; ++r)
      for (int k = 0; k < kc; ++k) out[k * kMR + r] = 0.0f;
  }
}

// Depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) into strips of NR columns,
// out[strip][k][NR]; columns past the end are zeros. B is [K, N] (ldb = N) or, transposed,
// [N, K] (ldb = K).
void PackB(const float* B, size_t ldb, bool transposed, int p0, int kc, int j0, int nc,
           float* out) {
  for (int jb = 0; jb < nc; jb += kNR, out += size_t(kNR) * kc) {
    const int cols = std::min(kNR, nc - jb);
    if (!transposed) {
      for (int k = 0; k < kc; ++k) {
        const float* src = B + size_t(p0 + k) * ldb + j0 + jb;
        float* dst = out + k * kNR;
        if (cols == kNR) {
          Store(dst, LoadU(src));
          Store(dst + kLanes, LoadU(src + kLanes));
        } else {
          for (int c = 0; c < kNR; ++c) dst[c] = c < cols ? src[c] : 0.0f;
        }
      }
    } else {
      for (int c = 0; c < cols; ++c) {
        const float* src = B + size_t(j0 + jb + c) * ldb + p0;
        for (int k = 0; k < kc; ++k) out[k * kNR + c] = src[k];
      }
      for (int c = cols; c < kNR; ++c)
        for (int k = 0; k < kc; ++k) out[k * kNR + c] = 0.0f;
    }
  }
}

// A thread's packing buffers, aligned for the micro-kernel's aligned loads of B.
float* Scratch(std::vector<float>& buffer, size_t floats) {
  buffer.resize(floats + kLanes);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + kAlign - 1) &
                                  ~uintptr_t(kAlign - 1));
}

struct Operands {
  const float* A;
  const float* B;
  float* C;
  int M, N, K;
  size_t lda, ldb;
  bool transpose_a, transpose_b;
};

// C[m0:m1, n0:n1]; n0 a multiple of NR.
void GemmBlock(const Operands& p, int m0, int m1, int n0, int n1) {
  thread_local std::vector<float> a_buffer, b_buffer;
  float* packed_a = Scratch(a_buffer, size_t(kMC + kMR) * kKC);
  float* packed_b = Scratch(b_buffer, size_t(kNC + kNR) * kKC);
  alignas(kAlign) float edge[kMR * kNR];
  const size_t ldc = size_t(p.N);
  for (int j0 = n0; j0 < n1; j0 += kNC) {
    const int nc = std::min(kNC, n1 - j0);
    for (int p0 = 0; p0 < p.K; p0 += kKC) {
      const int kc = std::min(kKC, p.K - p0);
      const bool first = p0 == 0;
      PackB(p.B, p.ldb, p.transpose_b, p0, kc, j0, nc, packed_b);
      for (int i0 = m0; i0 < m1; i0 += kMC) {
        const int mc = std::min(kMC, m1 - i0);
        PackA(p.A, p.lda, p.transpose_a, i0, mc, p0, kc, packed_a);
        for (int jb = 0; jb < nc; jb += kNR) {
          const float* b = packed_b + size_t(jb) * kc;
          const int cols = std::min(kNR, nc - jb);
          for (int ib = 0; ib < mc; ib += kMR) {
            const float* a = packed_a + size_t(ib) * kc;
            const int rows = std::min(kMR, mc - ib);
            float* c = p.C + size_t(i0 + ib) * ldc + j0 + jb;
            if (rows == kMR && cols == kNR) {
              if (first) {
                MicroKernel<false>(kc, a, b, c, ldc);
              } else {
                MicroKernel<true>(kc, a, b, c, ldc);
              }
              continue;
            }
            MicroKernel<false>(kc, a, b, edge, kNR);
            for (int r = 0; r < rows; ++r) {
              float* row = c + size_t(r) * ldc;
              for (int q = 0; q < cols; ++q) row[q] = (first ? 0.0f : row[q]) + edge[r * kNR + q];
            }
          }
        }
      }
    }
  }
}

ffi::Error Gemm(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                ffi::Result<ffi::AnyBuffer> c, bool transpose_a, bool transpose_b) {
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  if (a.element_type() != ffi::DataType::F32 || b.element_type() != ffi::DataType::F32 ||
      c->element_type() != ffi::DataType::F32 || ad.size() != 2 || bd.size() != 2 ||
      cd.size() != 2) {
    return ffi::Error::InvalidArgument("t2t_f32_gemm: expects 2-D float32 operands and result");
  }
  const int64_t M = transpose_a ? ad[1] : ad[0], K = transpose_a ? ad[0] : ad[1];
  const int64_t N = transpose_b ? bd[0] : bd[1], KB = transpose_b ? bd[1] : bd[0];
  if (KB != K || cd[0] != M || cd[1] != N || M >= (int64_t(1) << 31) ||
      N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31)) {
    return ffi::Error::InvalidArgument("t2t_f32_gemm: needs op(A) [M, K] x op(B) [K, N] -> [M, N]");
  }
  if (M == 0 || N == 0) return ffi::Error::Success();
  auto* C = static_cast<float*>(c->untyped_data());
  if (K == 0) {
    std::fill(C, C + M * N, 0.0f);
    return ffi::Error::Success();
  }
  const Operands p{static_cast<const float*>(a.untyped_data()),
                   static_cast<const float*>(b.untyped_data()),
                   C, int(M), int(N), int(K), size_t(ad[1]), size_t(bd[1]), transpose_a,
                   transpose_b};
  // Two chunks a thread (one late helper then leaves at most half a share to the others), of
  // rows when C is at least as tall as it is wide, else of columns: each chunk packs the whole
  // of the other operand, so the split that repeats the smaller packing wins (a weight
  // gradient's x^T g has 512 rows against 2048 columns and 4096-deep operands).
  const int threads = std::max<int>(1, int(pool.num_threads()));
  const bool by_rows = M >= N;
  const int64_t extent = by_rows ? M : N, unit = by_rows ? kMR : kNR;
  const int64_t share = (extent + 2 * threads - 1) / (2 * threads);
  const int64_t least = by_rows ? kMC : 4 * kNR;
  const int chunk = int(std::max<int64_t>(least, (share + unit - 1) / unit * unit));
  ParallelFor(pool, int((extent + chunk - 1) / chunk), [&p, chunk, by_rows](int i) {
    if (by_rows) {
      GemmBlock(p, i * chunk, std::min(p.M, (i + 1) * chunk), 0, p.N);
    } else {
      GemmBlock(p, 0, p.M, i * chunk, std::min(p.N, (i + 1) * chunk));
    }
  });
  return ffi::Error::Success();
}

}  // namespace

#if defined(T2T_GEMM_AVX512)
#define T2T_GEMM_HANDLER t2t_f32_gemm_avx512
#else
#define T2T_GEMM_HANDLER t2t_f32_gemm
#endif

XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_GEMM_HANDLER, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
