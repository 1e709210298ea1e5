// check.h: the check macro and message builder behind every megamoe::Error the library
// raises (internal; the public header error.h only declares the exception).
#pragma once

#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "megamoe/error.h"

namespace megamoe {
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

/// The value of @p f(), any foreign exception turned into megamoe::Error naming @p what:
/// the one wall at every public entry point, since nothing else may leave the library.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(std::forward<F>(f)()) {
  try {
    return std::forward<F>(f)();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, std::string("megamoe: ") + what + ": out of host memory");
  } catch (const std::system_error& e) {
    throw Error(ErrorCode::kOutOfMemory, std::string("megamoe: ") + what + ": " + e.what());
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, std::string("megamoe: ") + what + ": internal error: " + e.what());
  } catch (...) {
    throw Error(ErrorCode::kInternal, std::string("megamoe: ") + what + ": internal error");
  }
}
}  // namespace detail
}  // namespace megamoe

/// Throw megamoe::Error(kInvalidArgument) "megamoe: <tensor>: expected <expected>, got
/// <actual>" unless @p cond holds (expected/actual: strings, C strings or numbers).
#define MEGAMOE_CHECK(cond, tensor, expected, actual)                                          \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::megamoe::detail::check_failed(::megamoe::ErrorCode::kInvalidArgument, nullptr, tensor, \
                                      expected, actual);                                       \
    }                                                                                          \
  } while (0)
