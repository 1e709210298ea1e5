/// @file version.h
/// @brief Library version.
#pragma once
#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 1
#define MEGAMOE_VERSION_PATCH 0
namespace megamoe {
/// @brief "MAJOR.MINOR.PATCH".
const char* version() noexcept;
}  // namespace megamoe
