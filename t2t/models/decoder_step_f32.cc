// One float32 T5 decoder layer's decoding step in one XLA FFI call, for x86 CPUs with AVX-512F.
// Loaded by t2t/models/decoder_step.py as the handler `t2t_f32_decoder_layer_step`.
//
// Why one call. A decoding step of T5-small reads ~267 MB (weights, the encoder's keys and
// values, the self-attention cache) for 8 rows; t2t's per-product kernels stream them at ~28 GB/s,
// but the step also runs ~160 small XLA thunks (norms, residual adds, softmaxes, cache updates)
// and ~55 kernel calls a token, each a fork and join of the threads: 11.3 ms a token where a
// standalone C++ step over the same data takes ~8.6 (benchmarks/EXPERIMENTS.md, "A decoder layer's
// step in one call"). Here a layer is one call in eight dependent stages whose work items
// (weight panels, heads) go to whichever thread takes them first: the caller, and XLA's pool
// threads from whenever they start (a thread starting late joins the stage in progress, so no
// thread ever waits for another to arrive). Nothing is written back to XLA but the new residual
// stream and the cache slot.
//
// The step (T5 §2.1, pre-norm residual blocks; rows = batch x beams, one token each):
//   h = rms(x) ln1; q, k, v = h Wq, h Wk, h Wv; the cache slot `index` <- k, v;
//   x += softmax(q K^T + self_bias) V Wo                     (self-attention over the cache)
//   h = rms(x) ln2; x += softmax(h Wq2 Kx + cross_bias) Vx Wo2 (encoder-decoder attention)
//   h = rms(x) ln3; x += act(h Wi [, h Wi1]) Wf               (ReLU, or gated GELU)
// with rms(x) = x / sqrt(mean(x^2) + eps), no logit scaling (T5 folds it into Wq), no biases.
//
// Operands (float32 unless said): x [M, D]; ln1 [D]; Wq, Wk, Wv as panels [ceil(HK / 32), D,
// 32] (small_dots' `pack_panels`, HK = heads x d_kv); Wo panels [ceil(D / 32), HK, 32]; ln2;
// Wq2, Wo2 panels; ln3; Wi, Wi1 panels [ceil(F / 32), D, 32] (Wi1 read only when gated); Wf
// panels [ceil(D / 32), F, 32]; the self-attention cache K, V [M, H, T, d_kv]; index int32 []
// (clamped to [0, T), as XLA's dynamic_update_slice does); self_bias [M, H, T]; the encoder's
// keys [R, H, d_kv, L] and values [R, H, L, d_kv], rows m attending to row m / (M / R) (beam
// search's shared encoder side); cross_bias [M, L]. Results: x [M, D] and the cache K, V with
// the slot written (aliased to the operands by the caller). d_kv a multiple of 16 up to
// 128, L a multiple of 16.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attention_tiles_f32.h"
#include "xla/ffi/api/ffi.h"

// Built twice: with AVX-512F (DECODER_STEP_F32) and with AVX2 + FMA (DECODER_STEP_F32_AVX2, the
// handler then named t2t_f32_decoder_layer_step_avx2). Only the panels' tiles and `Lanes` below
// differ; the panels' layout, and so the operands, are the same.
#if defined(__AVX512F__)
#include "panels_f32_avx512.h"
using t2t::avx512::kPanel;
using t2t::avx512::PanelRows;
#define T2T_STEP_TARGET t2t_f32_decoder_layer_step
#else
#include "panels_f32_avx2.h"
using t2t::avx2::kPanel;
using t2t::avx2::PanelRows;
#define T2T_STEP_TARGET t2t_f32_decoder_layer_step_avx2
#endif

namespace ffi = xla::ffi;

namespace {

// The widest float vector of the build: 16 lanes (AVX-512F) or 8 (AVX2).
struct Lanes {
#if defined(__AVX512F__)
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec Splat(float x) { return _mm512_set1_ps(x); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static float Sum(Vec v) { return _mm512_reduce_add_ps(v); }
#else
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec Splat(float x) { return _mm256_set1_ps(x); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static float Sum(Vec v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
  }
#endif
};
using Vec = Lanes::Vec;
constexpr int kLanes = Lanes::kWidth;

}  // namespace

namespace {

// --- Pieces of the step ----------------------------------------------------------------------
// h [M, D] = x / sqrt(mean(x^2) + eps) * scale, in float32 as layers.RMSNorm computes it.
void RmsNorm(const float* x, const float* scale, float* h, int M, int D, float eps) {
  for (int m = 0; m < M; ++m) {
    const float* row = x + size_t(m) * D;
    double sum = 0.0;
    for (int i = 0; i < D; ++i) sum += double(row[i]) * row[i];
    const float inv = 1.0f / std::sqrt(float(sum / D) + eps);
    float* out = h + size_t(m) * D;
    for (int i = 0; i < D; ++i) out[i] = row[i] * inv * scale[i];
  }
}

// 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3))), jax.nn.gelu(approximate=True), 8 lanes.
inline __m256 GeluTanh(__m256 y) {
  const __m256 u = _mm256_mul_ps(
      _mm256_set1_ps(0.7978845608028654f),
      _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), y), _mm256_mul_ps(y, y), y));
  // tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2 |u|) <= 1.
  const __m256 sign = _mm256_and_ps(u, _mm256_set1_ps(-0.0f));
  const __m256 e = t2t::f32::ExpNonPositive(
      _mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e),
                                 _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), y),
                       _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_or_ps(t, sign)));
}

// softmax(logits + bias) in place over n entries; pads to a multiple of 8 in `scratch`.
void SoftmaxAnyLength(float* logits, const float* bias, int n, std::vector<float>& scratch) {
  const int padded = (n + 7) / 8 * 8;
  if (padded == n) {
    t2t::f32::Softmax(logits, bias, n);
    return;
  }
  scratch.assign(size_t(2) * padded, 0.0f);
  float* l = scratch.data();
  float* b = l + padded;
  std::copy(logits, logits + n, l);
  std::copy(bias, bias + n, b);
  std::fill(b + n, b + padded, -1e30f);
  t2t::f32::Softmax(l, b, padded);
  std::copy(l, l + n, logits);
}

struct Shape {
  int M, D, H, T, DK, HK, F, R, L, beams;
};

// Everything one call's threads share: operands, results, scratch, and a work counter a stage.
struct Step {
  Shape s;
  float eps;
  bool gated;
  int index;
  const float *x, *ln1, *wq, *wk, *wv, *wo, *ln2, *wq2, *wo2, *ln3, *wi, *wi1, *wf;
  const float *self_bias, *cross_k, *cross_v, *cross_bias;
  float *x_out, *k_cache, *v_cache;
  float *q, *k_new, *v_new, *ctx, *o, *f;   // scratch [M, HK] x 4, [M, D], [M, F]
  static constexpr int kStages = 8;
  int total[kStages];                      // work items of each stage
  std::atomic<int> next[kStages];          // the next item to take
  std::atomic<int> done[kStages];          // items finished
};

// Waits until every item of the stage before `stage` has finished (each stage reads what the
// one before wrote).
void Enter(Step& st, int stage) {
  if (stage == 0) return;
  while (st.done[stage - 1].load(std::memory_order_acquire) < st.total[stage - 1]) _mm_pause();
}

// The items of `stage` this thread takes, each by whichever thread takes it first; `first()`
// runs once before this thread's first item (its own norm of the stage's input), and only if it
// takes one: a thread that takes none touches no operand, so one starting after the call has
// returned reads nothing XLA may have freed.
template <typename First, typename Body>
void Share(Step& st, int stage, First first, Body body) {
  Enter(st, stage);
  int i = st.next[stage].fetch_add(1, std::memory_order_relaxed);
  if (i < st.total[stage]) first();
  for (; i < st.total[stage]; i = st.next[stage].fetch_add(1, std::memory_order_relaxed)) {
    body(i);
    st.done[stage].fetch_add(1, std::memory_order_release);
  }
}

template <typename Body>
void Share(Step& st, int stage, Body body) {
  Share(st, stage, [] {}, body);
}

// Panel p of a product A [M, K] x W (panels [P, K, 32]) into C [M, N].
inline void Panel(const float* A, const float* W, float* C, int M, int K, int N, int p) {
  PanelRows(A, W + size_t(p) * K * kPanel, C, M, K, N, p * kPanel);
}

// x_out += A [M, K] x W (panels, N = D), panel by panel: each item a panel's product into the
// scratch o and its columns added to x_out (a stage of residual; no two items share a column).
void Residual(Step& st, int stage, const float* A, const float* W, int K) {
  const Shape& s = st.s;
  Share(st, stage, [&](int p) {
    Panel(A, W, st.o, s.M, K, s.D, p);
    const int c0 = p * kPanel, c1 = std::min(s.D, c0 + kPanel);
    for (int m = 0; m < s.M; ++m) {
      for (int c = c0; c < c1; ++c) st.x_out[size_t(m) * s.D + c] += st.o[size_t(m) * s.D + c];
    }
  });
}

// A bias at or below this masks its position: its softmax weight is exactly 0 (e^x flushes to 0
// below x = -87, and layers.NEG_INF is -1e10), so positions past the last unmasked one can be
// left out without changing a bit of the result.
constexpr float kMasked = -1e9f;

// 1 + the last position < n whose bias is above kMasked in any of `rows` bias rows (stride n),
// rounded up to a multiple of `multiple` (at most n); n when every position is masked.
int UnmaskedLength(const float* bias, int rows, int n, int multiple) {
  int last = -1;
  for (int i = 0; i < rows; ++i) {
    const float* row = bias + size_t(i) * n;
    for (int t = n - 1; t > last; --t) {
      if (row[t] > kMasked) {
        last = t;
        break;
      }
    }
  }
  if (last < 0) return n;
  return std::min(n, (last + multiple) / multiple * multiple);
}

// The self-attention of row b, head h: write its key and value at the slot, attend over the
// cache up to its last unmasked slot (the slots after it have weight 0).
void SelfAttention(Step& st, int b, int h, std::vector<float>& logits,
                   std::vector<float>& scratch) {
  const Shape& s = st.s;
  const size_t head = (size_t(b) * s.H + h) * s.T * s.DK;
  float* keys = st.k_cache + head;
  float* values = st.v_cache + head;
  const size_t at = size_t(b) * s.HK + size_t(h) * s.DK;
  std::copy(st.k_new + at, st.k_new + at + s.DK, keys + size_t(st.index) * s.DK);
  std::copy(st.v_new + at, st.v_new + at + s.DK, values + size_t(st.index) * s.DK);
  const float* q = st.q + at;
  const float* bias = st.self_bias + (size_t(b) * s.H + h) * s.T;
  const int T = UnmaskedLength(bias, 1, s.T, 1);
  logits.resize(T);
  for (int t = 0; t < T; ++t) {
    Vec acc = Lanes::Zero();
    const float* k = keys + size_t(t) * s.DK;
    for (int d = 0; d < s.DK; d += kLanes) acc = Lanes::Fma(Lanes::Load(q + d), Lanes::Load(k + d), acc);
    logits[t] = Lanes::Sum(acc);
  }
  SoftmaxAnyLength(logits.data(), bias, T, scratch);
  float* out = st.ctx + at;
  for (int d = 0; d < s.DK; d += kLanes) {
    Vec acc = Lanes::Zero();
    for (int t = 0; t < T; ++t) {
      acc = Lanes::Fma(Lanes::Splat(logits[t]), Lanes::Load(values + size_t(t) * s.DK + d), acc);
    }
    Lanes::Store(out + d, acc);
  }
}

constexpr int kAheadFloats = 8192;   // software prefetch distance in the encoder's keys and values

// logits [rows, n] = q [rows, DK] (row stride ldq) x keys [DK, ldk] (the first n columns): the
// keys read once, row after row, each query row's logits accumulated in L1. A layout-order pass
// streams ~15% faster here than register tiles over 128-column strips (benchmarks/EXPERIMENTS.md,
// "A decoder layer's step in one call").
void KeysInOrder(const float* q, size_t ldq, const float* keys, size_t ldk, float* logits,
                 int rows, int DK, int n) {
  std::fill(logits, logits + size_t(rows) * n, 0.0f);
  for (int d = 0; d < DK; ++d) {
    const float* krow = keys + size_t(d) * ldk;
    for (int l = 0; l < n; l += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(krow + l + kAheadFloats), _MM_HINT_T0);
    }
    for (int i = 0; i < rows; ++i) {
      const Vec qd = Lanes::Splat(q[size_t(i) * ldq + d]);
      float* out = logits + size_t(i) * n;
      for (int l = 0; l < n; l += kLanes) {
        Lanes::Store(out + l, Lanes::Fma(qd, Lanes::Load(krow + l), Lanes::Load(out + l)));
      }
    }
  }
}

// out [rows, DK] (row stride ldo) = p [rows, n] x values [n, DK] (DK a multiple of 16, at most
// 128): the values read once, in order, the sums in registers.
void ValuesInOrder(const float* p, const float* values, float* out, size_t ldo, int rows, int n,
                   int DK) {
  const int vecs = DK / kLanes;
  for (int i = 0; i < rows; ++i) {
    Vec acc[128 / kLanes];
    for (int j = 0; j < vecs; ++j) acc[j] = Lanes::Zero();
    const float* pi = p + size_t(i) * n;
    for (int l = 0; l < n; ++l) {
      const float* vrow = values + size_t(l) * DK;
      if (i == 0) _mm_prefetch(reinterpret_cast<const char*>(vrow + kAheadFloats), _MM_HINT_T0);
      const Vec pl = Lanes::Splat(pi[l]);
      for (int j = 0; j < vecs; ++j) acc[j] = Lanes::Fma(pl, Lanes::Load(vrow + kLanes * j), acc[j]);
    }
    for (int j = 0; j < vecs; ++j) Lanes::Store(out + size_t(i) * ldo + kLanes * j, acc[j]);
  }
}

// The encoder-decoder attention of cache row r, head h, for its `beams` query rows, over the
// encoder positions up to the last one these rows do not mask (padding at the end is skipped).
void CrossAttention(Step& st, int r, int h, std::vector<float>& logits) {
  const Shape& s = st.s;
  const int rows = s.beams, m0 = r * s.beams;
  const size_t pair = size_t(r) * s.H + h;
  const float* bias = st.cross_bias + size_t(m0) * s.L;
  const int n = UnmaskedLength(bias, rows, s.L, 16);
  logits.resize(size_t(rows) * n);
  KeysInOrder(st.q + size_t(m0) * s.HK + size_t(h) * s.DK, s.HK, st.cross_k + pair * s.DK * s.L,
              s.L, logits.data(), rows, s.DK, n);
  for (int i = 0; i < rows; ++i) {
    t2t::f32::Softmax(logits.data() + size_t(i) * n, bias + size_t(i) * s.L, n);
  }
  ValuesInOrder(logits.data(), st.cross_v + pair * s.L * s.DK,
                st.ctx + size_t(m0) * s.HK + size_t(h) * s.DK, s.HK, rows, n, s.DK);
}

// The number of work items of each stage.
void CountItems(Step& st) {
  const Shape& s = st.s;
  const int P_hk = (s.HK + kPanel - 1) / kPanel, P_d = (s.D + kPanel - 1) / kPanel;
  const int P_f = (s.F + kPanel - 1) / kPanel;
  const int items[Step::kStages] = {3 * P_hk + 1, s.M * s.H, P_d, P_hk, s.R * s.H, P_d, P_f, P_d};
  for (int i = 0; i < Step::kStages; ++i) {
    st.total[i] = items[i];
    st.next[i].store(0, std::memory_order_relaxed);
    st.done[i].store(0, std::memory_order_relaxed);
  }
}

// The layer's stages on whichever thread runs this: the caller from the start, a pool thread
// from wherever the work is when it starts (or nowhere, if it starts after the last item).
void Work(Step& st) {
  const Shape& s = st.s;
  const int P_hk = (s.HK + kPanel - 1) / kPanel;
  thread_local std::vector<float> h, logits, scratch, linear;
  h.resize(size_t(s.M) * s.D);
  // 1. h = rms(x) ln1; q, k, v; and (the last item) the result x starts as x.
  Share(st, 0, [&] { RmsNorm(st.x, st.ln1, h.data(), s.M, s.D, st.eps); }, [&](int i) {
    if (i == 3 * P_hk) {
      std::copy(st.x, st.x + size_t(s.M) * s.D, st.x_out);
      return;
    }
    const float* w = i < P_hk ? st.wq : i < 2 * P_hk ? st.wk : st.wv;
    float* c = i < P_hk ? st.q : i < 2 * P_hk ? st.k_new : st.v_new;
    Panel(h.data(), w, c, s.M, s.D, s.HK, i % P_hk);
  });
  // 2. Self-attention over the cache, the new slot written first.
  Share(st, 1, [&](int i) { SelfAttention(st, i / s.H, i % s.H, logits, scratch); });
  // 3. x += ctx Wo.
  Residual(st, 2, st.ctx, st.wo, s.HK);
  // 4. h = rms(x) ln2; q = h Wq2.
  Share(st, 3, [&] { RmsNorm(st.x_out, st.ln2, h.data(), s.M, s.D, st.eps); },
        [&](int p) { Panel(h.data(), st.wq2, st.q, s.M, s.D, s.HK, p); });
  // 5. Encoder-decoder attention.
  Share(st, 4, [&](int i) { CrossAttention(st, i / s.H, i % s.H, logits); });
  // 6. x += ctx Wo2.
  Residual(st, 5, st.ctx, st.wo2, s.HK);
  // 7. h = rms(x) ln3; f = act(h Wi [, h Wi1]).
  auto norm3 = [&] {
    RmsNorm(st.x_out, st.ln3, h.data(), s.M, s.D, st.eps);
    if (st.gated) linear.resize(size_t(s.M) * s.F);
  };
  Share(st, 6, norm3, [&](int p) {
    Panel(h.data(), st.wi, st.f, s.M, s.D, s.F, p);
    const int c0 = p * kPanel, c1 = std::min(s.F, c0 + kPanel);
    if (!st.gated) {
      for (int m = 0; m < s.M; ++m) {
        float* row = st.f + size_t(m) * s.F;
        for (int c = c0; c < c1; ++c) row[c] = std::max(row[c], 0.0f);
      }
      return;
    }
    Panel(h.data(), st.wi1, linear.data(), s.M, s.D, s.F, p);
    for (int m = 0; m < s.M; ++m) {
      float* row = st.f + size_t(m) * s.F;
      const float* lin = linear.data() + size_t(m) * s.F;
      int c = c0;
      for (; c + 8 <= c1; c += 8) {
        _mm256_storeu_ps(row + c, _mm256_mul_ps(GeluTanh(_mm256_loadu_ps(row + c)),
                                                _mm256_loadu_ps(lin + c)));
      }
      for (; c < c1; ++c) {
        float y[8] = {row[c]};
        _mm256_storeu_ps(y, GeluTanh(_mm256_loadu_ps(y)));
        row[c] = y[0] * lin[c];
      }
    }
  });
  // 8. x += f Wf.
  Residual(st, 7, st.f, st.wf, s.F);
}

const float* F32(const ffi::AnyBuffer& b) { return static_cast<const float*>(b.untyped_data()); }

bool Panels(const ffi::AnyBuffer& b, int n, int k) {
  const auto d = b.dimensions();
  return b.element_type() == ffi::DataType::F32 && d.size() == 3 &&
         d[0] == (n + kPanel - 1) / kPanel && d[1] == k && d[2] == kPanel;
}

bool Vector(const ffi::AnyBuffer& b, int n) {
  return b.element_type() == ffi::DataType::F32 && b.dimensions().size() == 1 &&
         b.dimensions()[0] == n;
}

ffi::Error LayerStep(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer ln1,
                     ffi::AnyBuffer wq, ffi::AnyBuffer wk, ffi::AnyBuffer wv, ffi::AnyBuffer wo,
                     ffi::AnyBuffer ln2, ffi::AnyBuffer wq2, ffi::AnyBuffer wo2,
                     ffi::AnyBuffer ln3, ffi::AnyBuffer wi, ffi::AnyBuffer wi1, ffi::AnyBuffer wf,
                     ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache, ffi::AnyBuffer index,
                     ffi::AnyBuffer self_bias, ffi::AnyBuffer cross_k, ffi::AnyBuffer cross_v,
                     ffi::AnyBuffer cross_bias, ffi::Result<ffi::AnyBuffer> x_out,
                     ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out,
                     float eps, int64_t gated) {
  const std::string name = "t2t_f32_decoder_layer_step: ";
  const auto xd = x.dimensions(), kd = k_cache.dimensions(), cd = cross_k.dimensions();
  const auto wfd = wf.dimensions();
  if (x.element_type() != ffi::DataType::F32 || xd.size() != 2 || kd.size() != 4 ||
      cd.size() != 4 || wfd.size() != 3 || k_cache.element_type() != ffi::DataType::F32 ||
      cross_k.element_type() != ffi::DataType::F32 ||
      index.element_type() != ffi::DataType::S32 || index.dimensions().size() != 0) {
    return ffi::Error::InvalidArgument(
        name + "expects float32 x [M, D], caches [M, H, T, d_kv], encoder keys [R, H, d_kv, L], "
               "panels [P, K, 32] and an int32 scalar index");
  }
  Shape s;
  s.M = int(xd[0]);
  s.D = int(xd[1]);
  s.H = int(kd[1]);
  s.T = int(kd[2]);
  s.DK = int(kd[3]);
  s.HK = s.H * s.DK;
  s.F = int(wfd[1]);
  s.R = int(cd[0]);
  s.L = int(cd[3]);
  s.beams = s.R > 0 ? s.M / s.R : 0;
  auto dims_are = [](const ffi::AnyBuffer& b, std::initializer_list<int64_t> want) {
    const auto d = b.dimensions();
    return b.element_type() == ffi::DataType::F32 && d.size() == want.size() &&
           std::equal(d.begin(), d.end(), want.begin());
  };
  const bool ok =
      s.M > 0 && s.R > 0 && s.M % s.R == 0 && s.DK % 16 == 0 && s.DK <= 128 &&
      s.L % 16 == 0 && kd[0] == s.M &&
      Vector(ln1, s.D) && Vector(ln2, s.D) && Vector(ln3, s.D) && Panels(wq, s.HK, s.D) &&
      Panels(wk, s.HK, s.D) && Panels(wv, s.HK, s.D) && Panels(wo, s.D, s.HK) &&
      Panels(wq2, s.HK, s.D) && Panels(wo2, s.D, s.HK) && Panels(wi, s.F, s.D) &&
      Panels(wi1, s.F, s.D) && Panels(wf, s.D, s.F) &&
      dims_are(v_cache, {s.M, s.H, s.T, s.DK}) && dims_are(self_bias, {s.M, s.H, s.T}) &&
      dims_are(cross_k, {s.R, s.H, s.DK, s.L}) && dims_are(cross_v, {s.R, s.H, s.L, s.DK}) &&
      dims_are(cross_bias, {s.M, s.L}) && dims_are(*x_out, {s.M, s.D}) &&
      dims_are(*k_out, {s.M, s.H, s.T, s.DK}) && dims_are(*v_out, {s.M, s.H, s.T, s.DK});
  if (!ok) {
    return ffi::Error::InvalidArgument(
        name + "operand shapes disagree (see decoder_step_f32.cc's header), or d_kv is not a "
               "multiple of 16 up to 128, or the encoder length not a multiple of 16, or the rows "
               "are not a multiple of the encoder's");
  }
  const size_t cache = size_t(s.M) * s.H * s.T * s.DK;
  auto* K = static_cast<float*>(k_out->untyped_data());
  auto* V = static_cast<float*>(v_out->untyped_data());
  if (K != F32(k_cache)) std::memcpy(K, F32(k_cache), cache * sizeof(float));
  if (V != F32(v_cache)) std::memcpy(V, F32(v_cache), cache * sizeof(float));

  thread_local std::vector<float> scratch;
  scratch.resize(size_t(s.M) * (4 * s.HK + s.D + s.F));
  // Shared with pool threads that may start after this call has returned: they then find no
  // item left and touch nothing but the counters, which the shared pointer keeps alive.
  auto st = std::make_shared<Step>();
  st->s = s;
  st->eps = eps;
  st->gated = gated != 0;
  st->index = std::clamp(*static_cast<const int32_t*>(index.untyped_data()), 0, s.T - 1);
  st->x = F32(x); st->ln1 = F32(ln1); st->wq = F32(wq); st->wk = F32(wk); st->wv = F32(wv);
  st->wo = F32(wo); st->ln2 = F32(ln2); st->wq2 = F32(wq2); st->wo2 = F32(wo2);
  st->ln3 = F32(ln3); st->wi = F32(wi); st->wi1 = F32(wi1); st->wf = F32(wf);
  st->self_bias = F32(self_bias); st->cross_k = F32(cross_k); st->cross_v = F32(cross_v);
  st->cross_bias = F32(cross_bias);
  st->x_out = static_cast<float*>(x_out->untyped_data());
  st->k_cache = K;
  st->v_cache = V;
  float* p = scratch.data();
  st->q = p; p += size_t(s.M) * s.HK;
  st->k_new = p; p += size_t(s.M) * s.HK;
  st->v_new = p; p += size_t(s.M) * s.HK;
  st->ctx = p; p += size_t(s.M) * s.HK;
  st->o = p; p += size_t(s.M) * s.D;
  st->f = p;
  CountItems(*st);
  for (int64_t i = 1; i < pool.num_threads(); ++i) pool.Schedule([st]() { Work(*st); });
  Work(*st);
  const int last = Step::kStages - 1;
  while (st->done[last].load(std::memory_order_acquire) < st->total[last]) _mm_pause();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T2T_STEP_TARGET, LayerStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // ln1
                                  .Arg<ffi::AnyBuffer>()   // wq
                                  .Arg<ffi::AnyBuffer>()   // wk
                                  .Arg<ffi::AnyBuffer>()   // wv
                                  .Arg<ffi::AnyBuffer>()   // wo
                                  .Arg<ffi::AnyBuffer>()   // ln2
                                  .Arg<ffi::AnyBuffer>()   // wq2
                                  .Arg<ffi::AnyBuffer>()   // wo2
                                  .Arg<ffi::AnyBuffer>()   // ln3
                                  .Arg<ffi::AnyBuffer>()   // wi
                                  .Arg<ffi::AnyBuffer>()   // wi1
                                  .Arg<ffi::AnyBuffer>()   // wf
                                  .Arg<ffi::AnyBuffer>()   // k cache
                                  .Arg<ffi::AnyBuffer>()   // v cache
                                  .Arg<ffi::AnyBuffer>()   // index
                                  .Arg<ffi::AnyBuffer>()   // self bias
                                  .Arg<ffi::AnyBuffer>()   // encoder keys
                                  .Arg<ffi::AnyBuffer>()   // encoder values
                                  .Arg<ffi::AnyBuffer>()   // cross bias
                                  .Ret<ffi::AnyBuffer>()   // x
                                  .Ret<ffi::AnyBuffer>()   // k cache
                                  .Ret<ffi::AnyBuffer>()   // v cache
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("gated"));
