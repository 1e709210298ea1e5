// core::fastdiv (the kernels' division of chunk indices by chunks per row) against the
// compiler's integer division: every divisor up to 2^13 at the quotient boundaries, the
// divisors the staging shapes use (H / 16 for H a multiple of 128), powers of two and
// their neighbours, and random divisors and dividends over the whole 32-bit range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fastdiv.h"

namespace {

using megamoe::core::fastdiv;
using megamoe::core::make_fastdiv;

/// Dividends where a quotient changes (q*d - 1, q*d, q*d + 1) over the range, plus the ends.
std::vector<uint32_t> boundary_dividends(uint32_t d, std::mt19937_64& rng) {
  std::vector<uint32_t> v = {0u, 1u, d - 1, d, d + 1, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u, 0x7FFFFFFFu};
  const uint64_t qmax = 0xFFFFFFFFull / d;
  for (int i = 0; i < 64; ++i) {
    const uint64_t q = i < 16 ? static_cast<uint64_t>(i) : (i < 32 ? qmax - (i - 16) : rng() % (qmax + 1));
    for (int64_t dn : {-1, 0, 1}) {
      const int64_t n = static_cast<int64_t>(q * d) + dn;
      if (n >= 0 && n <= 0xFFFFFFFFll) v.push_back(static_cast<uint32_t>(n));
    }
  }
  return v;
}

void check_divisor(uint32_t d, std::mt19937_64& rng, uint64_t& failures) {
  const auto f = make_fastdiv(d);
  for (uint32_t n : boundary_dividends(d, rng)) {
    if (fastdiv(n, f) != n / d && failures++ < 5) {
      ADD_FAILURE() << n << " / " << d << ": fastdiv " << fastdiv(n, f) << ", expected " << n / d;
    }
  }
}

TEST(FastDiv, SmallDivisorsAtQuotientBoundaries) {
  std::mt19937_64 rng(7);
  uint64_t failures = 0;
  for (uint32_t d = 1; d <= 8192; ++d) check_divisor(d, rng, failures);
  EXPECT_EQ(failures, 0u);
}

TEST(FastDiv, StagingDivisorsPowersOfTwoAndRandom) {
  std::mt19937_64 rng(11);
  uint64_t failures = 0;
  for (uint32_t h = 128; h <= (1u << 20); h += 128) check_divisor(h / 16, rng, failures);
  for (uint32_t s = 0; s < 32; ++s) {
    for (int64_t dd : {-1, 0, 1}) {
      const int64_t d = (int64_t{1} << s) + dd;
      if (d >= 1 && d <= 0xFFFFFFFFll) check_divisor(static_cast<uint32_t>(d), rng, failures);
    }
  }
  for (uint32_t d : {0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000001u, 0x7FFFFFFFu}) check_divisor(d, rng, failures);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t d = static_cast<uint32_t>(rng() >> (32 + rng() % 32)) | 1u;
    check_divisor(d, rng, failures);
  }
  EXPECT_EQ(failures, 0u);
}

TEST(FastDiv, MultiplierFields) {
  EXPECT_EQ(make_fastdiv(1).shift, 0u);
  EXPECT_EQ(make_fastdiv(448).shift, 9u);  // H = 7168
  EXPECT_EQ(make_fastdiv(256).mul, 1u);    // powers of two: shift only
}

}  // namespace
