// The Threefry-2x32 hash (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
// 20 rounds, the rotations and key schedule of JAX's `threefry2x32` primitive) as one XLA FFI
// handler, loaded by t2t/models/threefry.py for programs that draw many parameter initialisers.
//
// XLA:CPU compiles JAX's own lowering of the hash (a five-step loop of adds, rotations and xors)
// into a loop and several fusions per call; T5-small's initialisers make ~200 such calls and that
// compile took ~8 of the ~13 s `Trainer.init_state` spent compiling on a 2-core Zen 3
// (benchmarks/EXPERIMENTS.md, "Initialisers' Threefry in a kernel"). As a custom call the hash
// compiles to nothing; it is integer arithmetic, so the bits are the same as XLA's.
//
//   t2t_threefry2x32: k1, k2, x1, x2 (uint32; each with one element, broadcast, or with the
//     results' element count) -> y1, y2 (uint32, the results' shape).
#include <cstdint>

#include "small_dots_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline uint32_t RotateLeft(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

// One round: mix x1 into x0, rotate x1 by r and mix x0 back in (JAX's `apply_round`).
#define T2T_ROUND(r) \
  x0 += x1;          \
  x1 = RotateLeft(x1, r) ^ x0;

inline void Hash(uint32_t k0, uint32_t k1, uint32_t* px0, uint32_t* px1) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  uint32_t x0 = *px0 + k0, x1 = *px1 + k1;
  T2T_ROUND(13) T2T_ROUND(15) T2T_ROUND(26) T2T_ROUND(6)
  x0 += k1; x1 += k2 + 1u;
  T2T_ROUND(17) T2T_ROUND(29) T2T_ROUND(16) T2T_ROUND(24)
  x0 += k2; x1 += k0 + 2u;
  T2T_ROUND(13) T2T_ROUND(15) T2T_ROUND(26) T2T_ROUND(6)
  x0 += k0; x1 += k1 + 3u;
  T2T_ROUND(17) T2T_ROUND(29) T2T_ROUND(16) T2T_ROUND(24)
  x0 += k1; x1 += k2 + 4u;
  T2T_ROUND(13) T2T_ROUND(15) T2T_ROUND(26) T2T_ROUND(6)
  x0 += k2; x1 += k0 + 5u;
  *px0 = x0;
  *px1 = x1;
}
#undef T2T_ROUND

// Elements [begin, end): each operand indexed by i, or by 0 where it has one element. The flags
// are template arguments so that the common case (scalar keys, full counters) vectorises.
template <bool kK0, bool kK1, bool kX0, bool kX1>
void HashRange(const uint32_t* k0, const uint32_t* k1, const uint32_t* x0, const uint32_t* x1,
               uint32_t* y0, uint32_t* y1, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    uint32_t a = x0[kX0 ? i : 0], b = x1[kX1 ? i : 0];
    Hash(k0[kK0 ? i : 0], k1[kK1 ? i : 0], &a, &b);
    y0[i] = a;
    y1[i] = b;
  }
}

using RangeFn = void (*)(const uint32_t*, const uint32_t*, const uint32_t*, const uint32_t*,
                         uint32_t*, uint32_t*, int64_t, int64_t);

template <int kFlags>
constexpr RangeFn Pick() {
  return &HashRange<bool(kFlags & 8), bool(kFlags & 4), bool(kFlags & 2), bool(kFlags & 1)>;
}

constexpr RangeFn kRanges[16] = {Pick<0>(),  Pick<1>(),  Pick<2>(),  Pick<3>(),
                                 Pick<4>(),  Pick<5>(),  Pick<6>(),  Pick<7>(),
                                 Pick<8>(),  Pick<9>(),  Pick<10>(), Pick<11>(),
                                 Pick<12>(), Pick<13>(), Pick<14>(), Pick<15>()};

constexpr int64_t kChunk = 1 << 16;   // elements a work item

ffi::Error Threefry(ffi::ThreadPool pool, ffi::AnyBuffer k0, ffi::AnyBuffer k1, ffi::AnyBuffer x0,
                    ffi::AnyBuffer x1, ffi::Result<ffi::AnyBuffer> y0,
                    ffi::Result<ffi::AnyBuffer> y1) {
  const int64_t n = int64_t(y0->element_count());
  const ffi::AnyBuffer* in[4] = {&k0, &k1, &x0, &x1};
  int flags = 0;
  for (int j = 0; j < 4; ++j) {
    const int64_t size = int64_t(in[j]->element_count());
    if (in[j]->element_type() != ffi::DataType::U32 || (size != 1 && size != n)) {
      return ffi::Error::InvalidArgument(
          "t2t_threefry2x32: expects uint32 keys and counters with one element or as many as "
          "the results");
    }
    flags = flags * 2 + (size == n && n != 1 ? 1 : 0);
  }
  if (y1->element_count() != size_t(n) || y0->element_type() != ffi::DataType::U32 ||
      y1->element_type() != ffi::DataType::U32) {
    return ffi::Error::InvalidArgument("t2t_threefry2x32: expects two uint32 results alike");
  }
  const RangeFn range = kRanges[flags];
  const auto* pk0 = static_cast<const uint32_t*>(k0.untyped_data());
  const auto* pk1 = static_cast<const uint32_t*>(k1.untyped_data());
  const auto* px0 = static_cast<const uint32_t*>(x0.untyped_data());
  const auto* px1 = static_cast<const uint32_t*>(x1.untyped_data());
  auto* py0 = static_cast<uint32_t*>(y0->untyped_data());
  auto* py1 = static_cast<uint32_t*>(y1->untyped_data());
  const int chunks = int((n + kChunk - 1) / kChunk);
  t2t::ParallelFor(pool, chunks, [=](int c) {
    const int64_t begin = int64_t(c) * kChunk;
    range(pk0, pk1, px0, px1, py0, py1, begin, begin + kChunk < n ? begin + kChunk : n);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(t2t_threefry2x32, Threefry,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
