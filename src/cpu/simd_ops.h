// simd_ops.h: the vector primitives of the CPU quantizer, each the scalar rule of src/core
// lane by lane (why they are bit-exact: the comment at the top of cpu/stage_simd.cpp):
// exact widening of bf16 / fp16 / fp32, NaN-ignoring max/min, UE8M0, the e4m3 and e2m1
// encoders, the e4m3 decoder, a format's element encode, group parameters and code stores,
// and a group's |x| scan. A translation unit that runs
// Highway's foreach_target (after cpu/simd_targets.h) includes it once per instruction set,
// after hwy/highway.h, and gets the primitives in that set's namespace; hence the
// per-target guard below instead of #pragma once. The quantizer (cpu/stage_simd.cpp) and
// the test suite's hooks (tests/cpp/cpu_simd_hooks.cpp) are such units.
#if defined(MEGAMOE_CPU_SIMD_OPS_H_) == defined(HWY_TARGET_TOGGLE)  // per-target guard
#ifdef MEGAMOE_CPU_SIMD_OPS_H_
#undef MEGAMOE_CPU_SIMD_OPS_H_
#else
#define MEGAMOE_CPU_SIMD_OPS_H_
#endif

#include <cstddef>
#include <cstdint>

#include "formats/recipe.h"
#include "cpu/simd.h"
#include "hwy/highway.h"

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

/// The UE8M0 bytes e, but the unit scale's where a (the floored amax) is 0 at floor 0
/// (the fp8 and MXFP4 recipes' rule).
HWY_INLINE VU Ue8m0UnitAtZero(VU e, VF a, float floor) {
  if (floor != 0.0f) return e;
  const DF df;
  const DU du;
  return hn::IfThenElse(hn::RebindMask(du, hn::Eq(a, hn::Zero(df))), hn::Set(du, core::kUe8m0Unit), e);
}

/// core::group_params<F> for the groups in the lanes of amax: scale codes to sf[], the
/// multipliers (divisors for kNvfp4Static) to m[]. s2: gs, or the row's per-token scale
/// (core::per_token_scale, which has the floor-0 rule of its own).
template <core::Format F>
HWY_INLINE void GroupParams(VF amax, float floor, float s2, uint32_t* HWY_RESTRICT sf, float* HWY_RESTRICT m) {
  const DF df;
  const DU du;
  if constexpr (F == core::Format::kFp8Ue8m0 || F == core::Format::kFp8Fp32) {
    const VF a = FmaxNanIgnoring(amax, hn::Set(df, floor));
    VF s = hn::Mul(a, hn::Set(df, core::bits_float(core::kInv448Bits)));
    if constexpr (F == core::Format::kFp8Ue8m0) {
      const VU e = Ue8m0UnitAtZero(Ue8m0Exponent(s), a, floor);
      hn::StoreU(e, du, sf);
      hn::StoreU(Ue8m0InvScale(e), df, m);
    } else {
      // Floor 0: scales without a finite reciprocal (s <= 2^-128) become 1.
      if (floor == 0.0f) s = hn::IfThenElse(hn::Le(s, hn::Set(df, core::kFp32ScaleNoRecip)), hn::Set(df, 1.0f), s);
      hn::StoreU(hn::BitCast(du, s), du, sf);
      hn::StoreU(hn::Div(hn::Set(df, 1.0f), s), df, m);
    }
  } else if constexpr (F == core::Format::kMxfp4 || F == core::Format::kMxfp4Rne) {
    const VF a = FmaxNanIgnoring(amax, hn::Set(df, floor));
    const VU e = Ue8m0UnitAtZero(Ue8m0Exponent(hn::Mul(a, hn::Set(df, core::bits_float(core::kInv6Bits)))), a, floor);
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

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace simd
}  // namespace cpu
}  // namespace megamoe
HWY_AFTER_NAMESPACE();

#endif  // per-target guard
