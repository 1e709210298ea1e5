// reference_none.cpp: reference_check.h in a build without the reference check
// (MEGAMOE_CLI_REFERENCE off): the CLI reports that it is not compiled in.
#include "reference_check.h"

namespace megamoe_cli {

bool reference_compiled() { return false; }

std::optional<RefChecks> check_reference(StageInputs&, const std::vector<float>&, const StageOutputs&,
                                         const RouterRun*, const NormRun*) {
  return std::nullopt;
}

}  // namespace megamoe_cli
