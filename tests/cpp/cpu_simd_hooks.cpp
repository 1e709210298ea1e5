// cpu_simd_hooks.cpp: the test hooks of cpu_simd_hooks.h, compiled once per instruction set
// by Highway's foreach_target over the library's vector primitives (src/cpu/simd_ops.h),
// for the same instruction sets as the quantizer (src/cpu/simd_targets.h), and picked at
// run time as the quantizer's copies are (hwy::SetSupportedTargetsForTest forces both).

// clang-format off
#include "cpu/simd_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_simd_hooks.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

#include <cstring>

#include "formats/recipe.h"
#include "cpu/simd.h"
#include "cpu/simd_ops.h"  // (the primitives, once per instruction set)
#include "cpu_simd_hooks.h"

HWY_BEFORE_NAMESPACE();
namespace megamoe {
namespace cpu {
namespace simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// Whole vectors, the tail through a zero-padded buffer.
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

#else  // HWY_SCALAR (the fallback): the scalar rules of src/core, which the library uses there

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

HWY_EXPORT(EncodeE4m3);
HWY_EXPORT(EncodeE4m3Normal);
HWY_EXPORT(EncodeE2m1);
HWY_EXPORT(Widen);
HWY_EXPORT(GroupAmaxes);
HWY_EXPORT(TargetName);
HWY_EXPORT(FloatLanes);

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
