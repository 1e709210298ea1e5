// route_fused.cuh: the fused router + staging kernel's dispatch from a plan to one of its
// 480 variants (60 of them decode variants). Included by the three launch units that
// instantiate it, one per input dtype (route_fused_bf16.cu, route_fused_f16.cu,
// route_fused_f32.cu), so that they compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/route_fused.cuh"
#include "cuda/launch/launch_util.cuh"
#include "cuda/policy/plan.h"
#include "formats/visit.h"
#include "megamoe/error.h"

namespace megamoe {
namespace cuda {

/// The fused kernel of plan @p pl (a fast plan with pl.grid = its quantizing blocks plus
/// rp.blocks router blocks) for hidden states of input kind bf16 / f16 / f32.
/// @p decode: use the decode variant where the plan has one (kFusedDecodeBlocksPerSm).
void route_fused_bf16(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                      bool decode, cudaStream_t stream);
void route_fused_f16(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                     bool decode, cudaStream_t stream);
void route_fused_f32(const Plan& pl, const StageArgs& a, const detail::Problem& p, const RouterParams& rp,
                     bool decode, cudaStream_t stream);

namespace {

/// Calls v.template go<In, F, G, Mode, Shape>() for the fast-kernel variant a plan names.
template <class V, int In, core::Format F, int G, Mode M>
void visit_shape(const Plan& pl, const V& v) {
  if constexpr (M == Mode::kIdx64Stream) {
    v.template go<In, F, G, M, Shape::kLoop>();
  } else if (pl.shape == Shape::kSplitTopk) {
    v.template go<In, F, G, M, Shape::kSplitTopk>();
  } else if (pl.shape == Shape::kTile) {
    v.template go<In, F, G, M, Shape::kTile>();
  } else {
    v.template go<In, F, G, M, Shape::kLoop>();
  }
}

template <class V, int In, core::Format F, int G>
void visit_mode(const Plan& pl, const V& v) {
  if (pl.index == IndexWidth::k64) return visit_shape<V, In, F, G, Mode::kIdx64Stream>(pl, v);
  if (pl.store == StorePolicy::kEvictFirst) return visit_shape<V, In, F, G, Mode::kIdx32Stream>(pl, v);
  visit_shape<V, In, F, G, Mode::kIdx32>(pl, v);
}

template <class V, int In>
void visit_fused_format(const Plan& pl, const V& v) {
  const bool launched = core::visit_fast_group(pl.fmt, pl.G, [&](auto f, auto g) {
    visit_mode<V, In, decltype(f)::value, decltype(g)::value>(pl, v);
  });
  if (!launched) throw Error(ErrorCode::kInternal, "megamoe: route_and_stage: no fused kernel for " + to_string(pl));
}

/// Launches the fused kernel of one variant; @p decode: the decode variant where it exists
/// (route(): fused_decode_variant, plan.h).
struct FusedLaunch {
  const Plan& pl;
  const StageArgs& a;
  const detail::Problem& p;
  const RouterParams& r;
  bool decode;
  cudaStream_t stream;
  template <int In, core::Format F, int G, Mode M, Shape S>
  void go() const {
    if constexpr (kHasDecodeVariant<M, S>) {
      if (decode) return go_variant<In, F, G, M, S, true>();
    }
    go_variant<In, F, G, M, S, false>();
  }
  template <int In, core::Format F, int G, Mode M, Shape S, bool kDecode>
  void go_variant() const {
    const FusedParams<IdxOf<M>> fp{make_params<IdxOf<M>>(a, p, pl), r};
    // The staging kernel's variants (launch_fast.cuh): the counter, a floor read from the
    // parameters, or the default floor compiled in.
    if (pl.count_nonfinite) {
      return launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kCount, kDecode>, fp, pl, stream);
    }
    if constexpr (kUsesFloor<F>) {
      if (p.floor != core::kAmaxFloor) {
        return launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kFloor, kDecode>, fp, pl, stream);
      }
    }
    launch_kernel(route_stage_kernel<In, F, G, M, S, Extras::kNone, kDecode>, fp, pl, stream);
  }
};

}  // namespace
}  // namespace cuda
}  // namespace megamoe
