// Hostile inputs (the defects of the 2026-12-01 probe): sizes, strides and counts chosen so
// that wrapping arithmetic would let a call pass the checks and write outside the caller's
// buffers. Each case must be rejected with megamoe::Error before anything is written, or
// (empty tensors) accepted and staged correctly.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"

namespace {

using megamoe::Device;
using megamoe::DType;
using megamoe::ErrorCode;
using megamoe::StageArgs;
using megamoe::TensorRef;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

/// Real, poisoned buffers for a small valid call (T = 2, H = 128, K = 2, MXFP8); tests
/// then break one thing.
struct Small {
  static constexpr int64_t T = 2, H = 128, K = 2;
  std::vector<uint16_t> hs = std::vector<uint16_t>(T * H, 0x3F80);  // bf16 1.0
  std::vector<float> w = std::vector<float>(T * K, 0.5f);
  std::vector<int32_t> ids = std::vector<int32_t>(T * K, 7);
  std::vector<uint8_t> xq = std::vector<uint8_t>(T * H, 0xAB);
  std::vector<int32_t> sf = std::vector<int32_t>(T * H / 128, 0x5A5A5A5A);
  std::vector<int64_t> io = std::vector<int64_t>(T * K, 0x1234);
  std::vector<float> wo = std::vector<float>(T * K, -3.0f);
  std::vector<int32_t> shared = std::vector<int32_t>(256, 0x77777777);
  StageArgs a;

  Small() {
    a.hidden_states = TensorRef(hs.data(), DType::kBFloat16, {T, H});
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.x_q = TensorRef(xq.data(), DType::kUInt8, {T, H});
    a.x_sf = TensorRef(sf.data(), DType::kInt32, {T, H / 128});
    a.topk_idx_out = TensorRef(io.data(), DType::kInt64, {T, K});
    a.topk_weights_out = TensorRef(wo.data(), DType::kFloat32, {T, K});
  }

  /// Every buffer still holds what it held when built (inputs and poison).
  bool untouched() const {
    auto all = [](const auto& v, auto x) {
      for (auto e : v) {
        if (std::memcmp(&e, &x, sizeof e) != 0) return false;
      }
      return true;
    };
    return all(hs, uint16_t{0x3F80}) && all(w, 0.5f) && all(ids, 7) && all(xq, uint8_t{0xAB}) &&
           all(sf, 0x5A5A5A5A) && all(io, int64_t{0x1234}) && all(wo, -3.0f) &&
           all(shared, 0x77777777);
  }
};

/// prepare_inputs and validate both throw megamoe::Error(kInvalidArgument) whose message
/// contains @p needle, and nothing is written.
void expect_reject(Small& s, const std::string& needle) {
  for (int api = 0; api < 2; ++api) {
    try {
      if (api == 0) megamoe::prepare_inputs(s.a);
      else megamoe::validate(s.a);
      ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
    } catch (const megamoe::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.untouched());
  }
}

// Defect 1: a huge shared_block_m wrapped the required-row count to 0 or 128.
TEST(Hostile, HugeSharedBlockMIsRejectedNotWrapped) {
  for (int64_t bm : {kI64Max, kI64Max - 126, kI64Max - 127, int64_t{1} << 62, (int64_t{1} << 62) + 1}) {
    for (int64_t rows : {int64_t{0}, int64_t{128}}) {
      Small s;
      s.a.shared_x_sf = rows == 0 ? TensorRef(nullptr, DType::kInt32, {0, 1})
                                  : TensorRef(s.shared.data(), DType::kInt32, {rows, 1});
      s.a.shared_block_m = bm;
      SCOPED_TRACE("bm " + std::to_string(bm) + ", rows " + std::to_string(rows));
      expect_reject(s, "shared_x_sf has insufficient rows");
    }
  }
}

// Defect 2: strides whose byte offsets wrap made row 1 alias row 0 or land on an input.
TEST(Hostile, StridesWhoseByteOffsetsWrapAreRejected) {
  const int64_t big[] = {(int64_t{1} << 61) + 1, (int64_t{1} << 61) - 256, int64_t{1} << 62, kI64Max,
                         std::numeric_limits<int64_t>::min(), -(int64_t{1} << 62)};
  for (int64_t st : big) {
    SCOPED_TRACE("stride " + std::to_string(st));
    {
      Small s;
      s.a.topk_idx_out = TensorRef(s.io.data(), DType::kInt64, {Small::T, Small::K}, {st, 1});
      expect_reject(s, "topk_idx_out");
    }
    {
      Small s;
      s.a.x_q = TensorRef(s.xq.data(), DType::kUInt8, {Small::T, Small::H}, {st, 1});
      expect_reject(s, "x_q");
    }
    {
      Small s;  // an input, too: reading through a wrapped stride is as wrong
      s.a.hidden_states = TensorRef(s.hs.data(), DType::kBFloat16, {Small::T, Small::H}, {st, 1});
      expect_reject(s, "hidden_states");
    }
  }
}

// Defect 3: numel() wrapped, so null pointers with a huge shape passed the null check.
TEST(Hostile, ShapesWhoseElementCountOverflowsAreRejected) {
  const int64_t T = int64_t{1} << 57, H = 128;
  StageArgs a;
  a.hidden_states = TensorRef(nullptr, DType::kBFloat16, {T, H});
  a.topk_weights = TensorRef(nullptr, DType::kFloat32, {T, 1});
  a.topk_ids = TensorRef(nullptr, DType::kInt32, {T, 1});
  a.x_q = TensorRef(nullptr, DType::kUInt8, {T, H});
  a.x_sf = TensorRef(nullptr, DType::kInt32, {T, 1});
  a.topk_idx_out = TensorRef(nullptr, DType::kInt64, {T, 1});
  a.topk_weights_out = TensorRef(nullptr, DType::kFloat32, {T, 1});
  EXPECT_EQ(a.hidden_states.numel(), kI64Max);  // saturates instead of wrapping to 0
  try {
    megamoe::prepare_inputs(a);
    ADD_FAILURE() << "accepted";
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  TensorRef t(nullptr, DType::kBFloat16, {int64_t{1} << 62, 4});
  EXPECT_EQ(t.numel(), kI64Max);
  TensorRef neg(nullptr, DType::kBFloat16, {-1, 4});
  EXPECT_EQ(neg.numel(), kI64Max);
}

// Defect 4: empty outputs were rejected as "overlapping strides".
TEST(Hostile, EmptyTopkOutputsPassWhateverTheirStrides) {
  Small s;
  s.a.topk_weights = TensorRef(s.w.data(), DType::kFloat32, {Small::T, 0}, {0, 0});
  s.a.topk_ids = TensorRef(s.ids.data(), DType::kInt32, {Small::T, 0}, {0, 0});
  s.a.topk_idx_out = TensorRef(s.io.data(), DType::kInt64, {Small::T, 0}, {0, 0});
  s.a.topk_weights_out = TensorRef(s.wo.data(), DType::kFloat32, {Small::T, 0}, {0, 0});
  ASSERT_NO_THROW(megamoe::prepare_inputs(s.a));
  // 1.0: s = 1/448, UE8M0 exponent 127 - 8 (scale 2^-8), value 256 = fp8 0x78.
  for (uint8_t b : s.xq) EXPECT_EQ(b, 0x78);
  for (int32_t w : s.sf) EXPECT_EQ(w, 0x77777777);
  for (int64_t v : s.io) EXPECT_EQ(v, 0x1234);      // nothing to write there
}

// Defect 5 (C++ side): T == 0 returns before any check but hidden_states' rank.
TEST(Hostile, ZeroTokensReturnBeforeOtherChecks) {
  StageArgs a;
  a.hidden_states = TensorRef(nullptr, DType::kInt64, {0, 77});  // bad dtype and H: not read
  EXPECT_NO_THROW(megamoe::prepare_inputs(a));
  EXPECT_NO_THROW(megamoe::validate(a));
  a.hidden_states = TensorRef(nullptr, DType::kBFloat16, {0});
  EXPECT_THROW(megamoe::prepare_inputs(a), megamoe::Error);
}

// Defect 6: "expected device cpu, got device cpu"; unknown device types reached CUDA.
TEST(Hostile, InvalidDevicesAreRejectedByName) {
  {
    Small s;
    s.a.x_sf.device = Device{Device::Type::kCPU, 3};
    expect_reject(s, "got device cpu:3");
  }
  {
    Small s;
    s.a.hidden_states.device = Device{Device::Type::kCPU, 3};
    expect_reject(s, "got device cpu:3");
  }
  {
    Small s;
    const Device bogus{static_cast<Device::Type>(7), 0};
    for (TensorRef* t : {&s.a.hidden_states, &s.a.topk_weights, &s.a.topk_ids, &s.a.x_q, &s.a.x_sf,
                         &s.a.topk_idx_out, &s.a.topk_weights_out}) {
      t->device = bogus;
    }
    expect_reject(s, "unknown device type 7");
  }
  {
    Small s;
    for (TensorRef* t : {&s.a.hidden_states, &s.a.topk_weights, &s.a.topk_ids, &s.a.x_q, &s.a.x_sf,
                         &s.a.topk_idx_out, &s.a.topk_weights_out}) {
      t->device = Device::cuda(-1);
    }
    expect_reject(s, "cuda:-1");
  }
}

}  // namespace
