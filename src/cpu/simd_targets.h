// simd_targets.h: the instruction sets Highway compiles the CPU quantizer's vector code for.
// Every translation unit that runs foreach_target over the vector primitives
// (cpu/simd_ops.h) includes it before hwy/foreach_target.h, so that all of them carry the
// same copies.
#pragma once

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
// clang-format on
