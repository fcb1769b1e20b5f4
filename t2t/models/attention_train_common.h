// What the two training attention kernels share (attention_train_f32.cc, float32 FMAs, and
// attention_train_bf16.cc, AVX512_BF16 dot products): the operands' shapes, checked with a
// message that names the kernel, and the dropout mask's flags as float multipliers.
#ifndef T2T_MODELS_ATTENTION_TRAIN_COMMON_H_
#define T2T_MODELS_ATTENTION_TRAIN_COMMON_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "attention_tiles_f32.h"
#include "xla/ffi/api/ffi.h"

namespace t2t {
namespace attention_train {

namespace ffi = xla::ffi;

struct Shape {
  int B = 0, Q = 0, H = 0, D = 0, L = 0;
  size_t row = 0;   // stride between positions of q, k, v and out: H * D
};

inline bool Is(const ffi::AnyBuffer& x, ffi::DataType type, std::initializer_list<int64_t> dims) {
  const auto d = x.dimensions();
  return x.element_type() == type && d.size() == dims.size() &&
         std::equal(d.begin(), d.end(), dims.begin());
}

// q [B, Q, H, D], k and v [B, L, H, D], float32, D and L multiples of `multiple`; the error
// names the kernel.
inline ffi::Error ReadShape(const char* name, int multiple, const ffi::AnyBuffer& q,
                            const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, Shape& s) {
  const auto qd = q.dimensions(), kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4) {
    return ffi::Error::InvalidArgument(std::string(name) + ": q, k, v must be [B, len, H, D]");
  }
  s.B = int(qd[0]); s.Q = int(qd[1]); s.H = int(qd[2]); s.D = int(qd[3]); s.L = int(kd[1]);
  s.row = size_t(s.H) * s.D;
  const auto f32 = ffi::DataType::F32;
  if (!Is(q, f32, {s.B, s.Q, s.H, s.D}) || !Is(k, f32, {s.B, s.L, s.H, s.D}) ||
      !Is(v, f32, {s.B, s.L, s.H, s.D}) || s.D % multiple != 0 || s.L % multiple != 0) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": expects float32 q [B, Q, H, D], k and v [B, L, H, D] with D and "
        "L multiples of " + std::to_string(multiple));
  }
  return ffi::Error::Success();
}

// The forward's other operands and results: bias [B or 1, H or 1, Q, L], keep [B, H, Q, L],
// out [B, Q, H, D] and P [B, H, Q, L].
inline ffi::Error CheckForward(const char* name, const Shape& s, const ffi::AnyBuffer& bias,
                               const ffi::AnyBuffer& keep, const ffi::AnyBuffer& out,
                               const ffi::AnyBuffer& probs) {
  const auto bd = bias.dimensions();
  if (bd.size() != 4 || bias.element_type() != ffi::DataType::F32 ||
      (bd[0] != s.B && bd[0] != 1) || (bd[1] != s.H && bd[1] != 1) || bd[2] != s.Q ||
      bd[3] != s.L || !Is(keep, ffi::DataType::PRED, {s.B, s.H, s.Q, s.L}) ||
      !Is(out, ffi::DataType::F32, {s.B, s.Q, s.H, s.D}) ||
      !Is(probs, ffi::DataType::F32, {s.B, s.H, s.Q, s.L})) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": expects float32 bias [B or 1, H or 1, Q, L], bool keep "
        "[B, H, Q, L], results float32 [B, Q, H, D] and [B, H, Q, L]");
  }
  return ffi::Error::Success();
}

// The backward's other operands and results: P and keep [B, H, Q, L], d_out [B, Q, H, D],
// d_q, d_k, d_v shaped as q, k, v and d_logits as P.
inline ffi::Error CheckBackward(const char* name, const Shape& s, const ffi::AnyBuffer& probs,
                                const ffi::AnyBuffer& keep, const ffi::AnyBuffer& d_out,
                                const ffi::AnyBuffer& d_q, const ffi::AnyBuffer& d_k,
                                const ffi::AnyBuffer& d_v, const ffi::AnyBuffer& d_logits) {
  const auto f32 = ffi::DataType::F32;
  if (!Is(probs, f32, {s.B, s.H, s.Q, s.L}) ||
      !Is(keep, ffi::DataType::PRED, {s.B, s.H, s.Q, s.L}) ||
      !Is(d_out, f32, {s.B, s.Q, s.H, s.D}) || !Is(d_q, f32, {s.B, s.Q, s.H, s.D}) ||
      !Is(d_k, f32, {s.B, s.L, s.H, s.D}) || !Is(d_v, f32, {s.B, s.L, s.H, s.D}) ||
      !Is(d_logits, f32, {s.B, s.H, s.Q, s.L})) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": expects float32 P [B, H, Q, L], bool keep [B, H, Q, L], "
        "d_out [B, Q, H, D] and results shaped as q, k, v and P");
  }
  return ffi::Error::Success();
}

// A forward call's buffers, checked: the shapes, typed pointers, and the bias's strides for a
// batch row and a head (0 where it broadcasts).
struct ForwardOperands {
  Shape s;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *bias = nullptr;
  const uint8_t* keep = nullptr;
  float *out = nullptr, *probs = nullptr;
  size_t bias_b = 0, bias_h = 0;
};

inline ffi::Error ReadForward(const char* name, int multiple, const ffi::AnyBuffer& q,
                              const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                              const ffi::AnyBuffer& bias, const ffi::AnyBuffer& keep,
                              ffi::AnyBuffer& out, ffi::AnyBuffer& probs, ForwardOperands& o) {
  if (auto error = ReadShape(name, multiple, q, k, v, o.s); error.failure()) return error;
  if (auto error = CheckForward(name, o.s, bias, keep, out, probs); error.failure()) return error;
  const auto bd = bias.dimensions();
  o.q = static_cast<const float*>(q.untyped_data());
  o.k = static_cast<const float*>(k.untyped_data());
  o.v = static_cast<const float*>(v.untyped_data());
  o.bias = static_cast<const float*>(bias.untyped_data());
  o.keep = static_cast<const uint8_t*>(keep.untyped_data());
  o.out = static_cast<float*>(out.untyped_data());
  o.probs = static_cast<float*>(probs.untyped_data());
  o.bias_b = bd[0] == 1 ? 0 : size_t(bd[1]) * o.s.Q * o.s.L;
  o.bias_h = bd[1] == 1 ? 0 : size_t(o.s.Q) * o.s.L;
  return ffi::Error::Success();
}

// A backward call's buffers, checked.
struct BackwardOperands {
  Shape s;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *probs = nullptr, *d_out = nullptr;
  const uint8_t* keep = nullptr;
  float *d_q = nullptr, *d_k = nullptr, *d_v = nullptr, *d_logits = nullptr;
};

inline ffi::Error ReadBackward(const char* name, int multiple, const ffi::AnyBuffer& q,
                               const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                               const ffi::AnyBuffer& probs, const ffi::AnyBuffer& keep,
                               const ffi::AnyBuffer& d_out, ffi::AnyBuffer& d_q,
                               ffi::AnyBuffer& d_k, ffi::AnyBuffer& d_v,
                               ffi::AnyBuffer& d_logits, BackwardOperands& o) {
  if (auto error = ReadShape(name, multiple, q, k, v, o.s); error.failure()) return error;
  if (auto error = CheckBackward(name, o.s, probs, keep, d_out, d_q, d_k, d_v, d_logits);
      error.failure()) {
    return error;
  }
  o.q = static_cast<const float*>(q.untyped_data());
  o.k = static_cast<const float*>(k.untyped_data());
  o.v = static_cast<const float*>(v.untyped_data());
  o.probs = static_cast<const float*>(probs.untyped_data());
  o.keep = static_cast<const uint8_t*>(keep.untyped_data());
  o.d_out = static_cast<const float*>(d_out.untyped_data());
  o.d_q = static_cast<float*>(d_q.untyped_data());
  o.d_k = static_cast<float*>(d_k.untyped_data());
  o.d_v = static_cast<float*>(d_v.untyped_data());
  o.d_logits = static_cast<float*>(d_logits.untyped_data());
  return ffi::Error::Success();
}

// 8 keep flags (bytes of 0 or 1) -> 8 floats, each `scale` or 0.
inline __m256 KeepScale(const uint8_t* keep, __m256 scale) {
  return t2t::vec::Avx2::KeepScale(keep, scale);
}

// The backward's elementwise step for one query row at AVX2 width, the scale as a vector
// (attention_tiles_f32.h's `tiles::SoftmaxDropoutBackwardRow` says what it computes).
inline void SoftmaxDropoutBackwardRow(const float* p, const uint8_t* keep, __m256 scale, int L,
                                      float* d, float* dropped, float* d_logits) {
  t2t::tiles::SoftmaxDropoutBackwardRow<t2t::vec::Avx2>(p, keep, scale, L, d, dropped, d_logits);
}

}  // namespace attention_train
}  // namespace t2t

#endif  // T2T_MODELS_ATTENTION_TRAIN_COMMON_H_
