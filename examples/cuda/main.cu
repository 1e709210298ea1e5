// main.cu: the example producer (producer.cuh) staging 4 tokens of hidden size 256 as
// MXFP8, then the same rows through prepare_inputs: the outputs are compared byte for byte.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "megamoe/megamoe.h"
#include "producer.cuh"

int main() {
  using megamoe::DType;
  using megamoe::TensorRef;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  constexpr int64_t T = 4, H = 256, K = 2;
  const float scale = 0.75f;
  std::vector<uint16_t> x(T * H), y(T * H);
  for (int64_t i = 0; i < T * H; ++i) {
    const float f = static_cast<float>(i % 37) - 18.0f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x[i] = static_cast<uint16_t>(u >> 16);
    // y = bf16(x * scale), rounded to nearest even (here exact: integers times 0.75).
    const float p = f * scale;
    std::memcpy(&u, &p, 4);
    y[i] = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> w = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f, 0.125f, 0.875f};
  const megamoe::OutputShapes o = megamoe::output_shapes(T, H, K, megamoe::QuantScheme::mxfp8());
  void *dx, *dy, *dids, *dw, *out[2][4];
  cudaMalloc(&dx, T * H * 2);
  cudaMalloc(&dy, T * H * 2);
  cudaMalloc(&dids, T * K * 4);
  cudaMalloc(&dw, T * K * 4);
  cudaMemcpy(dx, x.data(), T * H * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), T * H * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dids, ids.data(), T * K * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, w.data(), T * K * 4, cudaMemcpyHostToDevice);
  const size_t bytes[4] = {static_cast<size_t>(T * H), static_cast<size_t>(T * o.x_sf.shape[1] * 4),
                           static_cast<size_t>(T * K * 8), static_cast<size_t>(T * K * 4)};
  megamoe::StageArgs a[2];
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) {
      cudaMalloc(&out[r][i], bytes[i]);
      cudaMemset(out[r][i], 0xA5, bytes[i]);
    }
    const megamoe::Device d = megamoe::Device::cuda(0);
    a[r].hidden_states = TensorRef(r == 0 ? nullptr : dy, DType::kBFloat16, {T, H}, d);
    a[r].topk_ids = TensorRef(dids, DType::kInt32, {T, K}, d);
    a[r].topk_weights = TensorRef(dw, DType::kFloat32, {T, K}, d);
    a[r].x_q = TensorRef(out[r][0], o.x_q.dtype, {T, H}, d);
    a[r].x_sf = TensorRef(out[r][1], o.x_sf.dtype, {T, o.x_sf.shape[1]}, d);
    a[r].topk_idx_out = TensorRef(out[r][2], DType::kInt64, {T, K}, d);
    a[r].topk_weights_out = TensorRef(out[r][3], DType::kFloat32, {T, K}, d);
  }
  try {
    // The producer: its rows are described (no memory), its target checked once.
    const megamoe::device::StageTarget tg = megamoe::device::stage_target(a[0]);
    const producer_example::Rows rows{static_cast<const uint16_t*>(dx), H, 1, scale};
    if (producer_example::launch_scale_and_stage(rows, tg, 64, nullptr) != cudaSuccess) return 1;
    megamoe::prepare_inputs(a[1]);  // the same rows, written and staged
  } catch (const megamoe::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  cudaDeviceSynchronize();
  bool same = true;
  for (int i = 0; i < 4; ++i) {
    std::vector<uint8_t> p(bytes[i]), q(bytes[i]);
    cudaMemcpy(p.data(), out[0][i], bytes[i], cudaMemcpyDeviceToHost);
    cudaMemcpy(q.data(), out[1][i], bytes[i], cudaMemcpyDeviceToHost);
    same = same && p == q;
  }
  std::printf("producer %s prepare_inputs\n", same ? "==" : "!=");
  return same ? 0 : 1;
}
