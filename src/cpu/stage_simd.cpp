// stage_simd.cpp: the vectorized row quantizer (simd.h), compiled once per instruction
// set by Highway's foreach_target and picked at run time (HWY_DYNAMIC_DISPATCH).
//
// Bit-exactness with src/core, instruction set by instruction set, rests on four choices:
//  - Every conversion is integer bit manipulation: bf16/fp16 widening, the e4m3 encoder
//    (core::fp8_e4m3_from_float_sw, lane by lane) and decoder, UE8M0. Hardware
//    conversions are avoided because some flush subnormals, quiet signalling NaNs or round
//    differently; the only int -> float conversions are of small integers (exact).
//  - The float arithmetic is what the scalar rule does, one rounding per operation: Mul
//    (never MulAdd; -ffp-contract=off keeps the compiler from fusing), Div (correctly
//    rounded on x86 and AArch64; armv7 NEON only approximates it, so that target is off).
//  - NaN-ignoring max/min are spelled out with IsNaN and Gt/Lt, as in core, not taken from
//    Max/Min instructions whose NaN and signed-zero rules differ between targets.
//  - |x| maxima are integer maxima of |x| bit patterns with NaN patterns zeroed: for
//    non-negative floats the integer order is the float order, subnormals included.
//
// A row is quantized in batches of L groups (L = float lanes): pass A loads each group,
// reduces its |x| to one lane of an amax vector and counts NaN/Inf; the group parameters
// (scale code, multiplier) are then computed for the L groups at once, in the lanes of one
// vector; pass B multiplies, encodes and stores each group with its broadcast multiplier.
// Pass B re-reads the input from L1 (bf16, fp32) or from a scratch copy of the widened
// bits (fp16, whose widening costs more than a load).

// clang-format off
#include "cpu/simd_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/stage_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

#include <algorithm>
#include <atomic>
#include <cstring>

#include "formats/recipe.h"
#include "formats/visit.h"
#include "core/layout.h"
#include "cpu/simd.h"
#include "cpu/simd_ops.h"  // (the primitives, once per instruction set)

HWY_BEFORE_NAMESPACE();
namespace megamoe {
namespace cpu {
namespace simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR  // one-lane vectors: the scalar path of src/core is as good

/// Pass B of one group: multiply, encode, store.
template <core::Format F, In kIn, bool kPairs, bool kScratch, bool kNormal>
HWY_INLINE void EncodeGroup(const uint8_t* row, size_t i0, size_t G, VF m, const uint32_t* HWY_RESTRICT scratch,
                            uint8_t* HWY_RESTRICT xq) {
  const DF df;
  const DU du;
  const size_t L = hn::Lanes(du);
  const size_t unit = kPairs ? 2 * L : L;
  constexpr size_t kPerByte = core::values_per_byte(F);
  for (size_t i = 0; i < G; i += unit) {
    VU v0, v1;
    if constexpr (kScratch) {
      v0 = hn::LoadU(du, scratch + i);
      v1 = kPairs ? hn::LoadU(du, scratch + i + L) : v0;
    } else {
      LoadUnit<kIn, kPairs>(row, i0 + i, v0, v1);
    }
    const VU c0 = EncodeElem<F, kNormal>(hn::BitCast(df, v0), m);
    if constexpr (kPairs) {
      StorePair<F>(c0, EncodeElem<F, kNormal>(hn::BitCast(df, v1), m), xq + (i0 + i) / kPerByte);
    } else {
      StoreCodes<F>(c0, xq + (i0 + i) / kPerByte);
    }
  }
}

HWY_INLINE void StoreWord(void* base, int64_t elem, uint32_t v) {
  std::memcpy(static_cast<uint8_t*>(base) + elem * 4, &v, 4);
}

template <core::Format F, In kIn, bool kPairs>
int64_t QuantizeRowsFor(const Rows& r, int64_t t0, int64_t t1) {
  constexpr bool kPacked = core::packed_scales(F);
  constexpr bool kScratch = kIn == In::kFp16;
  constexpr size_t kEsize = kElemBytes<kIn>;
  const DF df;
  const DI di;
  const size_t L = hn::Lanes(df);
  const size_t unit = kPairs ? 2 * L : L;
  const size_t G = static_cast<size_t>(r.G);
  const size_t H = static_cast<size_t>(r.H);
  const size_t groups = H / G;
  HWY_ALIGN int32_t amax[kMaxLanes];
  GroupScan scan[kMaxLanes];
  HWY_ALIGN uint32_t sf[kMaxLanes];
  HWY_ALIGN float mult[kMaxLanes];
  // Widened fp16 bits of one batch (L groups of G <= 128).
  HWY_ALIGN uint32_t scratch[kScratch ? kMaxLanes * 128 : 1];
  int64_t nonfinite = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* row = static_cast<const uint8_t*>(r.x) + t * r.x_row * static_cast<int64_t>(kEsize);
    uint8_t* xq = r.xq + t * r.xq_row;
    float s2 = r.gs;
    if constexpr (F == core::Format::kNvfp4PerToken) {
      VI acc = hn::Zero(di);
      for (size_t i = 0; i < H; i += unit) {
        VU v0, v1;
        LoadUnit<kIn, kPairs>(row, i, v0, v1);
        acc = hn::Max(acc, hn::Max(AbsOrZero(v0), AbsOrZero(v1)));
      }
      const int32_t row_amax = hn::GetLane(hn::MaxOfLanes(di, acc));
      s2 = core::per_token_scale(core::bits_float(static_cast<uint32_t>(row_amax)), r.floor);
      std::memcpy(static_cast<float*>(r.x_scales) + t * r.xs_s0, &s2, sizeof s2);
    }
    VI cnt = hn::Zero(di);
    for (size_t g0 = 0; g0 < groups; g0 += L) {
      const size_t nb = std::min(L, groups - g0);
      for (size_t j = 0; j < nb; ++j) {
        scan[j] = ScanGroup<kIn, kPairs, kScratch, core::elem_of(F) == core::Elem::kE4M3>(
            row, (g0 + j) * G, G, r.count_nonfinite, cnt, kScratch ? scratch + j * G : nullptr);
        amax[j] = scan[j].amax;
      }
      for (size_t j = nb; j < L; ++j) amax[j] = 0;
      GroupParams<F>(hn::BitCast(df, hn::LoadU(di, amax)), r.floor, s2, sf, mult);
      for (size_t j = 0; j < nb; ++j) {
        const VF m = hn::Set(df, mult[j]);
        const size_t i0 = (g0 + j) * G;
        const uint32_t* sc = kScratch ? scratch + j * G : nullptr;  // (no offset past a 1-element array)
        if constexpr (core::elem_of(F) == core::Elem::kE4M3) {
          const float min_y = core::mul_rn(core::bits_float(static_cast<uint32_t>(scan[j].minabs)), mult[j]);
          if (!scan[j].nan && min_y >= kE4m3MinNormal) {
            EncodeGroup<F, kIn, kPairs, kScratch, true>(row, i0, G, m, sc, xq);
            continue;
          }
        }
        EncodeGroup<F, kIn, kPairs, kScratch, false>(row, i0, G, m, sc, xq);
      }
      if constexpr (kPacked) {
        // nb is a multiple of 4: L is, and so is the group count of a packed format.
        for (size_t j = 0; j < nb; j += 4) {
          const uint32_t word = sf[j] | sf[j + 1] << 8 | sf[j + 2] << 16 | sf[j + 3] << 24;
          const int64_t w = static_cast<int64_t>(core::ue8m0_word(static_cast<int64_t>(g0 + j)));
          StoreWord(r.sf, t * r.sf_s0 + w * r.sf_s1, word);
          if (r.shared_sf != nullptr) {
            StoreWord(r.shared_sf, core::shared_sf_row(t, r.shared_bm) * r.sh_s0 + w * r.sh_s1, word);
          }
        }
      } else {
        for (size_t j = 0; j < nb; ++j) {
          StoreWord(r.sf, t * r.sf_s0 + static_cast<int64_t>(g0 + j) * r.sf_s1, sf[j]);
        }
      }
      if (r.count_nonfinite) {
        nonfinite += hn::GetLane(hn::SumOfLanes(di, cnt));
        cnt = hn::Zero(di);
      }
    }
  }
  return nonfinite;
}

template <core::Format F>
int64_t QuantizeRowsIn(const Rows& r, int64_t t0, int64_t t1) {
  // Pair units need a group to hold whole pairs (G a multiple of 2L).
  const bool pairs = static_cast<size_t>(r.G) % (2 * hn::Lanes(DF())) == 0;
  switch (r.in) {
    case In::kBf16:
      return pairs ? QuantizeRowsFor<F, In::kBf16, true>(r, t0, t1) : QuantizeRowsFor<F, In::kBf16, false>(r, t0, t1);
    case In::kFp16:
      return pairs ? QuantizeRowsFor<F, In::kFp16, true>(r, t0, t1) : QuantizeRowsFor<F, In::kFp16, false>(r, t0, t1);
    default: return QuantizeRowsFor<F, In::kFp32, false>(r, t0, t1);
  }
}

/// The rows the vector quantizer encodes: e4m3 and e2m1 elements.
constexpr bool VectorCodec(core::Format f) {
  return core::elem_of(f) == core::Elem::kE4M3 || core::elem_of(f) == core::Elem::kE2M1;
}

bool QuantizeRows(const Rows& r, int64_t t0, int64_t t1, int64_t* nonfinite) {
  const size_t L = hn::Lanes(DF());
  if (r.G <= 0 || r.G > 128 || static_cast<size_t>(r.G) % L != 0) return false;
  // The vector codecs are e4m3 and e2m1; rows of another element codec (e5m2) take the
  // scalar loop of the shared recipe; the bf16 row (no groups) never comes here
  // (stage_cpu.cpp copies it).
  if (!VectorCodec(r.fmt)) return false;
  const int64_t n = core::visit_format(r.fmt, [&](auto f) -> int64_t {
    constexpr core::Format F = decltype(f)::value;
    if constexpr (!VectorCodec(F)) return 0;
    else return QuantizeRowsIn<F>(r, t0, t1);
  });
  if (r.count_nonfinite) *nonfinite += n;
  return true;
}

#else  // HWY_SCALAR (the fallback): decline, so that callers use the scalar rules of src/core

bool QuantizeRows(const Rows&, int64_t, int64_t, int64_t*) { return false; }

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace megamoe {
namespace cpu {
namespace simd {

HWY_EXPORT(QuantizeRows);

namespace {
std::atomic<bool> g_enabled{true};
}

bool quantize_rows(const Rows& r, int64_t t0, int64_t t1, int64_t* nonfinite) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  return HWY_DYNAMIC_DISPATCH(QuantizeRows)(r, t0, t1, nonfinite);
}
void set_enabled(bool on) noexcept { g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() noexcept { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
#endif  // HWY_ONCE
