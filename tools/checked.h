// checked.h: overflow-checked int64 arithmetic for the sizes megamoe-stage computes from
// user numbers (shapes, byte counts, shared_x_sf rows). The CLI's own: it builds against the
// public headers only, and the library's equivalent is private.
#pragma once

#include <cstdint>

namespace megamoe_cli {

/// A fitting int64, or "overflowed"; a chain of +, - and * stays overflowed once a step
/// overflows, so that one check at the end (checked_value, safetensors.h) covers a formula.
class Checked {
 public:
  Checked(int64_t v = 0) : v_(v) {}  // NOLINT: implicit from a plain value
  static Checked overflow() {
    Checked c;
    c.ok_ = false;
    return c;
  }
  bool ok() const { return ok_; }
  /// The value; only meaningful when ok().
  int64_t value() const { return v_; }

  friend Checked operator+(Checked a, Checked b) {
    return a.step(b, [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); });
  }
  friend Checked operator-(Checked a, Checked b) {
    return a.step(b, [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); });
  }
  friend Checked operator*(Checked a, Checked b) {
    return a.step(b, [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); });
  }

 private:
  /// @p overflows(x, y, &r) stores x op y in r and says whether it did not fit.
  template <typename Op>
  Checked step(Checked b, Op overflows) const {
    int64_t r = 0;
    return ok_ && b.ok_ && !overflows(v_, b.v_, &r) ? Checked(r) : overflow();
  }

  int64_t v_ = 0;
  bool ok_ = true;
};

}  // namespace megamoe_cli
