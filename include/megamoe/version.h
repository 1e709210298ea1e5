/// @file version.h
/// @brief Library version: the one source of it (CMakeLists.txt and pyproject.toml read
/// these three lines).
#pragma once
#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 2
#define MEGAMOE_VERSION_PATCH 0
#define MEGAMOE_STRINGIFY_(x) #x
#define MEGAMOE_STRINGIFY(x) MEGAMOE_STRINGIFY_(x)
/// @brief "MAJOR.MINOR.PATCH" as a string literal.
#define MEGAMOE_VERSION_STRING                                                          \
  MEGAMOE_STRINGIFY(MEGAMOE_VERSION_MAJOR) "." MEGAMOE_STRINGIFY(MEGAMOE_VERSION_MINOR) "." \
  MEGAMOE_STRINGIFY(MEGAMOE_VERSION_PATCH)
namespace megamoe {
/// @brief "MAJOR.MINOR.PATCH".
const char* version() noexcept;
}  // namespace megamoe
