// contract/target.h: StageTarget values from the validator's problem (contract/target.cpp).
#pragma once

#include "contract/validate.h"
#include "megamoe/device/target.h"

namespace megamoe {
namespace detail {

/// The outputs of a validated staging call @p a (problem @p p) as a StageTarget; a call
/// that returns at once gives T = 0 and nothing else.
device::StageTarget make_stage_target(const StageArgs& a, const Problem& p);
/// device::stage_target's checks and value (api.cpp wraps it in the library's guard).
device::StageTarget stage_target(const StageArgs& a);

}  // namespace detail
}  // namespace megamoe
