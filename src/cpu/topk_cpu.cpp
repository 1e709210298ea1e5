// topk_cpu.cpp: the top-k repack on the host, shared by staging and routing-only calls:
// padding mask, widening, the routed scaling factor, the per-expert scales and the
// full-buffer tail.
#include <cstring>

#include "core/numerics.h"
#include "cpu/stage_cpu.h"

namespace megamoe {
namespace cpu {
namespace {

template <typename T>
T load(const TensorRef& t, int64_t i, int64_t j) {
  T v;
  const int64_t off = i * t.strides[0] + j * t.strides[1];
  std::memcpy(&v, static_cast<const char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
void store(const TensorRef& t, int64_t i, int64_t j, T v) {
  const int64_t off = i * t.strides[0] + j * t.strides[1];
  std::memcpy(static_cast<char*>(t.data) + off * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

template <typename T>
T load1(const TensorRef& t, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(t.data) + i * t.strides[0] * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

float load_weight(const TensorRef& t, int64_t i, int64_t j) {
  switch (t.dtype) {
    case DType::kBFloat16: return core::bf16_to_float(load<uint16_t>(t, i, j));
    case DType::kFloat16: return core::half_to_float(load<uint16_t>(t, i, j));
    default: return load<float>(t, i, j);
  }
}

}  // namespace

void repack_topk(const TopkIO& io, const detail::Problem& p) {
  // K == 0: no element to write, and M (or T) may be any count an empty tensor allows, up
  // to 2^63 - 1 rows: a row loop would never end.
  if (p.K == 0) return;
  for (int64_t t = 0; t < p.M; ++t) {
    // Tail rows (full-buffer mode) and padded tokens: id -1, weight +0.0.
    bool keep = t < p.T;
    if (keep && io.pad != nullptr) keep = static_cast<const uint8_t*>(io.pad->data)[t * io.pad->strides[0]] == 0;
    for (int64_t k = 0; k < p.K; ++k) {
      int64_t id = -1;
      float w = 0.0f;
      if (keep) {
        id = io.ids->dtype == DType::kInt32 ? load<int32_t>(*io.ids, t, k) : load<int64_t>(*io.ids, t, k);
        w = load_weight(*io.w, t, k);
        if (p.has_alpha) w = core::scale_weight(w, p.alpha);
        if (io.expert_scales != nullptr && id >= 0 && id < p.E) {
          w = core::scale_weight(w, load1<float>(*io.expert_scales, id));
        }
      }
      store<int64_t>(*io.idx_out, t, k, id);
      store<float>(*io.w_out, t, k, w);
    }
  }
}

TopkIO topk_io(const StageArgs& a) {
  return {&a.topk_weights, &a.topk_ids, a.is_padding ? &*a.is_padding : nullptr, &a.topk_idx_out,
          &a.topk_weights_out, a.expert_scales ? &*a.expert_scales : nullptr};
}
TopkIO topk_io(const RoutingArgs& a) {
  return {&a.topk_weights, &a.topk_ids, a.is_padding ? &*a.is_padding : nullptr, &a.topk_idx_out,
          &a.topk_weights_out, a.expert_scales ? &*a.expert_scales : nullptr};
}

}  // namespace cpu
}  // namespace megamoe
