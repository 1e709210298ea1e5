// group_params.h: what a group stores as its scale and how its values map before
// encoding; every format's recipe fills one.
#pragma once

#include <cstdint>

namespace megamoe {
namespace core {

/// What a group stores as its scale and how its values are mapped before encoding.
struct GroupParams {
  uint32_t sf;  ///< stored scale: UE8M0 byte, e4m3 byte, or fp32 bits
  float m;      ///< multiplier, or divisor for kNvfp4Static
};

}  // namespace core
}  // namespace megamoe
