/// @file error.h
/// @brief The one exception type of megamoe and the check macro that raises it.
///
/// Every failed check names the tensor (or argument) it is about, what was expected and
/// what was got, e.g.
///   `megamoe: x_sf: expected dtype int32, got float32`
/// Checks that mirror an error of the reference Python function start with the
/// reference's own sentence, so engines matching on that text keep working.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

namespace megamoe {

/// @brief What kind of failure an Error reports.
enum class ErrorCode {
  kInvalidArgument,  ///< Bad shape, dtype, stride, device, scheme or option: nothing was written.
  kUnsupported,      ///< Valid request this build cannot serve (e.g. CUDA tensors, CPU-only build).
  kCuda,             ///< A CUDA runtime call failed (the message names the call and the error).
  kOutOfMemory,      ///< Host memory for a scratch buffer or worker thread could not be had.
  kInternal,         ///< Anything else that went wrong inside the library (a bug: please report).
};

/// @brief The only exception megamoe throws.
class Error : public std::runtime_error {
 public:
  /// @param code  failure class.
  /// @param msg   full human-readable message.
  Error(ErrorCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  /// @brief The failure class (Python maps kInvalidArgument to ValueError).
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
// Message pieces as text. No iostreams: the library must not depend on the iostream/locale
// state of whatever process loads it (a Python extension, a serving binary).
inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(const char* s) { return s != nullptr ? std::string(s) : std::string("(null)"); }
template <typename T, typename std::enable_if<std::is_arithmetic<T>::value, int>::type = 0>
std::string to_text(T v) {
  return std::to_string(v);
}

template <typename E, typename A>
[[noreturn]] inline void check_failed(ErrorCode code, const char* context, const char* tensor,
                                      const E& expected, const A& actual) {
  std::string msg;
  if (context != nullptr && context[0] != '\0') {
    msg = std::string(context) + " (" + tensor + ": expected " + to_text(expected) + ", got " +
          to_text(actual) + ")";
  } else {
    msg = std::string("megamoe: ") + tensor + ": expected " + to_text(expected) + ", got " +
          to_text(actual);
  }
  throw Error(code, msg);
}
}  // namespace detail

}  // namespace megamoe

/// @brief Throw megamoe::Error(kInvalidArgument) unless @p cond holds.
/// @param cond      condition that must hold.
/// @param tensor    name of the tensor or argument checked (C string).
/// @param expected  what was expected (a string, a C string or a number).
/// @param actual    what was got (a string, a C string or a number).
#define MEGAMOE_CHECK(cond, tensor, expected, actual)                                          \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::megamoe::detail::check_failed(::megamoe::ErrorCode::kInvalidArgument, nullptr, tensor, \
                                      expected, actual);                                       \
    }                                                                                          \
  } while (0)
