/// @file megamoe.h
/// @brief Umbrella header of megamoe: MegaMoE input staging (fp8 quantization with UE8M0
/// or fp32 group scales, top-k repack, padding mask, shared-expert scale permutation).
#pragma once

#include "megamoe/buffers.h"
#include "megamoe/cpu.h"
#include "megamoe/device/target.h"
#include "megamoe/error.h"
#include "megamoe/gate.h"
#include "megamoe/mhc.h"
#include "megamoe/norm.h"
#include "megamoe/plan.h"
#include "megamoe/quant.h"
#include "megamoe/router.h"
#include "megamoe/shapes.h"
#include "megamoe/stage.h"
#include "megamoe/tensor.h"
#include "megamoe/version.h"
