// cuda_buffers.cpp: device buffers, copies and event timing for `megamoe-stage --device cuda`.
#include "cuda_buffers.h"

#include <cuda_runtime.h>

#include <memory>

namespace megamoe_cli {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CliError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

/// One device copy of a contiguous host tensor; frees itself.
struct DeviceCopy {
  megamoe::TensorRef* host;  // the host view (its data gets the results back)
  megamoe::TensorRef dev;    // same shape/dtype on the device
  size_t bytes = 0;
  void* ptr = nullptr;
  DeviceCopy(megamoe::TensorRef* h, int device) : host(h), dev(*h) {
    if (!h->is_contiguous()) throw CliError("internal: run_cuda needs contiguous host tensors");
    megamoe::core::Checked n = megamoe::dtype_size(h->dtype);
    for (int i = 0; i < h->ndim; ++i) n = n * h->shape[i];
    bytes = static_cast<size_t>(checked_value(n, "the byte count of a device buffer"));
    check(cudaMalloc(&ptr, bytes > 0 ? bytes : 1), "cudaMalloc");
    if (bytes > 0) {  // an empty host tensor's data may be null
      check(cudaMemcpy(ptr, h->data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
    }
    dev.data = ptr;
    dev.device = megamoe::Device::cuda(device);
  }
  ~DeviceCopy() { cudaFree(ptr); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // reset the runtime's last-error state
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "no CUDA device is present";
  return n;
}

std::string cuda_device_name(int dev) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  return p.name;
}

std::vector<double> run_cuda(const megamoe::StageArgs& host, int dev, int iters) {
  check(cudaSetDevice(dev), "cudaSetDevice");
  megamoe::StageArgs h = host, d = host;
  std::vector<std::unique_ptr<DeviceCopy>> bufs;
  auto move = [&](megamoe::TensorRef& hr, megamoe::TensorRef& dr) {
    bufs.push_back(std::make_unique<DeviceCopy>(&hr, dev));
    dr = bufs.back()->dev;
  };
  move(h.hidden_states, d.hidden_states);
  move(h.topk_weights, d.topk_weights);
  move(h.topk_ids, d.topk_ids);
  move(h.x_q, d.x_q);
  move(h.x_sf, d.x_sf);
  move(h.topk_idx_out, d.topk_idx_out);
  move(h.topk_weights_out, d.topk_weights_out);
  if (h.is_padding) move(*h.is_padding, *d.is_padding);
  if (h.shared_x_sf) move(*h.shared_x_sf, *d.shared_x_sf);
  if (h.global_scale) move(*h.global_scale, *d.global_scale);  // nvfp4-static's [1] input (read on the device)
  if (h.x_scales) move(*h.x_scales, *d.x_scales);              // nvfp4-per-token's output

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(
      stream, [](cudaStream_t s) { cudaStreamDestroy(s); });
  if (iters <= 0) throw CliError("internal: run_cuda needs iters > 0, got " + std::to_string(iters));
  const auto n = static_cast<size_t>(iters);
  std::vector<cudaEvent_t> ev(2 * n, nullptr);
  struct Events {
    std::vector<cudaEvent_t>& v;
    ~Events() {
      for (cudaEvent_t e : v) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  } ev_guard{ev};
  for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");

  megamoe::prepare_inputs(d, stream);  // warmup
  for (size_t i = 0; i < n; ++i) {
    check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
    megamoe::prepare_inputs(d, stream);
    check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (after prepare_inputs)");
  std::vector<double> times(n);
  for (size_t i = 0; i < n; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    times[i] = ms * 1e-3;
  }
  for (auto& b : bufs) {
    if (b->bytes == 0) continue;
    check(cudaMemcpy(b->host->data, b->ptr, b->bytes, cudaMemcpyDeviceToHost),
          "cudaMemcpy (device to host)");
  }
  return times;
}

}  // namespace megamoe_cli
