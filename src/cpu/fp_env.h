// fp_env.h: the floating-point environment the CPU backend computes in.
#pragma once

#include <cfenv>

namespace megamoe {
namespace cpu {

/// The default floating-point environment (round to nearest, no flush-to-zero, no
/// denormals-are-zero) for its lifetime, the caller's own restored after (flags included):
/// the rules are exact only there, and a host that set FTZ/DAZ (torch.set_flush_denormal)
/// or another rounding mode must get the same bytes. Pool workers run in it too.
class DefaultFpEnv {
 public:
  DefaultFpEnv() : saved_(std::fegetenv(&env_) == 0) {
    if (saved_) std::fesetenv(FE_DFL_ENV);
  }
  ~DefaultFpEnv() {
    if (saved_) std::fesetenv(&env_);
  }
  DefaultFpEnv(const DefaultFpEnv&) = delete;
  DefaultFpEnv& operator=(const DefaultFpEnv&) = delete;

 private:
  std::fenv_t env_;
  bool saved_;
};

}  // namespace cpu
}  // namespace megamoe
