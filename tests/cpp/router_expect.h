// router_expect.h: the router tests' comparisons (gtest), shared by the CPU tests of the
// router (test_router.cpp) and of the gate (test_gate.cpp).
#pragma once

#include <gtest/gtest.h>

#include "router_cases.h"
#include "router_reference.h"

namespace router_cases {

/// The library's public outputs (and load, counter) equal the reference's.
inline void expect_router_outputs(const Spec& s, Built& b, const ref::Result& want) {
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t id = s.ids_dt == DType::kInt32 ? b.ids.at<int32_t>(t, k) : b.ids.at<int64_t>(t, k);
      ASSERT_EQ(id, want.ids[static_cast<size_t>(t * s.K + k)]) << "topk_ids[" << t << ", " << k << "]";
      const float w = b.weights.at<float>(t, k);
      ASSERT_EQ(hex(u32(w)), hex(u32(want.weights[static_cast<size_t>(t * s.K + k)])))
          << "topk_weights[" << t << ", " << k << "] = " << w;
    }
  }
  if (s.l2p) {
    for (int64_t i = 0; i < s.P; ++i) {
      const int64_t got = s.load_dt == DType::kInt32 ? b.load.at<int32_t>(i) : b.load.at<int64_t>(i);
      ASSERT_EQ(got, want.load[static_cast<size_t>(i)]) << "expert_load_view[" << i << "]";
    }
  }
  if (s.count) {
    EXPECT_EQ(b.nonfinite.at<int64_t>(0), 1000 + want.nonfinite);
  }
}

/// Every byte of the two buffers (elements and poisoned gaps) equal.
inline void expect_same_bytes(const Tensor& a, const Tensor& b, const char* name) {
  ASSERT_EQ(a.mem.size(), b.mem.size()) << name;
  for (size_t i = 0; i < a.mem.size(); ++i) {
    ASSERT_EQ(a.mem[i], b.mem[i]) << name << ": byte " << i;
  }
}

}  // namespace router_cases
