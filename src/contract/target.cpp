// target.cpp: a validated staging call's outputs as the device API's StageTarget
// (megamoe/device/target.h): for producers (device::stage_target) and the library's own
// fused kernels, from the one validator's problem.
#include "contract/target.h"

#include "core/numerics.h"
#include "formats/format_list.h"

namespace megamoe {
namespace detail {

device::StageTarget make_stage_target(const StageArgs& a, const Problem& p) {
  device::StageTarget tg;
  tg.T = p.T;
  if (returns_at_once(p.T, a.full_buffer)) return tg;  // nothing validated, nothing to write
  tg.M = p.M;
  tg.H = p.H;
  tg.K = p.K;
  tg.G = core::passthrough(p.fmt) ? 0 : p.G;
  tg.format = static_cast<uint8_t>(p.fmt);
  tg.floor = p.floor;
  tg.full_buffer = p.full_buffer;
  tg.x_q = static_cast<uint8_t*>(a.x_q.data);
  tg.xq_s0 = a.x_q.strides[0];
  tg.xq_s1 = a.x_q.strides[1];
  if (!core::passthrough(p.fmt)) {
    tg.x_sf = a.x_sf.data;
    tg.sf_s0 = a.x_sf.strides[0];
    tg.sf_s1 = a.x_sf.strides[1];
  }
  if (a.shared_x_sf) {
    tg.shared_sf = static_cast<uint32_t*>(a.shared_x_sf->data);
    tg.sh_s0 = a.shared_x_sf->strides[0];
    tg.sh_s1 = a.shared_x_sf->strides[1];
    tg.shared_bm = p.shared_bm;
  }
  if (a.x_scales) {
    tg.x_scales = static_cast<float*>(a.x_scales->data);
    tg.xs_s0 = a.x_scales->strides[0];
  }
  if (a.global_scale) tg.gscale = static_cast<const float*>(a.global_scale->data);
  if (a.nonfinite_count) tg.nonfinite = static_cast<unsigned long long*>(a.nonfinite_count->data);
  if (p.T > 0) {  // a full-buffer call without tokens has no top-k inputs to read
    tg.ids = a.topk_ids.data;
    tg.ids_s0 = a.topk_ids.strides[0];
    tg.ids_s1 = a.topk_ids.strides[1];
    tg.w = a.topk_weights.data;
    tg.w_s0 = a.topk_weights.strides[0];
    tg.w_s1 = a.topk_weights.strides[1];
    if (a.is_padding) {
      tg.pad = static_cast<const uint8_t*>(a.is_padding->data);
      tg.pad_s0 = a.is_padding->strides[0];
    }
    tg.flags = (a.topk_ids.dtype == DType::kInt64 ? device::kFlagIdsI64 : 0u) |
               (a.topk_weights.dtype == DType::kBFloat16 ? device::kFlagWBF16 : 0u) |
               (a.topk_weights.dtype == DType::kFloat16 ? device::kFlagWF16 : 0u);
  }
  tg.idx_out = static_cast<int64_t*>(a.topk_idx_out.data);
  tg.io_s0 = a.topk_idx_out.strides[0];
  tg.io_s1 = a.topk_idx_out.strides[1];
  tg.w_out = static_cast<float*>(a.topk_weights_out.data);
  tg.wo_s0 = a.topk_weights_out.strides[0];
  tg.wo_s1 = a.topk_weights_out.strides[1];
  if (p.has_alpha) {
    tg.flags |= device::kFlagAlpha;
    tg.alpha = p.alpha;
  }
  if (p.has_expert_scales) {
    tg.flags |= device::kFlagExpertScales;
    tg.escale = static_cast<const float*>(a.expert_scales->data);
    tg.es_s0 = a.expert_scales->strides[0];
    tg.n_experts = p.E;
  }
  return tg;
}

device::StageTarget stage_target(const StageArgs& a) {
  const Problem p = validate_args(a, /*rows_described=*/true);
  if (returns_at_once(p.T, a.full_buffer)) return make_stage_target(a, p);
  const char* fmt = core::format_name(p.fmt);
  if (a.hidden_states.device.type != Device::Type::kCUDA) {
    throw Error(ErrorCode::kInvalidArgument,
                "megamoe: stage_target: hidden_states: expected a CUDA device (a StageTarget is for device "
                "code), got device " + to_string(a.hidden_states.device));
  }
  if (core::online_scaled(p.fmt)) {
    throw Error(ErrorCode::kUnsupported,
                std::string("megamoe: stage_target: ") + fmt +
                    ": its global scale is a reduction over the whole tensor, which a producer computes itself; "
                    "stage NVFP4 static with that global scale");
  }
  if (p.misaligned) {
    throw Error(ErrorCode::kUnsupported,
                "megamoe: stage_target: a tensor's data pointer is off its element size (the device API's stores "
                "are typed); prepare_inputs accepts such tensors");
  }
  return make_stage_target(a, p);
}

}  // namespace detail
}  // namespace megamoe
