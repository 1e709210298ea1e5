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
#include "hwy/detect_compiler_arch.h"
// Sanitizer builds (CI: ASan+UBSan, TSan, the fuzzer) instrument every vector op of every
// copy, which takes clang minutes per copy: they compile the AVX-512, AVX2 and fallback
// copies only (SSE4 and SSSE3 are covered by the uninstrumented test build).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEGAMOE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define MEGAMOE_SANITIZED 1
#endif
#endif
#if HWY_ARCH_ARM_V7
#define HWY_DISABLED_TARGETS HWY_NEON  // armv7 NEON has no correctly rounded division
#elif defined(MEGAMOE_SANITIZED) && HWY_ARCH_X86
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
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

HWY_BEFORE_NAMESPACE();
namespace megamoe {
namespace cpu {
namespace simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR  // one-lane vectors: the scalar path of src/core is as good

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;
using VI = hn::Vec<DI>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// ---------------------------------------------------------------------------------------
// Exact widening to fp32 bit patterns.

/// bf16 is the upper half of an fp32.
HWY_INLINE VU WidenBf16(const uint8_t* p) {
  const DU du;
  const hn::Rebind<uint16_t, DU> d16;
  return hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p))));
}

/// IEEE binary16 bits (in the low half of each lane) -> fp32 bits, as core::half_to_float
/// (NaN payloads kept, signalling NaNs not quieted).
HWY_INLINE VU HalfBits(VU h) {
  const DF df;
  const DU du;
  const DI di;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const VU mag = hn::And(h, hn::Set(du, 0x7FFFu));
  const VU e = hn::ShiftRight<10>(mag);
  // Exponent field 1..30: rebias 15 -> 127; 31 (Inf/NaN): field 255, mantissa kept.
  const VU rebias = hn::IfThenElse(hn::Eq(e, hn::Set(du, 31u)), hn::Set(du, 224u << 23), hn::Set(du, 112u << 23));
  const VU normal = hn::Add(hn::ShiftLeft<13>(mag), rebias);
  // Field 0: the value is mag * 2^-24. mag < 2^10 converts to float exactly, and taking 24
  // from its exponent field scales it exactly (the result is a normal fp32 >= 2^-24).
  const VU tiny = hn::Sub(hn::BitCast(du, hn::ConvertTo(df, hn::BitCast(di, mag))), hn::Set(du, 24u << 23));
  const VU small = hn::IfThenZeroElse(hn::Eq(mag, hn::Zero(du)), tiny);
  return hn::Or(hn::IfThenElse(hn::Eq(e, hn::Zero(du)), small, normal), sign);
}

HWY_INLINE VU WidenFp16(const uint8_t* p) {
  const hn::Rebind<uint16_t, DU> d16;
  return HalfBits(hn::PromoteTo(DU(), hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p))));
}

HWY_INLINE VU LoadFp32(const uint8_t* p) {
  const DU du;
  return hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
}

template <In kIn>
HWY_INLINE VU LoadBits(const uint8_t* row, size_t i) {
  if constexpr (kIn == In::kBf16) return WidenBf16(row + 2 * i);
  else if constexpr (kIn == In::kFp16) return WidenFp16(row + 2 * i);
  else return LoadFp32(row + 4 * i);
}
template <In kIn>
constexpr size_t kElemBytes = kIn == In::kFp32 ? 4 : 2;

/// The unit a group is processed in. Pairs (2-byte inputs): 2L consecutive elements read as
/// L u32 lanes and split into the even elements (v0) and the odd ones (v1), so widening
/// needs no lane shuffles and the two code vectors interleave back by a shift and an or.
/// Otherwise L consecutive elements in v0.
template <In kIn, bool kPairs>
HWY_INLINE void LoadUnit(const uint8_t* row, size_t i, VU& v0, VU& v1) {
  if constexpr (kPairs) {
    const DU du;
    const VU w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(row + 2 * i));
    if constexpr (kIn == In::kBf16) {
      v0 = hn::ShiftLeft<16>(w);
      v1 = hn::And(w, hn::Set(du, 0xFFFF0000u));
    } else {
      v0 = HalfBits(hn::And(w, hn::Set(du, 0xFFFFu)));
      v1 = HalfBits(hn::ShiftRight<16>(w));
    }
  } else {
    v0 = LoadBits<kIn>(row, i);
    v1 = v0;
  }
}

// ---------------------------------------------------------------------------------------
// Scalar rules of src/core, lane by lane.

/// |x| bits with NaN patterns replaced by 0: the NaN-ignoring maximum becomes an integer max.
HWY_INLINE VI AbsOrZero(VU bits) {
  const DI di;
  const VI a = hn::BitCast(di, hn::And(bits, hn::Set(DU(), 0x7FFFFFFFu)));
  return hn::IfThenZeroElse(hn::Gt(a, hn::Set(di, 0x7F800000)), a);
}

/// core::fmax_nan_ignoring.
HWY_INLINE VF FmaxNanIgnoring(VF a, VF b) {
  return hn::IfThenElse(hn::IsNaN(a), b, hn::IfThenElse(hn::IsNaN(b), a, hn::IfThenElse(hn::Gt(a, b), a, b)));
}
/// core::fminf_nan_ignoring.
HWY_INLINE VF FminNanIgnoring(VF a, VF b) {
  return hn::IfThenElse(hn::IsNaN(a), b, hn::IfThenElse(hn::IsNaN(b), a, hn::IfThenElse(hn::Lt(a, b), a, b)));
}

/// core::ue8m0_exponent: ceil(log2 s) biased, clamped to [1, 254].
HWY_INLINE VU Ue8m0Exponent(VF s) {
  const DU du;
  const DI di;
  const VU b = hn::BitCast(du, s);
  const VU up = hn::IfThenZeroElse(hn::Eq(hn::And(b, hn::Set(du, 0x7FFFFFu)), hn::Zero(du)), hn::Set(du, 1u));
  const VI e = hn::BitCast(di, hn::Add(hn::And(hn::ShiftRight<23>(b), hn::Set(du, 0xFFu)), up));
  return hn::BitCast(du, hn::Min(hn::Max(e, hn::Set(di, 1)), hn::Set(di, 254)));
}

/// core::ue8m0_inv_scale: 2^(127-e) exactly (the subnormal 2^-127 for e = 254).
HWY_INLINE VF Ue8m0InvScale(VU e) {
  const DF df;
  const DU du;
  const VU normal = hn::ShiftLeft<23>(hn::Sub(hn::Set(du, 254u), e));
  return hn::BitCast(df, hn::IfThenElse(hn::Eq(e, hn::Set(du, 254u)), hn::Set(du, 0x00400000u), normal));
}

/// core::fp8_e4m3_from_float_sw lane by lane. With e = min(fp32 exponent field, 121), the
/// word X = |y| bits + 2^23 - e * 2^23 is, for e4m3 normals (field >= 121), the fp32 bits
/// rebased by 120 binades, whose top bits above bit 20 are the e4m3 code; below, the 24-bit
/// significand, of which 141 - field bits are dropped for an e4m3 subnormal (shift clamped
/// at 25, where everything, fp32 zeros and subnormals included, rounds to 0). Rounding
/// to nearest even adds half - 1 plus the kept lowest bit, so a carry moves the code up a
/// binade. Finite overflow and Inf saturate to 0x7E; NaN gives 0x7F (no sign).
HWY_INLINE VU E4m3Encode(VF y) {
  const DU du;
  const DI di;
  const VU b = hn::BitCast(du, y);
  const VI a = hn::BitCast(di, hn::And(b, hn::Set(du, 0x7FFFFFFFu)));
  const VI e = hn::Min(hn::ShiftRight<23>(a), hn::Set(di, 121));
  const VU x = hn::BitCast(du, hn::Sub(hn::Add(a, hn::Set(di, 0x800000)), hn::ShiftLeft<23>(e)));
  const VU shift = hn::BitCast(du, hn::Min(hn::Sub(hn::Set(di, 141), e), hn::Set(di, 25)));
  const VU half_minus_1 = hn::Set(du, 0xFFFFFFu) >> hn::Sub(hn::Set(du, 25u), shift);  // 2^(shift-1) - 1
  const VU odd = hn::And(x >> shift, hn::Set(du, 1u));
  const VU q = hn::Add(hn::Add(x, half_minus_1), odd) >> shift;
  const VI code = hn::Min(hn::BitCast(di, q), hn::Set(di, core::kFp8Max));
  const VU r = hn::Or(hn::BitCast(du, code), hn::And(hn::ShiftRight<24>(b), hn::Set(du, 0x80u)));
  return hn::IfThenElse(hn::RebindMask(du, hn::Gt(a, hn::Set(di, 0x7F800000))), hn::Set(du, core::kFp8NaN), r);
}

/// E4m3Encode for lanes with 2^-6 <= |y| (e4m3 normals, saturation, Inf) and no NaN, where
/// the shift is always 20 and X the fp32 bits rebased by 120 binades: half the work. A group
/// takes it when its smallest |y| = fl(min |x| * m) is in range and it holds no NaN.
HWY_INLINE VU E4m3EncodeNormal(VF y) {
  const DU du;
  const DI di;
  const VU b = hn::BitCast(du, y);
  const VU a = hn::And(b, hn::Set(du, 0x7FFFFFFFu));
  const VU odd = hn::And(hn::ShiftRight<20>(a), hn::Set(du, 1u));
  const VU q = hn::ShiftRight<20>(hn::Add(hn::Add(a, hn::Set(du, 0x7FFFFu - (120u << 23))), odd));
  const VI code = hn::Min(hn::BitCast(di, q), hn::Set(di, core::kFp8Max));
  return hn::Or(hn::BitCast(du, code), hn::And(hn::ShiftRight<24>(b), hn::Set(du, 0x80u)));
}
constexpr float kE4m3MinNormal = 0.015625f;  ///< 2^-6

/// core::e4m3_to_float.
HWY_INLINE VF E4m3Decode(VU c) {
  const DF df;
  const DU du;
  const DI di;
  const VU sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(du, 0x80u)));
  const VU e = hn::And(hn::ShiftRight<3>(c), hn::Set(du, 0xFu));
  const VU m = hn::And(c, hn::Set(du, 7u));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du, 120u))), hn::ShiftLeft<20>(m));
  const VU sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), hn::Set(df, core::kE4M3MinSubnormal)));
  const VU mag = hn::IfThenElse(hn::Eq(e, hn::Zero(du)), sub, normal);
  const VU nan = hn::Set(du, 0x7FC00000u);
  const VU r = hn::IfThenElse(hn::Eq(hn::And(c, hn::Set(du, 0x7Fu)), hn::Set(du, 0x7Fu)), nan, mag);
  return hn::BitCast(df, hn::Or(r, sign));
}

/// core::e2m1_ttz: the number of midpoints |v| strictly exceeds (float compares are false
/// for NaN, so NaN gives 0); the sign only with a nonzero code.
HWY_INLINE VU E2m1Ttz(VF v) {
  const DF df;
  const DU du;
  const VU bits = hn::BitCast(du, v);
  const VF a = hn::BitCast(df, hn::And(bits, hn::Set(du, 0x7FFFFFFFu)));
  const auto nonzero = hn::Gt(a, hn::Set(df, 0.25f));
  VU code = hn::BitCast(du, hn::VecFromMask(df, nonzero));  // all ones = -1: subtracted below
  code = hn::Sub(hn::Zero(du), code);
  for (const float m : {0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    code = hn::Sub(code, hn::BitCast(du, hn::VecFromMask(df, hn::Gt(a, hn::Set(df, m)))));
  }
  const VU sign = hn::And(hn::ShiftRight<28>(bits), hn::Set(du, 8u));
  return hn::Or(code, hn::And(sign, hn::BitCast(du, hn::VecFromMask(df, nonzero))));
}

/// core::e2m1_rne by integer compares of |v| bits (the float order for non-NaN): at the
/// midpoints .75, 1.75 and 3.5 the upper neighbour is even (>=, i.e. > the bits minus 1).
/// NaN bits exceed every midpoint, so NaN gives 7, and its sign is dropped.
HWY_INLINE VU E2m1Rne(VF v) {
  const DU du;
  const DI di;
  const VU bits = hn::BitCast(du, v);
  const VI a = hn::BitCast(di, hn::And(bits, hn::Set(du, 0x7FFFFFFFu)));
  VI code = hn::Zero(di);
  for (const float m : {0.25f, 1.25f, 2.5f, 5.0f}) {
    code = hn::Sub(code, hn::VecFromMask(di, hn::Gt(a, hn::Set(di, static_cast<int32_t>(core::float_bits(m))))));
  }
  for (const float m : {0.75f, 1.75f, 3.5f}) {
    code = hn::Sub(code, hn::VecFromMask(di, hn::Gt(a, hn::Set(di, static_cast<int32_t>(core::float_bits(m) - 1u)))));
  }
  const VU sign = hn::And(hn::ShiftRight<28>(bits), hn::Set(du, 8u));
  const VU kept = hn::IfThenZeroElse(hn::RebindMask(du, hn::Gt(a, hn::Set(di, 0x7F800000))), sign);
  return hn::Or(hn::BitCast(du, code), kept);
}

template <core::Format F, bool kNormal = false>
HWY_INLINE VU EncodeElem(VF x, VF m) {
  if constexpr (core::elem_of(F) == core::Elem::kE4M3) {
    if constexpr (kNormal) return E4m3EncodeNormal(hn::Mul(x, m));
    return E4m3Encode(hn::Mul(x, m));
  } else {
    const VF v = F == core::Format::kNvfp4Static ? hn::Div(x, m) : hn::Mul(x, m);
    if constexpr (core::ttz_of(F)) return E2m1Ttz(v);
    else return E2m1Rne(v);
  }
}

/// core::group_params<F> for the groups in the lanes of amax: scale codes to sf[], the
/// multipliers (divisors for kNvfp4Static) to m[]. s2: gs, or the row's per-token scale.
template <core::Format F>
HWY_INLINE void GroupParams(VF amax, float floor, float s2, uint32_t* HWY_RESTRICT sf, float* HWY_RESTRICT m) {
  const DF df;
  const DU du;
  if constexpr (F == core::Format::kFp8Ue8m0 || F == core::Format::kFp8Fp32) {
    const VF s = hn::Mul(FmaxNanIgnoring(amax, hn::Set(df, floor)), hn::Set(df, core::bits_float(core::kInv448Bits)));
    if constexpr (F == core::Format::kFp8Ue8m0) {
      const VU e = Ue8m0Exponent(s);
      hn::StoreU(e, du, sf);
      hn::StoreU(Ue8m0InvScale(e), df, m);
    } else {
      hn::StoreU(hn::BitCast(du, s), du, sf);
      hn::StoreU(hn::Div(hn::Set(df, 1.0f), s), df, m);
    }
  } else if constexpr (F == core::Format::kMxfp4 || F == core::Format::kMxfp4Rne) {
    const VU e = Ue8m0Exponent(hn::Mul(FmaxNanIgnoring(amax, hn::Set(df, floor)), hn::Set(df, core::bits_float(core::kInv6Bits))));
    hn::StoreU(e, du, sf);
    hn::StoreU(Ue8m0InvScale(e), df, m);
  } else if constexpr (F == core::Format::kNvfp4Static) {
    const VF q = hn::Div(amax, hn::Set(df, core::mul_rn(6.0f, s2)));
    const VF c = FminNanIgnoring(FmaxNanIgnoring(q, hn::Set(df, core::kE4M3MinSubnormal)), hn::Set(df, 448.0f));
    const VU code = E4m3Encode(c);
    hn::StoreU(code, du, sf);
    hn::StoreU(hn::Mul(E4m3Decode(code), hn::Set(df, s2)), df, m);
  } else {
    const VU code = E4m3Encode(hn::Div(amax, hn::Set(df, core::mul_rn(6.0f, s2))));
    const VF scale = E4m3Decode(code);
    const VF inv = hn::Div(hn::Set(df, 1.0f), hn::Mul(scale, hn::Set(df, s2)));
    hn::StoreU(code, du, sf);
    hn::StoreU(hn::IfThenElseZero(hn::Gt(scale, hn::Zero(df)), inv), df, m);
  }
}

/// Stores the codes of one vector: L e4m3 bytes, or L/2 bytes of two e2m1 nibbles (the
/// even element in the low nibble: each u64 pair of lanes folds its odd lane down by 28).
template <core::Format F>
HWY_INLINE void StoreCodes(VU code, uint8_t* HWY_RESTRICT out) {
  if constexpr (core::values_per_byte(F) == 1) {
    const hn::Rebind<uint8_t, DU> d8;
    hn::StoreU(hn::TruncateTo(d8, code), d8, out);
  } else {
    const hn::Repartition<uint64_t, DU> d64;
    const hn::Rebind<uint8_t, decltype(d64)> d8;
    const auto w = hn::BitCast(d64, code);
    hn::StoreU(hn::TruncateTo(d8, hn::Or(w, hn::ShiftRight<28>(w))), d8, out);
  }
}

/// Stores the codes of a pair unit: 2L e4m3 bytes, or L bytes of two e2m1 nibbles.
template <core::Format F>
HWY_INLINE void StorePair(VU even, VU odd, uint8_t* HWY_RESTRICT out) {
  if constexpr (core::values_per_byte(F) == 1) {
    const hn::Rebind<uint16_t, DU> d16;
    hn::StoreU(hn::TruncateTo(d16, hn::Or(even, hn::ShiftLeft<8>(odd))), d16, reinterpret_cast<uint16_t*>(out));
  } else {
    const hn::Rebind<uint8_t, DU> d8;
    hn::StoreU(hn::TruncateTo(d8, hn::Or(even, hn::ShiftLeft<4>(odd))), d8, out);
  }
}

/// What pass A finds in a group.
struct GroupScan {
  int32_t amax;    ///< max |x| bits, NaN ignored
  bool nan;        ///< the group holds a NaN
  int32_t minabs;  ///< min |x| bits (NaN patterns are larger than every number)
};

/// Scans G elements at element i0 of row, NaN/Inf counted into cnt, the widened bits kept in
/// scratch when kScratch. The maximum is taken over the raw |x| bits, where a NaN would
/// win; only a group that holds one is gone over again with NaN patterns as 0 (they are
/// rare, and the check is one compare per group). The minimum only when kMin (the e4m3
/// formats' choice of encoder).
template <In kIn, bool kPairs, bool kScratch, bool kMin>
HWY_INLINE GroupScan ScanGroup(const uint8_t* row, size_t i0, size_t G, bool count, VI& cnt,
                               uint32_t* HWY_RESTRICT scratch) {
  const DU du;
  const DI di;
  const size_t L = hn::Lanes(du);
  const size_t unit = kPairs ? 2 * L : L;
  const VU abs_mask = hn::Set(du, 0x7FFFFFFFu);
  VI acc = hn::Zero(di);
  VI lo = hn::Set(di, 0x7FFFFFFF);
  for (size_t i = 0; i < G; i += unit) {
    VU v0, v1;
    LoadUnit<kIn, kPairs>(row, i0 + i, v0, v1);
    if constexpr (kScratch) {
      hn::StoreU(v0, du, scratch + i);
      if constexpr (kPairs) hn::StoreU(v1, du, scratch + i + L);
    }
    const VI a0 = hn::BitCast(di, hn::And(v0, abs_mask));
    acc = hn::Max(acc, a0);
    if constexpr (kMin) lo = hn::Min(lo, a0);
    if (count) cnt = hn::Sub(cnt, hn::VecFromMask(di, hn::Gt(a0, hn::Set(di, 0x7F7FFFFF))));
    if constexpr (kPairs) {
      const VI a1 = hn::BitCast(di, hn::And(v1, abs_mask));
      acc = hn::Max(acc, a1);
      if constexpr (kMin) lo = hn::Min(lo, a1);
      if (count) cnt = hn::Sub(cnt, hn::VecFromMask(di, hn::Gt(a1, hn::Set(di, 0x7F7FFFFF))));
    }
  }
  GroupScan g{hn::GetLane(hn::MaxOfLanes(di, acc)), false, kMin ? hn::GetLane(hn::MinOfLanes(di, lo)) : 0};
  if (HWY_UNLIKELY(g.amax > 0x7F800000)) {
    g.nan = true;
    acc = hn::Zero(di);
    for (size_t i = 0; i < G; i += unit) {
      VU v0, v1;
      LoadUnit<kIn, kPairs>(row, i0 + i, v0, v1);
      acc = hn::Max(acc, hn::Max(AbsOrZero(v0), AbsOrZero(v1)));
    }
    g.amax = hn::GetLane(hn::MaxOfLanes(di, acc));
  }
  return g;
}

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

bool QuantizeRows(const Rows& r, int64_t t0, int64_t t1, int64_t* nonfinite) {
  const size_t L = hn::Lanes(DF());
  if (r.G <= 0 || r.G > 128 || static_cast<size_t>(r.G) % L != 0) return false;
  // The vector codecs are e4m3 and e2m1; rows of another element codec (e5m2) take the
  // scalar loop of the shared recipe.
  if (core::elem_of(r.fmt) == core::Elem::kE5M2) return false;
  const int64_t n = core::visit_format(r.fmt, [&](auto f) -> int64_t {
    constexpr core::Format F = decltype(f)::value;
    if constexpr (core::elem_of(F) == core::Elem::kE5M2) return 0;
    else return QuantizeRowsIn<F>(r, t0, t1);
  });
  if (r.count_nonfinite) *nonfinite += n;
  return true;
}

// ---------------------------------------------------------------------------------------
// Test hooks: whole vectors, the tail through a zero-padded buffer.

template <typename In_, typename Out, typename Body>
HWY_INLINE void ForVectors(const In_* in, Out* out, size_t n, size_t in_per_lane, Body body) {
  const size_t L = hn::Lanes(DF());
  size_t i = 0;
  for (; i + L <= n; i += L) body(in + i * in_per_lane, out + i);
  if (i < n) {
    HWY_ALIGN In_ pad_in[kMaxLanes * 4] = {};
    HWY_ALIGN Out pad_out[kMaxLanes];
    std::memcpy(pad_in, in + i * in_per_lane, (n - i) * in_per_lane * sizeof(In_));
    body(pad_in, pad_out);
    std::memcpy(out + i, pad_out, (n - i) * sizeof(Out));
  }
}

/// Codes encode(x) of n floats, one byte each.
template <typename Encode>
HWY_INLINE void EncodeBytes(const float* in, uint8_t* out, size_t n, Encode encode) {
  const DU du;
  ForVectors(in, out, n, 1, [&](const float* p, uint8_t* o) {
    HWY_ALIGN uint32_t c[kMaxLanes];
    hn::StoreU(encode(hn::LoadU(DF(), p)), du, c);
    for (size_t k = 0; k < hn::Lanes(du); ++k) o[k] = static_cast<uint8_t>(c[k]);
  });
}

void EncodeE4m3(const float* in, uint8_t* out, size_t n) {
  EncodeBytes(in, out, n, [](VF v) { return E4m3Encode(v); });
}
void EncodeE4m3Normal(const float* in, uint8_t* out, size_t n) {
  EncodeBytes(in, out, n, [](VF v) { return E4m3EncodeNormal(v); });
}
void EncodeE2m1(const float* in, uint8_t* out, size_t n, bool ttz) {
  EncodeBytes(in, out, n, [ttz](VF v) { return ttz ? E2m1Ttz(v) : E2m1Rne(v); });
}

void Widen(In in, const void* src, uint32_t* out, size_t n) {
  const DU du;
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const size_t esize = in == In::kFp32 ? 4 : 2;
  ForVectors(s, out, n, esize, [&](const uint8_t* p, uint32_t* o) {
    const VU b = in == In::kBf16 ? LoadBits<In::kBf16>(p, 0) : in == In::kFp16 ? LoadBits<In::kFp16>(p, 0) : LoadBits<In::kFp32>(p, 0);
    hn::StoreU(b, du, o);
  });
}

bool GroupAmaxes(const float* x, size_t groups, size_t G, float* out, int64_t* nonfinite) {
  const DI di;
  if (G == 0 || G % hn::Lanes(di) != 0) return false;
  VI cnt = hn::Zero(di);
  const uint8_t* row = reinterpret_cast<const uint8_t*>(x);
  for (size_t g = 0; g < groups; ++g) {
    const GroupScan a = ScanGroup<In::kFp32, false, false, true>(row, g * G, G, true, cnt, nullptr);
    out[g] = core::bits_float(static_cast<uint32_t>(a.amax));
  }
  *nonfinite = hn::GetLane(hn::SumOfLanes(di, cnt));
  return true;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
size_t FloatLanes() { return hn::Lanes(DF()); }

#else  // HWY_SCALAR (the fallback): decline, so that callers use the scalar rules of src/core

bool QuantizeRows(const Rows&, int64_t, int64_t, int64_t*) { return false; }
void EncodeE4m3(const float* in, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = core::fp8_e4m3_from_float_sw(in[i]);
}
void EncodeE4m3Normal(const float* in, uint8_t* out, size_t n) { EncodeE4m3(in, out, n); }
void EncodeE2m1(const float* in, uint8_t* out, size_t n, bool ttz) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(ttz ? core::e2m1_ttz(in[i]) : core::e2m1_rne(in[i]));
}
void Widen(In in, const void* src, uint32_t* out, size_t n) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    if (in == In::kFp32) std::memcpy(&out[i], s + 4 * i, 4);
    else out[i] = core::float_bits(in == In::kBf16 ? core::bf16_to_float(h) : core::half_to_float(h));
  }
}
bool GroupAmaxes(const float* x, size_t groups, size_t G, float* out, int64_t* nonfinite) {
  *nonfinite = 0;
  for (size_t g = 0; g < groups; ++g) {
    float a = 0.0f;
    for (size_t i = 0; i < G; ++i) {
      a = core::fmax_nan_ignoring(a, core::abs_bits(x[g * G + i]));
      *nonfinite += core::non_finite(x[g * G + i]) ? 1 : 0;
    }
    out[g] = a;
  }
  return true;
}
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
size_t FloatLanes() { return 1; }

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
HWY_EXPORT(EncodeE4m3);
HWY_EXPORT(EncodeE4m3Normal);
HWY_EXPORT(EncodeE2m1);
HWY_EXPORT(Widen);
HWY_EXPORT(GroupAmaxes);
HWY_EXPORT(TargetName);
HWY_EXPORT(FloatLanes);

namespace {
std::atomic<bool> g_enabled{true};
}

bool quantize_rows(const Rows& r, int64_t t0, int64_t t1, int64_t* nonfinite) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  return HWY_DYNAMIC_DISPATCH(QuantizeRows)(r, t0, t1, nonfinite);
}
void set_enabled(bool on) noexcept { g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() noexcept { return g_enabled.load(std::memory_order_relaxed); }

void encode_e4m3(const float* in, uint8_t* out, size_t n) { HWY_DYNAMIC_DISPATCH(EncodeE4m3)(in, out, n); }
void encode_e4m3_normal(const float* in, uint8_t* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(EncodeE4m3Normal)(in, out, n);
}
void encode_e2m1(const float* in, uint8_t* out, size_t n, bool ttz) {
  HWY_DYNAMIC_DISPATCH(EncodeE2m1)(in, out, n, ttz);
}
void widen(In in, const void* src, uint32_t* out, size_t n) { HWY_DYNAMIC_DISPATCH(Widen)(in, src, out, n); }
bool group_amax(const float* x, size_t groups, size_t G, float* amax, int64_t* nonfinite) {
  return HWY_DYNAMIC_DISPATCH(GroupAmaxes)(x, groups, G, amax, nonfinite);
}
int64_t compiled_targets() noexcept { return HWY_TARGETS; }
const char* active_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
size_t active_lanes() { return HWY_DYNAMIC_DISPATCH(FloatLanes)(); }

}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
#endif  // HWY_ONCE
