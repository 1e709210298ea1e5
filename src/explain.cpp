// explain.cpp: megamoe::explain (include/megamoe/plan.h). Backend-independent: the CUDA
// part comes from the CUDA backend's plan (src/cuda/policy/plan.h) when the build has one.
#include <cstdint>
#include <new>
#include <string>

#include "megamoe/error.h"
#include "megamoe/plan.h"
#include "megamoe/quant.h"
#include "contract/validate.h"

namespace megamoe {

#if MEGAMOE_WITH_CUDA
namespace cuda {
std::string explain_plan(const StageArgs& a, const detail::Problem& p);
}
#endif

namespace {

std::string describe(const StageArgs& args) {
  const detail::Problem p = detail::validate_args(args);
  const std::string sizes = "T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " K=" + std::to_string(p.K);
  if (args.hidden_states.device.type == Device::Type::kCPU) {
    if (p.T == 0) {
      return detail::has_work(p) ? "cpu backend: the top-k repack fills the full-buffer tail (T == 0)"
                                 : "cpu backend: nothing to do (T == 0)";
    }
    return "cpu backend: " + scheme_name(p.scheme) + " " + sizes + " in=" + dtype_name(args.hidden_states.dtype) +
           ": strided loops over token rows (worker threads for large problems)" +
           (p.has_nonfinite ? ", non-finite count" : "");
  }
#if MEGAMOE_WITH_CUDA
  if (p.misaligned) {
    // The call runs on dense copies of the tensors off their element size, at 256-byte
    // aligned scratch (src/cuda/launch/aligned.cuh): the plan of those (the address stands in for
    // the scratch; nothing is read from it).
    StageArgs b = args;
    const int moved = detail::move_misaligned_to_dense(
        detail::named_tensors(b), [](const detail::NamedTensor&) { return reinterpret_cast<void*>(uintptr_t{1} << 40); });
    return cuda::explain_plan(b, p) + " (" + scheme_name(p.scheme) + " " + sizes + "), on dense copies of " +
           std::to_string(moved) + " tensor(s) off their element size: gathered before, outputs scattered after";
  }
  return cuda::explain_plan(args, p) + " (" + scheme_name(p.scheme) + " " + sizes + ")";
#else
  if (!detail::has_work(p)) return "nothing to do (T == 0)";
  return "this build has no CUDA backend: hidden_states is on " + to_string(args.hidden_states.device) +
         " and prepare_inputs would throw (kUnsupported)";
#endif
}

}  // namespace

std::string explain(const StageArgs& args) {
  // Nothing but megamoe::Error leaves the API (as in prepare_inputs).
  try {
    return describe(args);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, "megamoe: explain: out of host memory");
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, std::string("megamoe: explain: internal error: ") + e.what());
  } catch (...) {
    throw Error(ErrorCode::kInternal, "megamoe: explain: internal error");
  }
}

}  // namespace megamoe
