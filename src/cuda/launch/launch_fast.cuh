// launch_fast.cuh: the fast kernel's dispatch from a plan to one instantiation (input
// dtype x format x G x index mode x shape x extras: floor, counter). Included by the launch units that
// instantiate it for their formats (launch_fast_ue8m0.cu, launch_fast_fp32_nvfp4.cu).
#pragma once

#include "cuda/launch/launch_util.cuh"
#include "cuda/kernels/quantize_fast.cuh"
#include "formats/visit.h"

namespace megamoe {
namespace cuda {
namespace {

template <int In, core::Format F, int G, Mode M, Shape S>
void fast_go(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const ParamsT<IdxOf<M>> prm = make_params<IdxOf<M>>(a, p, plan);
  if (plan.count_nonfinite) return launch_kernel(stage_fast_kernel<In, F, G, M, S, Extras::kCount>, prm, plan, stream);
  // The default floor compiled in: reading it costs the decode path a dependent constant
  // load (measured +2-3% at T = 1).
  if constexpr (kUsesFloor<F>) {
    if (p.floor != core::kAmaxFloor) return launch_kernel(stage_fast_kernel<In, F, G, M, S, Extras::kFloor>, prm, plan, stream);
  }
  launch_kernel(stage_fast_kernel<In, F, G, M, S, Extras::kNone>, prm, plan, stream);
}

template <int In, core::Format F, int G, Mode M>
void fast_by_shape(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  switch (plan.shape) {
    case Shape::kSplitTopk: return fast_go<In, F, G, M, Shape::kSplitTopk>(plan, a, p, stream);
    case Shape::kTile: return fast_go<In, F, G, M, Shape::kTile>(plan, a, p, stream);
    case Shape::kSplitHalf:
      if constexpr (In != kInF32 && core::values_per_byte(F) == 2) {
        return fast_go<In, F, G, M, Shape::kSplitHalf>(plan, a, p, stream);
      }
      throw Error(ErrorCode::kInternal, "megamoe: no half-chunk kernel for " + to_string(plan));  // (check_plan)
    default: return fast_go<In, F, G, M, Shape::kLoop>(plan, a, p, stream);
  }
}

template <int In, core::Format F, int G>
void fast_by_mode(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  if (plan.index == IndexWidth::k64) return fast_go<In, F, G, Mode::kIdx64Stream, Shape::kLoop>(plan, a, p, stream);
  if (plan.store == StorePolicy::kEvictFirst) return fast_by_shape<In, F, G, Mode::kIdx32Stream>(plan, a, p, stream);
  fast_by_shape<In, F, G, Mode::kIdx32>(plan, a, p, stream);
}

template <core::Format F, int G>
void fast_by_input(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  switch (in_kind(plan.in)) {
    case kInBF16: return fast_by_mode<kInBF16, F, G>(plan, a, p, stream);
    case kInF16: return fast_by_mode<kInF16, F, G>(plan, a, p, stream);
    default: return fast_by_mode<kInF32, F, G>(plan, a, p, stream);
  }
}

/// The fast kernel of plan.fmt and plan.G (the registry's "fast" column) among the formats
/// of one launch unit: those with UE8M0 scales (@p kUe8m0 true) or the others. Each unit
/// instantiates only its share, so that the two compile in parallel.
template <bool kUe8m0>
void launch_fast_unit(const Plan& plan, const StageArgs& a, const detail::Problem& p, cudaStream_t stream) {
  const bool launched = core::visit_fast_group(plan.fmt, plan.G, [&](auto f, auto g) {
    constexpr core::Format F = decltype(f)::value;
    if constexpr ((core::sf_of(F) == core::Sf::kUE8M0x4) == kUe8m0) {
      fast_by_input<F, decltype(g)::value>(plan, a, p, stream);
    } else {
      throw Error(ErrorCode::kInternal, "megamoe: internal: " + to_string(plan) + " is the other fast launch unit's");
    }
  });
  if (!launched) throw Error(ErrorCode::kInternal, "megamoe: no fast kernel for " + to_string(plan));  // (check_plan)
}

}  // namespace
}  // namespace cuda
}  // namespace megamoe
