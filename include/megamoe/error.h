/// @file error.h
/// @brief The one exception type of megamoe and the check macro that raises it.
///
/// Every failed check names the tensor (or argument) it is about, what was expected and
/// what was got, e.g.
///   `megamoe: x_sf: expected dtype int32, got float32`
/// Checks that mirror an error of the reference Python function start with the
/// reference's own sentence, so engines matching on that text keep working. Callers that
/// do not use exceptions call the try_ entry points, which return a Status instead.
#pragma once

#include <stdexcept>
#include <string>

namespace megamoe {

/// @brief What kind of failure an Error reports.
enum class ErrorCode {
  kInvalidArgument,  ///< Bad shape, dtype, stride, device, scheme or option: nothing was written.
  kUnsupported,      ///< Valid request this build cannot serve (CUDA tensors in a CPU-only build; a
                     ///< grid beyond CUDA's limits).
  kCuda,             ///< A CUDA runtime call failed (the message names the call and the error).
  kOutOfMemory,      ///< Host memory for a scratch buffer could not be had, or a system resource
                     ///< (std::system_error). A worker thread that cannot start is not an
                     ///< error: the call runs on the threads it has.
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

/// @brief "invalid_argument", "unsupported", "cuda", "out_of_memory" or "internal".
const char* to_string(ErrorCode code) noexcept;

/// @brief Outcome of a non-throwing entry point (try_prepare_inputs and friends).
struct Status {
  ErrorCode code = ErrorCode::kInvalidArgument;  ///< meaningful only when !ok
  bool ok = true;                                ///< the call succeeded
  std::string message;                           ///< Error::what() of the failure, else empty
  explicit operator bool() const noexcept { return ok; }
};

}  // namespace megamoe

