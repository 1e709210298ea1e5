// Downstream smoke test: stage a tiny problem through the installed library and check
// hand-computed results. Exit status 0 on success.
#include <megamoe/megamoe.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main() {
  constexpr int64_t T = 3, H = 128, K = 2;
  // bf16 hidden states: token 0 all 1.0, token 1 all 0.0, token 2 all -448.0.
  std::vector<uint16_t> hidden(T * H);
  for (int64_t h = 0; h < H; ++h) {
    hidden[0 * H + h] = 0x3F80;  // 1.0
    hidden[1 * H + h] = 0x0000;  // 0.0
    hidden[2 * H + h] = 0xC3E0;  // -448.0
  }
  std::vector<int32_t> ids = {3, 7, 1, 2, 250, 0};
  std::vector<float> weights = {0.75f, 0.25f, 0.5f, 0.5f, 1.0f, 0.0f};
  std::vector<uint8_t> is_padding = {0, 1, 0};

  std::vector<uint8_t> x_q(T * H, 0xFF);
  std::vector<int32_t> x_sf(T * 1, -1);  // MXFP8: H / (4 * 32) = 1 word per token
  std::vector<int64_t> idx(T * K, 99);
  std::vector<float> w(T * K, 99.0f);

  using megamoe::DType;
  using megamoe::TensorRef;
  megamoe::StageArgs a;
  a.hidden_states = TensorRef(hidden.data(), DType::kBFloat16, {T, H});
  a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
  a.topk_weights = TensorRef(weights.data(), DType::kFloat32, {T, K});
  a.is_padding = TensorRef(is_padding.data(), DType::kUInt8, {T});
  a.x_q = TensorRef(x_q.data(), DType::kFloat8E4M3, {T, H});
  a.x_sf = TensorRef(x_sf.data(), DType::kInt32, {T, 1});
  a.topk_idx_out = TensorRef(idx.data(), DType::kInt64, {T, K});
  a.topk_weights_out = TensorRef(w.data(), DType::kFloat32, {T, K});
  megamoe::prepare_inputs(a);

  // 1.0: s = 1/448 -> e = 119 -> scale 2^-8 -> 1.0 * 256 = 256 = fp8 0x78.
  // 0.0: amax floor 1e-4 -> e = 105, bytes 0x00.  -448: s = 1 -> e = 127, byte 0xFE.
  check(x_q[0] == 0x78 && x_q[H - 1] == 0x78, "token 0 values");
  check(x_q[H] == 0x00, "token 1 values");
  check(x_q[2 * H] == 0xFE, "token 2 values");
  check(static_cast<uint32_t>(x_sf[0]) == 0x77777777u, "token 0 scales");
  check(static_cast<uint32_t>(x_sf[1]) == 0x69696969u, "token 1 scales");
  check(static_cast<uint32_t>(x_sf[2]) == 0x7F7F7F7Fu, "token 2 scales");
  check(idx[0] == 3 && idx[1] == 7 && idx[2] == -1 && idx[3] == -1 && idx[4] == 250 && idx[5] == 0,
        "topk_idx_out");
  check(w[0] == 0.75f && w[1] == 0.25f && w[2] == 0.0f && w[3] == 0.0f && w[4] == 1.0f,
        "topk_weights_out");

  // A rejected call throws megamoe::Error with kInvalidArgument.
  a.hidden_quant.group_k = 48;
  bool threw = false;
  try {
    megamoe::prepare_inputs(a);
  } catch (const megamoe::Error& e) {
    threw = e.code() == megamoe::ErrorCode::kInvalidArgument;
  }
  check(threw, "invalid scheme rejected");

  check(std::string(megamoe::version()) == std::to_string(MEGAMOE_VERSION_MAJOR) + "." +
                                               std::to_string(MEGAMOE_VERSION_MINOR) + "." +
                                               std::to_string(MEGAMOE_VERSION_PATCH),
        "version string");

  if (failures == 0) std::printf("megamoe %s downstream: OK\n", megamoe::version());
  return failures == 0 ? 0 : 1;
}
