// api.cpp: prepare_inputs validates once, then dispatches on the tensors' device.
#include "cpu/stage_cpu.h"
#include "megamoe/error.h"
#include "megamoe/stage.h"
#include "validate.h"

namespace megamoe {

#if MEGAMOE_WITH_CUDA
namespace cuda {
void prepare_inputs(const StageArgs& args, const detail::Problem& p, Stream stream);
}
bool has_cuda_backend() noexcept { return true; }
#else
bool has_cuda_backend() noexcept { return false; }
#endif

void prepare_inputs(const StageArgs& args, Stream stream) {
  const detail::Problem p = detail::validate_args(args);
  if (p.T == 0) return;
  if (args.hidden_states.device.type == Device::Type::kCPU) {
    cpu::prepare_inputs(args, p);
    return;
  }
#if MEGAMOE_WITH_CUDA
  cuda::prepare_inputs(args, p, stream);
#else
  (void)stream;
  throw Error(ErrorCode::kUnsupported,
              "megamoe: hidden_states: expected a CPU tensor (this build has no CUDA backend), "
              "got device " + to_string(args.hidden_states.device));
#endif
}

}  // namespace megamoe
