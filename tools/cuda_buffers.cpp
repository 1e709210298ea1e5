// cuda_buffers.cpp: device buffers, copies and event timing for `megamoe-stage --device cuda`.
#include "cuda_buffers.h"

#include <cuda_runtime.h>

#include <memory>
#include <optional>

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
    Checked n = megamoe::dtype_size(h->dtype);
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

namespace {

/// One warmup call of @p call(stream), then @p iters calls, each between a pair of events,
/// on a fresh non-blocking stream; the time of each in seconds.
template <typename F>
std::vector<double> time_calls(int iters, F&& call) {
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

  call(stream);  // warmup
  for (size_t i = 0; i < n; ++i) {
    check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
    call(stream);
    check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (after the timed calls)");
  std::vector<double> times(n);
  for (size_t i = 0; i < n; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    times[i] = ms * 1e-3;
  }
  return times;
}

/// Device copies of host tensors; copy_back() returns their bytes to the host views.
struct Copies {
  int dev;
  std::vector<std::unique_ptr<DeviceCopy>> bufs;
  void move(megamoe::TensorRef& hr, megamoe::TensorRef& dr) {
    bufs.push_back(std::make_unique<DeviceCopy>(&hr, dev));
    dr = bufs.back()->dev;
  }
  void move(std::optional<megamoe::TensorRef>& hr, std::optional<megamoe::TensorRef>& dr) {
    if (hr) move(*hr, *dr);
  }
  void copy_back() const {
    for (const auto& b : bufs) {
      if (b->bytes == 0) continue;
      check(cudaMemcpy(b->host->data, b->ptr, b->bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
    }
  }
};

/// The staging tensors of @p h, moved to the device in @p d (the top-k inputs only when
/// @p topk_inputs, hidden_states only when @p hidden: the norm form leaves it empty).
void move_stage(Copies& c, megamoe::StageArgs& h, megamoe::StageArgs& d, bool topk_inputs, bool hidden = true) {
  if (hidden) c.move(h.hidden_states, d.hidden_states);
  if (topk_inputs) {
    c.move(h.topk_weights, d.topk_weights);
    c.move(h.topk_ids, d.topk_ids);
  }
  c.move(h.x_q, d.x_q);
  c.move(h.x_sf, d.x_sf);
  c.move(h.topk_idx_out, d.topk_idx_out);
  c.move(h.topk_weights_out, d.topk_weights_out);
  c.move(h.is_padding, d.is_padding);
  c.move(h.shared_x_sf, d.shared_x_sf);
  c.move(h.global_scale, d.global_scale);  // nvfp4-static's [1] input (read on the device)
  c.move(h.x_scales, d.x_scales);          // nvfp4-per-token's output
}

}  // namespace

std::vector<double> run_cuda(const megamoe::StageArgs& host, int dev, int iters) {
  check(cudaSetDevice(dev), "cudaSetDevice");
  megamoe::StageArgs h = host, d = host;
  Copies c{dev, {}};
  move_stage(c, h, d, true);
  const std::vector<double> times = time_calls(iters, [&](cudaStream_t s) { megamoe::prepare_inputs(d, s); });
  c.copy_back();
  return times;
}

RouterTimes run_cuda_router(const megamoe::RouterArgs& router, const megamoe::StageArgs& stage, int dev, int iters) {
  check(cudaSetDevice(dev), "cudaSetDevice");
  megamoe::StageArgs h = stage, d = stage;
  megamoe::RouterArgs hr = router, dr = router;
  Copies c{dev, {}};
  move_stage(c, h, d, false);
  c.move(hr.router_logits, dr.router_logits);
  c.move(hr.e_score_correction_bias, dr.e_score_correction_bias);
  c.move(hr.topk_ids, dr.topk_ids);
  c.move(hr.topk_weights, dr.topk_weights);
  RouterTimes t;
  t.fused = time_calls(iters, [&](cudaStream_t s) { megamoe::route_and_stage(dr, d, s); });
  megamoe::RouterArgs alone = dr;  // route() takes the padding mask from RouterArgs
  alone.is_padding = d.is_padding;
  t.route = time_calls(iters, [&](cudaStream_t s) { megamoe::route(alone, s); });
  c.copy_back();
  return t;
}

std::vector<double> run_cuda_norm(const megamoe::RmsNormArgs& norm, const megamoe::StageArgs& stage, int dev,
                                  int iters) {
  check(cudaSetDevice(dev), "cudaSetDevice");
  megamoe::StageArgs h = stage, d = stage;
  megamoe::RmsNormArgs hn = norm, dn = norm;
  Copies c{dev, {}};
  move_stage(c, h, d, true, false);
  c.move(hn.x, dn.x);
  c.move(hn.residual, dn.residual);
  c.move(hn.weight, dn.weight);
  c.move(hn.y, dn.y);
  c.move(hn.residual_out, dn.residual_out);
  const std::vector<double> times =
      time_calls(iters, [&](cudaStream_t s) { megamoe::rmsnorm_and_stage(dn, d, s); });
  c.copy_back();
  return times;
}

}  // namespace megamoe_cli
