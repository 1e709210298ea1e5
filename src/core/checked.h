// checked.h: overflow-checked int64 arithmetic for every size, extent and byte span the
// library computes from caller-supplied numbers (the CLI has its own, tools/checked.h).
// Host only: the device code works on values the validator has already proven to fit.
#pragma once

#include <cstdint>
#include <limits>

namespace megamoe {
namespace core {

/// a * b, false when the exact product does not fit in int64.
inline bool mul_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
/// a + b, false when the exact sum does not fit in int64.
inline bool add_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
/// a - b, false when the exact difference does not fit in int64.
inline bool sub_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_sub_overflow(a, b, out); }

/// A value that is either a fitting int64 or "overflowed"; chains of arithmetic stay
/// overflowed once any step overflows, so one check at the end covers the whole formula.
class Checked {
 public:
  constexpr Checked() = default;
  constexpr Checked(int64_t v) : v_(v) {}  // NOLINT: implicit from a plain value
  static constexpr Checked overflow() {
    Checked c;
    c.ok_ = false;
    return c;
  }
  constexpr bool ok() const { return ok_; }
  /// The value; only meaningful when ok().
  constexpr int64_t value() const { return v_; }

  friend Checked operator*(Checked a, Checked b) {
    int64_t r;
    return a.ok_ && b.ok_ && mul_ok(a.v_, b.v_, &r) ? Checked(r) : overflow();
  }
  friend Checked operator+(Checked a, Checked b) {
    int64_t r;
    return a.ok_ && b.ok_ && add_ok(a.v_, b.v_, &r) ? Checked(r) : overflow();
  }
  friend Checked operator-(Checked a, Checked b) {
    int64_t r;
    return a.ok_ && b.ok_ && sub_ok(a.v_, b.v_, &r) ? Checked(r) : overflow();
  }
  /// Division by a positive divisor (never overflows; a non-positive divisor overflows).
  friend Checked operator/(Checked a, Checked b) {
    return a.ok_ && b.ok_ && b.v_ > 0 ? Checked(a.v_ / b.v_) : overflow();
  }

 private:
  int64_t v_ = 0;
  bool ok_ = true;
};

/// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1.
inline Checked ceil_div(Checked a, Checked b) {
  if (!a.ok() || !b.ok() || a.value() < 0 || b.value() <= 0) return Checked::overflow();
  return a.value() == 0 ? Checked(0) : Checked((a.value() - 1) / b.value() + 1);
}

/// a rounded up to a multiple of m (a >= 0, m > 0).
inline Checked round_up(Checked a, Checked m) { return ceil_div(a, m) * m; }

}  // namespace core
}  // namespace megamoe
