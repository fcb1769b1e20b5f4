// What t2t's two FFI kernel libraries (small_dots.cc, small_dots_f32.cc) share: work split
// between the calling thread and XLA's intra-op threads, and the fused attention's shapes.
#ifndef T2T_MODELS_SMALL_DOTS_COMMON_H_
#define T2T_MODELS_SMALL_DOTS_COMMON_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace t2t {

// Whoever is free takes the next chunk; the caller waits only for chunks a helper has already
// taken, so a helper that never gets a thread (the pool busy elsewhere) costs nothing.
struct Chunks {
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  int total = 0;
  std::function<void(int)> body;
  void Work() {
    for (int i = next.fetch_add(1, std::memory_order_relaxed); i < total;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      body(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// body(0), ..., body(total - 1), on the calling thread and as many of the pool's as help.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int total, std::function<void(int)> body) {
  const int helpers = int(std::min<int64_t>(pool.num_threads(), total)) - 1;
  if (helpers <= 0) {
    for (int i = 0; i < total; ++i) body(i);
    return;
  }
  auto chunks = std::make_shared<Chunks>();
  chunks->total = total;
  chunks->body = std::move(body);
  for (int h = 0; h < helpers; ++h) pool.Schedule([chunks]() { chunks->Work(); });
  chunks->Work();
  while (chunks->done.load(std::memory_order_acquire) < total) _mm_pause();
}

// --- The fused attention's operands ---------------------------------------------------------
// q [B, H, Q, D], k [B, H, D, L], v [B, H, L, D] (all of `operands`' type), bias float32
// [B or 1, H or 1, Q, L], the result float32 [B, H, Q, D]; D and L multiples of 32.
struct AttentionShape {
  int B = 0, H = 0, Q = 0, D = 0, L = 0;
  size_t bias_b = 0, bias_h = 0;   // the bias's stride for a batch row and a head (0: broadcast)
};

inline xla::ffi::Error ReadAttentionShape(const std::string& name, xla::ffi::DataType operands,
                                          const xla::ffi::AnyBuffer& q,
                                          const xla::ffi::AnyBuffer& k,
                                          const xla::ffi::AnyBuffer& v,
                                          const xla::ffi::AnyBuffer& bias,
                                          const xla::ffi::AnyBuffer& out, AttentionShape* s) {
  using xla::ffi::DataType;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), bd = bias.dimensions();
  const auto od = out.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || bd.size() != 4 || od.size() != 4 ||
      q.element_type() != operands || k.element_type() != operands ||
      v.element_type() != operands || bias.element_type() != DataType::F32 ||
      out.element_type() != DataType::F32) {
    return xla::ffi::Error::InvalidArgument(
        name + ": expects q [B, H, Q, D], k [B, H, D, L], v [B, H, L, D] of its operand type, "
               "float32 bias [B or 1, H or 1, Q, L] and a float32 result [B, H, Q, D]");
  }
  const int B = int(qd[0]), H = int(qd[1]), Q = int(qd[2]), D = int(qd[3]), L = int(kd[3]);
  if (kd[0] != B || kd[1] != H || kd[2] != D || vd[0] != B || vd[1] != H || vd[2] != L ||
      vd[3] != D || (bd[0] != B && bd[0] != 1) || (bd[1] != H && bd[1] != 1) || bd[2] != Q ||
      bd[3] != L || od[0] != B || od[1] != H || od[2] != Q || od[3] != D || D % 32 != 0 ||
      L % 32 != 0) {
    return xla::ffi::Error::InvalidArgument(
        name + ": shapes disagree, or D or L is not a multiple of 32");
  }
  *s = AttentionShape{B, H, Q, D, L, bd[0] == 1 ? 0 : size_t(bd[1]) * Q * L,
                      bd[1] == 1 ? 0 : size_t(Q) * L};
  return xla::ffi::Error::Success();
}

// The fused attention's FFI body: checks the operands (element type T, `operands`), then for
// each (batch row, head, block of `block_rows` query rows) calls, on one of the threads,
// block(q rows [rows, D], k [D, L], v [L, D], bias rows [rows, L], out rows [rows, D], rows, D, L).
// A decoding step's items are small (one head's keys and values, 128 KB for T5-small in bf16),
// so the threads end within one of each other.
template <typename T, typename Block>
xla::ffi::Error FusedAttention(const std::string& name, xla::ffi::DataType operands,
                               xla::ffi::ThreadPool& pool, const xla::ffi::AnyBuffer& q,
                               const xla::ffi::AnyBuffer& k, const xla::ffi::AnyBuffer& v,
                               const xla::ffi::AnyBuffer& bias, xla::ffi::AnyBuffer& out,
                               int block_rows, Block block) {
  AttentionShape s;
  const xla::ffi::Error error = ReadAttentionShape(name, operands, q, k, v, bias, out, &s);
  if (error.failure()) return error;
  const auto* Qp = static_cast<const T*>(q.untyped_data());
  const auto* Kp = static_cast<const T*>(k.untyped_data());
  const auto* Vp = static_cast<const T*>(v.untyped_data());
  const auto* Bp = static_cast<const float*>(bias.untyped_data());
  auto* Op = static_cast<float*>(out.untyped_data());
  const int blocks = (s.Q + block_rows - 1) / block_rows;
  ParallelFor(pool, s.B * s.H * blocks, [=](int item) {
    const int pair = item / blocks, r0 = (item % blocks) * block_rows;
    const int b = pair / s.H, h = pair % s.H, rows = std::min(block_rows, s.Q - r0);
    const size_t first = size_t(pair) * s.Q + r0;
    block(Qp + first * s.D, Kp + size_t(pair) * s.D * s.L, Vp + size_t(pair) * s.L * s.D,
          Bp + b * s.bias_b + h * s.bias_h + size_t(r0) * s.L, Op + first * s.D, rows, s.D, s.L);
  });
  return xla::ffi::Error::Success();
}

}  // namespace t2t

#endif  // T2T_MODELS_SMALL_DOTS_COMMON_H_
