// Stage one MoE layer's inputs on the CPU backend: buffers sized by the public shape rule,
// MXFP8 activations, top-k repack with a padded token. (For CUDA, allocate the same
// shapes with cudaMalloc, tag the TensorRefs with Device::cuda(i) and pass a stream.)
#include <megamoe/megamoe.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  using namespace megamoe;
  const int64_t T = 4, H = 512, K = 2;
  const QuantScheme scheme = QuantScheme::mxfp8();
  const OutputShapes out = output_shapes(T, H, K, scheme);

  std::vector<float> hidden(T * H);
  for (int64_t i = 0; i < T * H; ++i) hidden[i] = std::sin(0.01f * static_cast<float>(i)) * 8.0f;
  std::vector<float> weights = {0.7f, 0.3f, 0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f};
  std::vector<int32_t> ids = {3, 17, 5, 2, 9, 9, 0, 255};
  std::vector<uint8_t> padding = {0, 0, 1, 0};  // token 2 is padding

  std::vector<uint8_t> x_q(out.x_q.numel());
  std::vector<int32_t> x_sf(out.x_sf.numel());
  std::vector<int64_t> idx(out.topk_idx_out.numel());
  std::vector<float> w_out(out.topk_weights_out.numel());

  StageArgs a;
  a.hidden_states = TensorRef(hidden.data(), DType::kFloat32, {T, H});
  a.topk_weights = TensorRef(weights.data(), DType::kFloat32, {T, K});
  a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
  a.is_padding = TensorRef(padding.data(), DType::kUInt8, {T});
  a.x_q = TensorRef(x_q.data(), out.x_q.dtype, {out.x_q.shape[0], out.x_q.shape[1]});
  a.x_sf = TensorRef(x_sf.data(), out.x_sf.dtype, {out.x_sf.shape[0], out.x_sf.shape[1]});
  a.topk_idx_out = TensorRef(idx.data(), DType::kInt64, {T, K});
  a.topk_weights_out = TensorRef(w_out.data(), DType::kFloat32, {T, K});
  a.hidden_quant = scheme;

  const Status s = try_prepare_inputs(a);  // or prepare_inputs(a), which throws megamoe::Error
  if (!s) {
    std::fprintf(stderr, "megamoe error (%s): %s\n", to_string(s.code), s.message.c_str());
    return 1;
  }
  std::printf("megamoe %s: staged %lld tokens (%s), x_sf[0][0] = 0x%08x, ids of token 2: %lld %lld\n",
              version(), static_cast<long long>(T), scheme_name(scheme).c_str(), static_cast<unsigned>(x_sf[0]),
              static_cast<long long>(idx[4]), static_cast<long long>(idx[5]));
  return idx[4] == -1 && idx[5] == -1 && w_out[4] == 0.0f ? 0 : 1;
}
