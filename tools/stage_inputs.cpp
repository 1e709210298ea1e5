// stage_inputs.cpp: generate, load and save the staging inputs (see stage_inputs.h).
#include "stage_inputs.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <random>

namespace megamoe_cli {
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

namespace {

std::string join(std::initializer_list<const char*> names) {
  std::string s;
  size_t i = 0;
  for (const char* n : names) {
    s += (i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "));
    s += n;
    ++i;
  }
  return s;
}

/// Move tensor @p name out of @p m, checking dtype and rank.
std::optional<Tensor> take(std::map<std::string, Tensor>& m, const std::string& path,
                           const char* name, std::initializer_list<const char*> dtypes,
                           size_t rank, const char* dims, bool required) {
  auto it = m.find(name);
  if (it == m.end()) {
    if (!required) return std::nullopt;
    std::string found;
    for (const auto& kv : m) {
      if (found.size() > kMaxQuotedBytes) {  // a header may name a million tensors
        found += ", ... (" + std::to_string(m.size()) + " tensors)";
        break;
      }
      found += (found.empty() ? "" : ", ") + clip(kv.first);
    }
    throw CliError(path + ": missing tensor '" + name + "' (the file has: " +
                   (found.empty() ? std::string("no tensors") : found) + ")");
  }
  Tensor t = std::move(it->second);  // the key stays, so later "missing" messages list it
  const std::string where = path + ": tensor '" + name + "': ";
  if (std::find_if(dtypes.begin(), dtypes.end(), [&](const char* d) { return t.dtype == d; }) ==
      dtypes.end()) {
    throw CliError(where + "expected dtype " + join(dtypes) + ", got " + clip(t.dtype));
  }
  if (t.shape.size() != rank) {
    throw CliError(where + "expected rank " + std::to_string(rank) + " " + dims + ", got rank " +
                   std::to_string(t.shape.size()) + " with shape " + clip(t.shape_str()));
  }
  return t;
}

}  // namespace

StageInputs generate_inputs(const GenOptions& o) {
  if (o.topk > o.experts) {
    throw CliError("--topk " + std::to_string(o.topk) + " needs at least as many experts, got --experts " +
                   std::to_string(o.experts));
  }
  StageInputs in;
  in.hidden_states = Tensor("BF16", {o.tokens, o.hidden}, "tensor 'hidden_states'");
  in.topk_ids = Tensor("I32", {o.tokens, o.topk}, "tensor 'topk_ids'");
  in.topk_weights = Tensor("F32", {o.tokens, o.topk}, "tensor 'topk_weights'");
  std::mt19937 rng(o.seed);

  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto* hs = reinterpret_cast<uint16_t*>(in.hidden_states.data.data());
  for (int64_t i = 0, n = in.hidden_states.numel(); i < n; ++i) hs[i] = float_to_bf16(normal(rng) * 17.0f);

  std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(o.experts - 1));
  std::uniform_real_distribution<float> weight(0.01f, 1.0f);
  auto* ids = reinterpret_cast<int32_t*>(in.topk_ids.data.data());
  auto* ws = reinterpret_cast<float*>(in.topk_weights.data.data());
  for (int64_t t = 0; t < o.tokens; ++t) {
    int32_t* row = ids + t * o.topk;
    for (int64_t k = 0; k < o.topk; ++k) {
      int32_t e;
      do {
        e = expert(rng);
      } while (std::find(row, row + k, e) != row + k);
      row[k] = e;
      ws[t * o.topk + k] = weight(rng);
    }
  }
  if (o.pad_every > 0) {
    in.is_padding = Tensor("BOOL", {o.tokens}, "tensor 'is_padding'");
    for (int64_t t = 0; t < o.tokens; ++t) in.is_padding->data[t] = (t + 1) % o.pad_every == 0;
  }
  return in;
}

RouterInputs generate_router_inputs(const GenOptions& o, bool bf16_logits) {
  RouterInputs r;
  r.logits = Tensor(bf16_logits ? "BF16" : "F32", {o.tokens, o.experts}, "tensor 'router_logits'");
  r.bias = Tensor("F32", {o.experts}, "tensor 'e_score_correction_bias'");
  std::mt19937 rng(o.seed + 1u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = r.logits.numel();
  if (bf16_logits) {
    auto* p = reinterpret_cast<uint16_t*>(r.logits.data.data());
    for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(normal(rng) * 2.0f);
  } else {
    auto* p = reinterpret_cast<float*>(r.logits.data.data());
    for (int64_t i = 0; i < n; ++i) p[i] = normal(rng) * 2.0f;
  }
  auto* b = reinterpret_cast<float*>(r.bias.data.data());
  for (int64_t e = 0; e < o.experts; ++e) b[e] = normal(rng) * 0.5f;
  return r;
}

StageInputs load_inputs(const std::string& path) {
  StageInputs in;
  std::map<std::string, Tensor> m = read_safetensors(path, &in.metadata);
  in.hidden_states = *take(m, path, "hidden_states", {"BF16", "F16", "F32"}, 2, "[T, H]", true);
  in.topk_ids = *take(m, path, "topk_ids", {"I32", "I64"}, 2, "[T, K]", true);
  in.topk_weights = *take(m, path, "topk_weights", {"F32", "BF16", "F16"}, 2, "[T, K]", true);
  in.is_padding = take(m, path, "is_padding", {"BOOL", "U8"}, 1, "[T]", false);
  for (auto& [name, t] : m) {
    if (name != "hidden_states" && name != "topk_ids" && name != "topk_weights" && name != "is_padding") {
      in.others.emplace(name, std::move(t));
    }
  }

  const int64_t T = in.T();
  auto rows = [&](const Tensor& t, const char* name) {
    if (t.shape[0] != T) {
      throw CliError(path + ": inconsistent T: hidden_states has " + std::to_string(T) +
                     " tokens (shape " + in.hidden_states.shape_str() + ") but " + name + " has " +
                     std::to_string(t.shape[0]) + " (shape " + t.shape_str() + ")");
    }
  };
  rows(in.topk_ids, "topk_ids");
  rows(in.topk_weights, "topk_weights");
  if (in.is_padding) rows(*in.is_padding, "is_padding");
  if (in.topk_weights.shape != in.topk_ids.shape) {
    throw CliError(path + ": tensor 'topk_weights': expected shape " + in.topk_ids.shape_str() +
                   " (the shape of topk_ids), got " + in.topk_weights.shape_str());
  }
  return in;
}

void save_inputs(const std::string& path, const StageInputs& in, const std::map<std::string, std::string>& metadata,
                 const std::vector<std::pair<std::string, const Tensor*>>& extra) {
  std::vector<std::pair<std::string, const Tensor*>> ts = {{"hidden_states", &in.hidden_states},
                                                           {"topk_ids", &in.topk_ids},
                                                           {"topk_weights", &in.topk_weights}};
  if (in.is_padding) ts.emplace_back("is_padding", &*in.is_padding);
  ts.insert(ts.end(), extra.begin(), extra.end());
  std::map<std::string, std::string> md = metadata;
  md["producer"] = "megamoe-stage --save-inputs";
  write_safetensors(path, ts, md);
}

}  // namespace megamoe_cli
