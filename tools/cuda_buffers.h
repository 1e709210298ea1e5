// cuda_buffers.h: the CLI's only contact with the CUDA runtime. Built from cuda_buffers.cpp
// when the build has CUDA (MEGAMOE_CLI_CUDA=1); otherwise inline stand-ins say "no CUDA".
#pragma once

#include <string>
#include <vector>

#include "megamoe/norm.h"
#include "megamoe/router.h"
#include "megamoe/stage.h"
#include "safetensors.h"

namespace megamoe_cli {

#if MEGAMOE_CLI_CUDA
/// Number of usable CUDA devices; 0 (with the reason in @p why) when there are none.
int cuda_device_count(std::string* why);
/// Name of CUDA device @p dev (e.g. "NVIDIA H200").
std::string cuda_device_name(int dev);
/// Copy every tensor of @p host (contiguous CPU tensors, outputs included) to device @p dev,
/// run megamoe::prepare_inputs once as a warmup and then @p iters times on one stream, each
/// timed with a pair of CUDA events, and copy the outputs back into @p host's buffers.
/// Returns the time of each timed call in seconds. Throws CliError on a CUDA failure.
std::vector<double> run_cuda(const megamoe::StageArgs& host, int dev, int iters);
/// Times of --router on the GPU: route_and_stage, and route() alone.
struct RouterTimes {
  std::vector<double> fused;  ///< route_and_stage per call
  std::vector<double> route;  ///< route() per call
};
/// As run_cuda for megamoe::route_and_stage(@p router, @p stage) (the stage's top-k inputs
/// empty), then as many calls of megamoe::route(@p router) alone; the outputs of the last
/// route_and_stage (and routes, which write the same) are copied back.
RouterTimes run_cuda_router(const megamoe::RouterArgs& router, const megamoe::StageArgs& stage, int dev, int iters);
/// As run_cuda for megamoe::rmsnorm_and_stage(@p norm, @p stage) (the stage's hidden_states
/// empty: the normalized rows take their place); y and residual_out come back with the
/// staged outputs.
std::vector<double> run_cuda_norm(const megamoe::RmsNormArgs& norm, const megamoe::StageArgs& stage, int dev,
                                  int iters);
#else
inline int cuda_device_count(std::string* why) {
  if (why != nullptr) *why = "this megamoe-stage was built without CUDA support";
  return 0;
}
inline std::string cuda_device_name(int) { return {}; }
inline std::vector<double> run_cuda(const megamoe::StageArgs&, int, int) {
  throw CliError("this megamoe-stage was built without CUDA support");
}
struct RouterTimes {
  std::vector<double> fused, route;
};
inline RouterTimes run_cuda_router(const megamoe::RouterArgs&, const megamoe::StageArgs&, int, int) {
  throw CliError("this megamoe-stage was built without CUDA support");
}
inline std::vector<double> run_cuda_norm(const megamoe::RmsNormArgs&, const megamoe::StageArgs&, int, int) {
  throw CliError("this megamoe-stage was built without CUDA support");
}
#endif

}  // namespace megamoe_cli
