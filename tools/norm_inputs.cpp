// norm_inputs.cpp: the norm form's weight and residual (see norm_inputs.h).
#include "norm_inputs.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

namespace megamoe_cli {
namespace {

bool is_file(const std::string& p) {
  std::error_code ec;
  return !p.empty() && std::filesystem::exists(p, ec) && !ec;
}

/// What a spec names, before its tensor is checked.
struct Resolved {
  Tensor tensor;
  std::string source;  // for the report and the messages
};

/// The tensor of safetensors file @p file: @p name, or without a name the file's only
/// tensor or the one named @p saved_name.
Resolved from_file(const std::string& flag, const std::string& file, const std::string& name, const char* saved_name) {
  std::map<std::string, Tensor> m = read_safetensors(file);
  std::string pick = name;
  if (pick.empty()) {
    if (m.size() == 1) {
      pick = m.begin()->first;
    } else if (m.count(saved_name) != 0) {
      pick = saved_name;
    } else {
      throw CliError(flag + " " + file + ": the file has " + std::to_string(m.size()) +
                     " tensors and none named '" + saved_name + "'; name one as " + file + ":TENSOR");
    }
  }
  auto it = m.find(pick);
  if (it == m.end()) throw CliError(flag + " " + file + ": no tensor '" + clip(pick) + "' in the file");
  return {std::move(it->second), file + " tensor '" + clip(pick) + "'"};
}

/// Resolve one spec (see load_norm_inputs).
Resolved resolve(const std::string& flag, const std::string& spec, const StageInputs& in,
                 const std::string& input_path, const char* saved_name) {
  if (spec.empty()) throw CliError(flag + ": expected a tensor name, a file or a generated form, got ''");
  if (!input_path.empty()) {
    auto it = in.others.find(spec);
    if (it != in.others.end()) return {it->second, "--input tensor '" + clip(spec) + "'"};
  }
  if (is_file(spec)) return from_file(flag, spec, "", saved_name);
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && colon > 0 && is_file(spec.substr(0, colon))) {
    return from_file(flag, spec.substr(0, colon), spec.substr(colon + 1), saved_name);
  }
  throw CliError(flag + " " + clip(spec) + ": " +
                 (input_path.empty() ? std::string("no such file")
                                     : "neither a tensor of --input " + input_path + " nor a file") +
                 " (expected " + (std::strcmp(saved_name, kSavedWeightName) == 0 ? "ones, " : "") +
                 "random, a tensor of the --input file, FILE or FILE:TENSOR)");
}

}  // namespace

std::string norm_spec_file(const std::string& spec, const StageInputs& in) {
  if (spec.empty() || spec == "ones" || spec == "random" || in.others.count(spec) != 0) return {};
  if (is_file(spec)) return spec;
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && colon > 0 && is_file(spec.substr(0, colon))) return spec.substr(0, colon);
  return {};
}

NormInputs load_norm_inputs(const std::string& weight_spec, const std::string& residual_spec, const StageInputs& in,
                            const std::string& input_path, uint32_t seed) {
  const int64_t T = in.T(), H = in.H();
  if (in.hidden_states.dtype != "BF16") {
    throw CliError("--rmsnorm-weight: the norm form normalizes hidden_states as its bf16 rows x; " +
                   (input_path.empty() ? std::string("the input") : input_path) + " has hidden_states " +
                   in.hidden_states.dtype + " (expected BF16)");
  }
  NormInputs n;
  // The weight.
  if (weight_spec == "ones" || weight_spec == "random") {
    n.weight = Tensor("BF16", {H}, "tensor 'rmsnorm_weight'");
    auto* w = reinterpret_cast<uint16_t*>(n.weight.data.data());
    std::mt19937 rng(seed + 2u);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (int64_t j = 0; j < H; ++j) w[j] = weight_spec == "ones" ? float_to_bf16(1.0f) : float_to_bf16(u(rng));
    n.weight_source = "generated (" + weight_spec + ")";
  } else {
    Resolved r = resolve("--rmsnorm-weight", weight_spec, in, input_path, kSavedWeightName);
    const std::string where = "--rmsnorm-weight: " + r.source + ": ";
    if (r.tensor.dtype != "BF16" && r.tensor.dtype != "F32") {
      throw CliError(where + "expected dtype BF16 or F32, got " + clip(r.tensor.dtype));
    }
    if (r.tensor.shape.size() != 1 || r.tensor.shape[0] != H) {
      throw CliError(where + "expected shape [" + std::to_string(H) + "] (H of hidden_states), got " +
                     clip(r.tensor.shape_str()));
    }
    n.weight = std::move(r.tensor);
    n.weight_source = r.source;
  }
  if (residual_spec.empty()) return n;
  // The residual.
  if (residual_spec == "random") {
    n.residual = Tensor("BF16", {T, H}, "tensor 'residual'");
    auto* r = reinterpret_cast<uint16_t*>(n.residual->data.data());
    std::mt19937 rng(seed + 3u);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0, e = n.residual->numel(); i < e; ++i) r[i] = float_to_bf16(normal(rng) * 17.0f);
    n.residual_source = "generated (random)";
  } else {
    Resolved r = resolve("--residual", residual_spec, in, input_path, kSavedResidualName);
    const std::string where = "--residual: " + r.source + ": ";
    if (r.tensor.dtype != "BF16") throw CliError(where + "expected dtype BF16, got " + clip(r.tensor.dtype));
    if (r.tensor.shape != in.hidden_states.shape) {
      throw CliError(where + "expected shape " + in.hidden_states.shape_str() + " (that of hidden_states), got " +
                     clip(r.tensor.shape_str()));
    }
    n.residual = std::move(r.tensor);
    n.residual_source = r.source;
  }
  return n;
}

}  // namespace megamoe_cli
