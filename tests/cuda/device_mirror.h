// device_mirror.h: the router and gate GPU tests' device copies of a call's host tensors
// (tests/cpp/router_cases.h), and the comparison of a call on them with the CPU backend's
// result in the host tensors: every byte of every buffer, after an eager call and after
// CUDA-graph replays.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"
#include "router_cases.h"

namespace router_cases {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// Device copies of a call's host tensors; TensorRefs are mapped by address. @p skew: bytes
/// between each allocation's start and its copy (1: every tensor of wider elements off its
/// element size).
class Mirror {
 public:
  explicit Mirror(std::vector<Tensor*> ts, size_t skew = 0) {
    for (Tensor* t : ts) {
      if (t->mem.empty()) continue;
      void* d = nullptr;
      if (cudaMalloc(&d, t->mem.size() + skew) != cudaSuccess) throw std::runtime_error("cudaMalloc");
      entries_.push_back({t, static_cast<uint8_t*>(d) + skew, t->mem, d});
    }
  }
  ~Mirror() {
    for (auto& e : entries_) cudaFree(e.alloc);
  }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  /// Every device buffer back to the host bytes it had when the mirror was made.
  /// (A pageable host-to-device cudaMemcpy may return before its DMA has landed, and the
  /// calls run on a non-blocking stream, which does not wait for it: the device sync does.)
  void reset() const {
    for (const auto& e : entries_) cudaMemcpy(e.dev, e.initial.data(), e.initial.size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  /// @p r with its data pointing into the device copy of its buffer (an empty TensorRef
  /// stays empty).
  TensorRef map(TensorRef r) const {
    if (r.data == nullptr && r.ndim == 0) return r;
    for (const auto& e : entries_) {
      const auto* base = e.t->mem.data();
      const auto* p = static_cast<const uint8_t*>(r.data);
      if (p >= base && p < base + e.t->mem.size()) {
        r.data = static_cast<uint8_t*>(e.dev) + (p - base);
        r.device = megamoe::Device::cuda(0);
        return r;
      }
    }
    ADD_FAILURE() << "tensor outside every mirrored buffer";
    return r;
  }
  std::optional<TensorRef> map(const std::optional<TensorRef>& r) const {
    return r ? std::optional<TensorRef>(map(*r)) : std::nullopt;
  }
  RouterArgs map(RouterArgs a) const {
    a.router_logits = map(a.router_logits);
    a.topk_ids = map(a.topk_ids);
    a.topk_weights = map(a.topk_weights);
    for (auto* o : {&a.e_score_correction_bias, &a.tid2eid, &a.input_ids, &a.logical_to_physical_map,
                    &a.logical_replica_count, &a.expert_load_view, &a.record_enabled, &a.nonfinite_count, &a.is_padding}) {
      *o = map(*o);
    }
    return a;
  }
  StageArgs map(StageArgs a) const {
    for (TensorRef* t : {&a.hidden_states, &a.x_q, &a.x_sf, &a.topk_idx_out, &a.topk_weights_out}) *t = map(*t);
    for (auto* o : {&a.is_padding, &a.shared_x_sf, &a.global_scale, &a.x_scales, &a.nonfinite_count}) *o = map(*o);
    return a;
  }
  megamoe::GateArgs map(megamoe::GateArgs a) const {
    a.y = map(a.y);
    a.weight = map(a.weight);
    a.logits_out = map(a.logits_out);
    return a;
  }
  /// Every device buffer equals its host tensor's bytes (the CPU backend's result).
  void expect_equal_to_host(const std::string& what) const {
    for (const auto& e : entries_) {
      std::vector<uint8_t> got(e.t->mem.size());
      ASSERT_EQ(cudaMemcpy(got.data(), e.dev, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(static_cast<int>(got[i]), static_cast<int>(e.t->mem[i]))
            << what << ": byte " << i << " of a " << got.size() << "-byte buffer (dtype "
            << megamoe::dtype_name(e.t->ref.dtype) << ")";
      }
    }
  }

 private:
  struct Entry {
    Tensor* t;
    void* dev;
    std::vector<uint8_t> initial;
    void* alloc;
  };
  std::vector<Entry> entries_;
};

inline std::vector<Tensor*> tensors_of(Built& b) {
  return {&b.logits, &b.bias, &b.ids, &b.weights, &b.tid2eid, &b.input_ids, &b.l2p, &b.replicas,
          &b.load, &b.record, &b.nonfinite, &b.pad};
}
inline std::vector<Tensor*> tensors_of(StageBufs& s) {
  return {&s.hs, &s.xq, &s.xsf, &s.idx, &s.w, &s.shared, &s.xscales, &s.gs, &s.nonfinite, &s.pad};
}

/// @p call (on a stream) against the host bytes of @p m: eagerly, then captured into a
/// graph and replayed twice (each replay from the initial bytes).
inline void run_and_compare(const Mirror& m, const std::function<void(cudaStream_t)>& call) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  m.reset();
  call(stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  m.expect_equal_to_host("eager");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  call(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    m.reset();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    m.expect_equal_to_host("graph replay " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace router_cases
