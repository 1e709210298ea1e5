// router.h: the numeric rules of the fused DeepSeek-V4 router (docs/ROUTER.md),
// shared bit-for-bit by the CPU backend and the CUDA kernels: this is the only copy of
// exp, log1p, the score, the selection order, the weights and the EPLB slot rule.
//
// exp_f32 and log1p_f32 take and return fp32 but compute in IEEE double with explicit,
// never-contracted operations (no FMA, no library call), so both backends perform the
// same operations in the same order and round the same way. A double evaluation is
// accurate to a few 2^-53, far below fp32's 2^-24, so its single final rounding to fp32 is
// the correctly rounded result except where the exact value lies within that error of an
// fp32 rounding boundary. bench/router_accuracy.cpp enumerates every fp32 input: exp has
// no such input; log1p has the few listed in log1p_exception(), whose correct results are
// substituted (only ever looked up when the double lies that close to a boundary). Both
// functions are thereby correctly rounded for every fp32 input (docs/ROUTER.md).
// sqrt is IEEE (correctly rounded on both sides: sqrtss, __fsqrt_rn; the fast score path's
// sqrt_nearest and recip_nearest give the same bits without the device's slow-path
// branches, so that router_scores' N chains can interleave).
// The special cases are selects after the main path rather than early returns, so that
// router_scores' N fast paths (below) are straight-line code a GPU thread runs side by side.
#pragma once

#include <cstdint>
#include <cstring>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/fastdiv.h"
#include "core/numerics.h"

namespace megamoe {
namespace core {

constexpr uint32_t kQuietNaNBits = 0x7FC00000u;  ///< the one NaN the router writes
constexpr float kSoftplusThreshold = 20.0f;      ///< softplus(x) = x above it (torch's threshold)
constexpr float kWeightSumFloor = 1e-20f;        ///< d = max(sum, 1e-20)
constexpr int kMaxRouterExperts = 512;           ///< E <= 512
constexpr int kMaxRouterTopk = 16;               ///< K <= 16

// ---------------------------------------------------------------------------------------
// Exact double operations (one IEEE rounding each, never fused into an FMA: the device
// intrinsics are immune to --fmad, and host code is built with -ffp-contract=off).

MEGAMOE_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MEGAMOE_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MEGAMOE_HD double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
MEGAMOE_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
/// Fused multiply-add, one IEEE rounding (std::fma on the host: glibc's is exact).
MEGAMOE_HD double dfma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
/// double -> fp32, round to nearest even (subnormal results rounded once, no flush).
MEGAMOE_HD float to_f32(double d) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(d);
#else
  return static_cast<float>(d);
#endif
}
MEGAMOE_HD uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}
MEGAMOE_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}
/// IEEE fp32 square root (correctly rounded).
MEGAMOE_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

MEGAMOE_HD float quiet_nan() { return bits_float(kQuietNaNBits); }

// ---------------------------------------------------------------------------------------
// exp

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^21 (32 significant bits); the sum of
// the parts is ln 2 to 2^-86.
constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kInvLn2 = 0x1.71547652b82fep+0;
/// 1.5 * 2^52: adding and subtracting it rounds a double of magnitude < 2^51 to the
/// nearest integer (ties to even) with IEEE arithmetic alone, no library rint.
constexpr double kRoundMagic = 0x1.8p52;

/// The double @p v is within 256 double ulps of the midpoint between two fp32 neighbours
/// (the 29 bits a normal fp32 result drops are 2^28 +- 256): only then can the exact value
/// round differently from v, and an exception table needs to be consulted.
MEGAMOE_HD bool near_fp32_midpoint(double v) {
  const uint64_t low = double_bits(v) & 0x1FFFFFFFull;
  return low - (0x10000000ull - 256u) < 512u;
}

/// e^r for |r| <= ln2/2 + 2^-20: Taylor terms to r^13 (the first omitted term is below
/// 2^-57 relative), Horner order, every step one rounding.
MEGAMOE_HD double exp_poly(double r) {
  double p = 0x1.6124613a86d09p-33;           // 1/13!
  p = dadd(dmul(p, r), 0x1.1eed8eff8d898p-29);  // 1/12!
  p = dadd(dmul(p, r), 0x1.ae64567f544e4p-26);  // 1/11!
  p = dadd(dmul(p, r), 0x1.27e4fb7789f5cp-22);  // 1/10!
  p = dadd(dmul(p, r), 0x1.71de3a556c734p-19);  // 1/9!
  p = dadd(dmul(p, r), 0x1.a01a01a01a01ap-16);  // 1/8!
  p = dadd(dmul(p, r), 0x1.a01a01a01a01ap-13);  // 1/7!
  p = dadd(dmul(p, r), 0x1.6c16c16c16c17p-10);  // 1/6!
  p = dadd(dmul(p, r), 0x1.1111111111111p-7);   // 1/5!
  p = dadd(dmul(p, r), 0x1.5555555555555p-5);   // 1/4!
  p = dadd(dmul(p, r), 0x1.5555555555555p-3);   // 1/3!
  p = dadd(dmul(p, r), 0.5);
  p = dadd(dmul(p, r), 1.0);
  return dadd(dmul(p, r), 1.0);
}

/// The main path of exp_f32 for x in [-104, 89], before the rounding to fp32.
MEGAMOE_HD double exp_core(float x) {
  const double xd = static_cast<double>(x);
  // x = k ln2 + r, |r| <= ln2/2 (+ rounding of k): k * kLn2Hi is exact and so is the first
  // subtraction (the operands agree in their leading bits, the result needs <= 32 bits).
  const double kd = dsub(dadd(dmul(xd, kInvLn2), kRoundMagic), kRoundMagic);
  const double r = dsub(dsub(xd, dmul(kd, kLn2Hi)), dmul(kd, kLn2Lo));
  const int k = static_cast<int>(kd);  // -150..129: 2^k is a normal double
  return dmul(exp_poly(r), bits_double(static_cast<uint64_t>(k + 1023) << 52));
}

/// e^x of an fp32, correctly rounded to fp32 for every input (no exceptions needed): NaN
/// -> the quiet NaN, x > 89 (e^89 > 2^128) -> +inf, x < -104 (e^-104 < 2^-150) -> +0,
/// subnormal results rounded once.
MEGAMOE_HD float exp_f32(float x) {
  const bool in_range = x >= -104.0f && x <= 89.0f;  // false for NaN
  float r = to_f32(exp_core(in_range ? x : 0.0f));
  r = x < -104.0f ? 0.0f : r;
  r = x > 89.0f ? bits_float(0x7F800000u) : r;
  return x != x ? quiet_nan() : r;
}

// ---------------------------------------------------------------------------------------
// log1p

/// log(1+f) - f + f^2/2 pieces of fdlibm's formulation (one shared rounding structure):
/// with s = f / (2 + f), log(1+f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R(s^2))) where
/// R(z) = sum_{n>=1} 2 z^n / (2n+1). Ten terms: for |s| <= 0.1716 (m in [sqrt(1/2),
/// sqrt(2))) the first omitted one is below 2^-59 of the result.
MEGAMOE_HD double log_r(double z) {
  double q = 0x1.8618618618618p-4;              // 2/21
  q = dadd(dmul(q, z), 0x1.af286bca1af28p-4);   // 2/19
  q = dadd(dmul(q, z), 0x1.e1e1e1e1e1e1ep-4);   // 2/17
  q = dadd(dmul(q, z), 0x1.1111111111111p-3);   // 2/15
  q = dadd(dmul(q, z), 0x1.3b13b13b13b14p-3);   // 2/13
  q = dadd(dmul(q, z), 0x1.745d1745d1746p-3);   // 2/11
  q = dadd(dmul(q, z), 0x1.c71c71c71c71cp-3);   // 2/9
  q = dadd(dmul(q, z), 0x1.2492492492492p-2);   // 2/7
  q = dadd(dmul(q, z), 0x1.999999999999ap-2);   // 2/5
  q = dadd(dmul(q, z), 0x1.5555555555555p-1);   // 2/3
  return dmul(q, z);
}

// log1p_core in three parts (reduction, quotient, finish); log1p_fast shares the reduction.

/// The argument reduction of log1p_core (y as there): u = 1 + y = 2^k m with m in
/// [sqrt(1/2), sqrt(2)); returns f = m - 1 (exact) and k in @p k.
MEGAMOE_HD double log1p_reduce(float y, int& k) {
  // 1 + y is exact in double for 2^-29 <= |y| < 2^53 (at most 53 bits from 2^0 or y's top
  // bit down to y's last bit); beyond, its rounding moves log(1+y) by under 2^-53 / 36.
  const double u = dadd(1.0, static_cast<double>(y));
  // u = 2^k m with m in [sqrt(1/2), sqrt(2)): exponent and mantissa straight from the bits
  // (u >= 2^-24 is normal).
  const uint64_t ub = double_bits(u);
  k = static_cast<int>((ub >> 52) & 0x7FFu) - 1023;
  uint64_t mb = (ub & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  if (mb > 0x3FF6A09E667F3BCDull) {  // m > sqrt(2): halve it
    mb -= 0x0010000000000000ull;
    ++k;
  }
  return dsub(bits_double(mb), 1.0);  // exact (Sterbenz)
}

/// The quotient of log1p_core: s = f / (2 + f), IEEE division.
MEGAMOE_HD double log1p_quotient(double f) { return ddiv(f, dadd(2.0, f)); }

/// log1p_core from the reduction (f, k) and the quotient s.
MEGAMOE_HD double log1p_finish(double f, double s, int k) {
  const double hfsq = dmul(0.5, dmul(f, f));
  const double R = log_r(dmul(s, s));
  const double dk = static_cast<double>(k);
  // k ln2 + log(m), the small parts first (fdlibm's order): k * kLn2Hi is exact.
  const double tail = dsub(dsub(hfsq, dadd(dmul(s, dadd(hfsq, R)), dmul(dk, kLn2Lo))), f);
  return dsub(dmul(dk, kLn2Hi), tail);
}

/// The main path of log1p_f32 for finite y > -1 with |y| >= 2^-29, before the rounding.
MEGAMOE_HD double log1p_core(float y) {
  int k;
  const double f = log1p_reduce(y, k);
  return log1p_finish(f, log1p_quotient(f), k);
}

/// The fp32 inputs whose log1p_core rounds to the wrong fp32, with their correctly rounded
/// results: seven found by bench/router_accuracy.cpp --exceptions, and two ("mpmath")
/// whose exact value lies within 2^-66 of a midpoint, beyond what the bench's long double
/// can decide (it reports them as unresolved): log1p_core lands exactly on the midpoint,
/// the exact value is just above it in magnitude, settled with mpmath at 300 bits.
/// @p r: log1p_core's rounding, returned for any other input.
MEGAMOE_HD float log1p_exception(uint32_t y, float r) {
  switch (y) {
    case 0x35400003u: return bits_float(0x353FFFFFu);  // 0x1.800006p-21 (mpmath)
    case 0x3710001Bu: return bits_float(0x370FFFF3u);  // 0x1.200036p-17
    case 0x3EFD81ADu: return bits_float(0x3ECDEEE1u);  // 0x1.fb035ap-2
    case 0x41078FEBu: return bits_float(0x400FE5E7u);  // 0x1.0f1fd6p+3
    case 0x65D890D3u: return bits_float(0x4254D1F9u);  // 0x1.b121a6p+76
    case 0x6F31A8ECu: return bits_float(0x42845A89u);  // 0x1.6351d8p+95
    case 0xB53FFFFDu: return bits_float(0xB5400001u);  // -0x1.7ffffap-21 (mpmath)
    case 0xB70FFFE5u: return bits_float(0xB710000Du);  // -0x1.1fffcap-17
    case 0xBB0EC8C4u: return bits_float(0xBB0EF0A5u);  // -0x1.1d9188p-9
    default: return r;
  }
}

/// log1p_f32 takes its main path: finite y > -1 with |y| >= 2^-29 (false for NaN).
MEGAMOE_HD bool log1p_main(float y) {
  const uint32_t b = float_bits(y);
  return y > -1.0f && b != 0x7F800000u && (b & 0x7FFFFFFFu) >= 0x31000000u;
}

/// log1p_f32(y) from v = log1p_core(log1p_main(y) ? y : 1): the rounding, the exception
/// table and the special cases.
MEGAMOE_HD float log1p_round(float y, double v) {
  const uint32_t b = float_bits(y);
  const bool tiny = (b & 0x7FFFFFFFu) < 0x31000000u;
  float r = to_f32(v);
  if (log1p_main(y) && near_fp32_midpoint(v)) r = log1p_exception(b, r);
  r = tiny ? y : r;
  r = b == 0x7F800000u ? y : r;
  r = y == -1.0f ? bits_float(0xFF800000u) : r;
  return y != y || y < -1.0f ? quiet_nan() : r;
}

/// log(1 + y) of an fp32, correctly rounded to fp32 for every input: NaN and y < -1 -> the
/// quiet NaN, y = -1 -> -inf, +inf -> +inf; |y| < 2^-29 -> y itself (the exact y - y^2/2
/// + ... is within 2^-30 |y| of y, closer than any fp32 rounding boundary around y;
/// subnormals and ±0 included, the sign kept).
MEGAMOE_HD float log1p_f32(float y) { return log1p_round(y, log1p_core(log1p_main(y) ? y : 1.0f)); }

// ---------------------------------------------------------------------------------------
// The router's per-expert math.

/// The expert score s = sqrt(softplus(logit)) of one logit by the exact chain (exp_f32,
/// log1p_f32, sqrt): in [+0, +inf], or the quiet NaN for a NaN logit; softplus(x) = x for
/// x > 20, else log1p(exp(x)), each step an fp32 rounding. The definition router_scores
/// reproduces, and its fallback (taken for about one score in 10^6: one chain at a time).
MEGAMOE_HD float router_score_exact(float logit) {
  const bool big = logit > kSoftplusThreshold;
  const float y = exp_f32(big ? 0.0f : logit);
  const float r = sqrt_rn(big ? logit : log1p_f32(y));
  return logit != logit ? quiet_nan() : r;
}

// ---------------------------------------------------------------------------------------
// The fast score path: the same fp32 results in about half the dependent double operations.
//
// exp_f32 and log1p_f32 above are correctly rounded, so any evaluation accurate to well
// within near_fp32_midpoint's 256 double ulps whose double result is not that close to an
// fp32 midpoint rounds to the same fp32. exp_fast and log1p_fast are such evaluations with
// fused multiply-adds (exact on both backends: the device's fma and glibc's), Estrin-ordered
// polynomials and a reciprocal refined from the fp32 one instead of a double division:
// their errors are a few double ulps (exp: degree-12 Taylor, truncation below 2^-52; log1p:
// the quotient to 2^-46, which only scales the f^3-sized correction term). Where the
// double lands near a midpoint, or outside the fast domain (logits below -87: a subnormal
// e^x), router_scores falls back to router_scores_exact for that score. Every fp32 logit
// gives router_score_exact's bits (tests/cpp/test_router.cpp on a sample of all inputs and
// every threshold's neighbourhood, bench/router_accuracy.cpp --scores on every input, the
// CUDA tests on the device).

constexpr float kExpFastMin = -87.0f;  ///< e^-87 > 2^-126: a normal fp32 result from here on

/// e^x in double for x in [kExpFastMin, kSoftplusThreshold], error a few double ulps.
MEGAMOE_HD double exp_fast(float x) {
  const double xd = static_cast<double>(x);
  const double kd = dsub(dfma(xd, kInvLn2, kRoundMagic), kRoundMagic);
  const double r = dfma(-kd, kLn2Lo, dfma(-kd, kLn2Hi, xd));
  const double r2 = dmul(r, r), r4 = dmul(r2, r2), r8 = dmul(r4, r4);
  // 1/n!, n = 0..12
  const double p01 = dfma(1.0, r, 1.0);
  const double p23 = dfma(0x1.5555555555555p-3, r, 0.5);
  const double p45 = dfma(0x1.1111111111111p-7, r, 0x1.5555555555555p-5);
  const double p67 = dfma(0x1.a01a01a01a01ap-13, r, 0x1.6c16c16c16c17p-10);
  const double p89 = dfma(0x1.71de3a556c734p-19, r, 0x1.a01a01a01a01ap-16);
  const double pab = dfma(0x1.ae64567f544e4p-26, r, 0x1.27e4fb7789f5cp-22);
  const double q0 = dfma(p23, r2, p01), q1 = dfma(p67, r2, p45), q2 = dfma(pab, r2, p89);
  const double u0 = dfma(q1, r4, q0), u1 = dfma(0x1.1eed8eff8d898p-29, r4, q2);
  const int k = static_cast<int>(kd);  // -126..29
  return dmul(dfma(u1, r8, u0), bits_double(static_cast<uint64_t>(k + 1023) << 52));
}

/// log(1 + y) in double for finite y >= 2^-29 (log1p_main, y < 2^53), error a few double
/// ulps: log1p_core's reduction and formula, the quotient from a refined reciprocal.
/// kBranchFree: the fp32 reciprocal by recip_nearest instead of the IEEE division (the same
/// bits; see router_scores).
template <bool kBranchFree = false>
MEGAMOE_HD double log1p_fast(float y) {
  int k;
  const double f = log1p_reduce(y, k);
  const double d = dadd(2.0, f);
  // 1/d: the fp32 reciprocal rounded to nearest (to 2^-23 with the rounding of d), one
  // Newton step (to 2^-46). d is in [1.7, 2.5], within recip_nearest's domain.
  const float d32 = to_f32(d);
  const double r0 = static_cast<double>(kBranchFree ? recip_nearest(d32) : div_rn(1.0f, d32));
  const double r1 = dfma(r0, dfma(-d, r0, 1.0), r0);
  const double s = dmul(f, r1);
  const double z = dmul(s, s), z2 = dmul(z, z), z4 = dmul(z2, z2), z8 = dmul(z4, z4);
  // R(z) = z (2/3 + 2/5 z + ... + 2/21 z^9)
  const double b01 = dfma(0x1.999999999999ap-2, z, 0x1.5555555555555p-1);
  const double b23 = dfma(0x1.c71c71c71c71cp-3, z, 0x1.2492492492492p-2);
  const double b45 = dfma(0x1.3b13b13b13b14p-3, z, 0x1.745d1745d1746p-3);
  const double b67 = dfma(0x1.e1e1e1e1e1e1ep-4, z, 0x1.1111111111111p-3);
  const double b89 = dfma(0x1.8618618618618p-4, z, 0x1.af286bca1af28p-4);
  const double e0 = dfma(dfma(b67, z2, b45), z4, dfma(b23, z2, b01));
  const double R = dmul(dfma(b89, z8, e0), z);
  const double hfsq = dmul(0.5, dmul(f, f));
  const double dk = static_cast<double>(k);
  const double tail = dsub(dsub(hfsq, dfma(s, dadd(hfsq, R), dmul(dk, kLn2Lo))), f);
  return dfma(dk, kLn2Hi, -tail);
}

/// The fast path of one score: returns false where it cannot decide (a double near an fp32
/// midpoint, a logit below kExpFastMin), and then @p s is to be replaced by
/// router_score_exact's; otherwise @p s is router_score_exact's result. kBranchFree: the
/// square root and log1p_fast's reciprocal without the device's slow-path branches (the same
/// bits; see router_scores).
template <bool kBranchFree = false>
MEGAMOE_HD bool router_score_fast(float x, float& s) {
  const bool big = x > kSoftplusThreshold;
  const bool fast = x >= kExpFastMin && !big;  // false for NaN
  const double ev = exp_fast(fast ? x : 0.0f);
  const float y = to_f32(ev);
  const bool main = y >= 0x1p-29f;  // else log1p(y) = y (log1p_round)
  const double lv = log1p_fast<kBranchFree>(main ? y : 1.0f);
  const float sp = big ? x : main ? to_f32(lv) : y;
  const float r = kBranchFree ? sqrt_nearest(sp) : sqrt_rn(sp);  // sp >= +0, +inf or NaN
  s = x != x ? quiet_nan() : r;
  if constexpr (kBranchFree) {
    // Bitwise, not short-circuit: nvcc compiles the latter to a branch, a convergence
    // region per chain that router_scores' chains cannot interleave across.
    const int ev_ok = near_fp32_midpoint(ev) ? 0 : 1, lv_ok = main && near_fp32_midpoint(lv) ? 0 : 1;
    return ((big ? 1 : 0) | (x != x ? 1 : 0) | ((fast ? 1 : 0) & ev_ok & lv_ok)) != 0;
  } else {
    // The same predicate; short-circuit here because the register-capped router_block, whose
    // chains run one after another anyway, spilled 84-120 B with the bitwise form (56-72
    // with this one; sm_90, ptxas -v).
    return big || x != x || (fast && !near_fp32_midpoint(ev) && !(main && near_fp32_midpoint(lv)));
  }
}

/// router_score_exact out of line, for router_scores' fallback.
MEGAMOE_HD_COLD float router_score_cold(float logit) { return router_score_exact(logit); }

/// The expert scores s = sqrt(softplus(logit)) of N logits: exactly router_scores_exact's
/// results (router_score_fast, and that chain where it cannot decide). The N chains run
/// side by side; the fallback is a branch taken about once in 10^6 scores (and for logits
/// below kExpFastMin). kCold: the fallback as a call (router_score_cold), which keeps the
/// fast chains' code together (on the H200 0.5-3.2% off a decode router launch at E = 384);
/// inlined where registers are scarce (the fused kernel's 32-register router block, where
/// the call cost 3-4% at T = 1024). kBranchFree: the chains' square roots and reciprocals
/// by sqrt_nearest and recip_nearest (core/numerics.h), the IEEE results without the
/// device's slow-path branches. Each such branch is a convergence region that the compiler
/// schedules nothing across, so with the IEEE forms the N chains ran one after another on
/// sm_90 (route_kernel's SASS: each chain's reciprocal and root, then the next chain's
/// first instruction); branch-free, their instructions interleave. It costs registers (a
/// 32-register block spills more), so the register-capped router_block keeps the IEEE forms.
template <int N, bool kCold = false, bool kBranchFree = false>
MEGAMOE_HD void router_scores(const float (&logit)[N], float (&s)[N]) {
  bool ok[N];
  bool all = true;
  MEGAMOE_UNROLL
  for (int c = 0; c < N; ++c) {
    ok[c] = router_score_fast<kBranchFree>(logit[c], s[c]);
    all = all && ok[c];
  }
  if (!all) {
    MEGAMOE_UNROLL
    for (int c = 0; c < N; ++c) {
      if (!ok[c]) s[c] = kCold ? router_score_cold(logit[c]) : router_score_exact(logit[c]);
    }
  }
}

/// The expert score s = sqrt(softplus(logit)) of one logit (router_scores).
MEGAMOE_HD float router_score(float logit) {
  const float x[1] = {logit};
  float s[1];
  router_scores(x, s);
  return s[0];
}

/// The selection key of a biased score b = fl(s + bias): an unsigned integer whose order is
/// the selection order of the scores. Numbers map monotonically (-0 and +0 to the same
/// key), every NaN to 0, below every number (-inf's key is 0x007FFFFF). A larger key is
/// chosen first; equal keys go to the lower expert id.
MEGAMOE_HD uint32_t selection_key(float b) {
  uint32_t u = float_bits(b);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0u;
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

/// The biased score's key: fl(s + bias).
MEGAMOE_HD uint32_t biased_key(float s, float bias) { return selection_key(add_rn(s, bias)); }

/// d = max(sum, 1e-20), NaN propagating (torch.clamp's rule).
MEGAMOE_HD float weight_denominator(float sum) {
  return sum != sum ? sum : (sum > kWeightSumFloor ? sum : kWeightSumFloor);
}

/// w = fl(fl(s / d) * alpha), NaN written as the quiet NaN. Without a routed scaling factor
/// the router's problem carries alpha = 1 (RouterProblem, contract/validate.h), which is no
/// scaling: q * 1 is q for every quotient q, subnormal ones too (the host's router threads
/// run in the default floating-point environment, no DAZ; the device's __fmul_rn is built
/// with -ftz=false), zeros and infinities with their signs, and a NaN q is written as the
/// quiet NaN either way.
MEGAMOE_HD float router_weight(float s, float d, float alpha) {
  const float w = mul_rn(div_rn(s, d), alpha);
  return w != w ? quiet_nan() : w;
}

/// EPLB: the replica slot of flat position p for a logical expert with @p count replicas
/// (device data: clamped to [1, R]) in a map of R >= 1 slots.
MEGAMOE_HD int64_t replica_slot(int64_t p, int32_t count, int64_t R) {
  const int64_t c = count < 1 ? 1 : (count > R ? R : count);  // in [1, 2^31)
  // The same remainder in 32 bits where p allows (every realistic T * K): on the GPU a
  // 64-bit remainder is a long subroutine on the EPLB store's dependent chain, and a
  // 32-bit one some twenty instructions (a float reciprocal among them); up to 4 replicas
  // (the usual EPLB state) a mask, or for 3 a multiply-high (q / 3 = q * 0xAAAAAAAB >> 33,
  // exact for every 32-bit q).
  if (static_cast<uint64_t>(p) <= 0xFFFFFFFFull) {
    const uint32_t q = static_cast<uint32_t>(p), d = static_cast<uint32_t>(c);
    if (d == 3u) return q - 3u * (mulhi_u32(q, 0xAAAAAAABu) >> 1);
    if (d <= 4u) return q & (d - 1u);  // 1, 2, 4
    return q % d;
  }
  return p % c;
}

}  // namespace core
}  // namespace megamoe
