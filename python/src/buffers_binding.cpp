// buffers_binding.cpp: megamoe._C's view of DeepGEMM's MegaMoE buffers
// (include/megamoe/buffers.h), as plain Python values that megamoe.buffers wraps in named
// tuples. Registered from binding.cpp's module init; megamoe::Error reaches Python through
// the translator registered there (ValueError for an invalid argument).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "megamoe/buffers.h"
#include "megamoe/error.h"

namespace nb = nanobind;
namespace dg = megamoe::deepgemm;

namespace {

/// The enumerator of @p all whose name (dg::to_string) is @p s; an Error naming @p arg and
/// the names otherwise.
template <typename E, size_t N>
E parse(const std::string& s, const E (&all)[N], const char* arg) {
  std::string names;
  for (E e : all) {
    if (s == dg::to_string(e)) return e;
    names += (names.empty() ? "'" : ", '") + std::string(dg::to_string(e)) + "'";
  }
  throw megamoe::Error(megamoe::ErrorCode::kInvalidArgument,
                       std::string("megamoe: ") + arg + ": expected one of " + names + ", got '" + s + "'");
}

constexpr dg::Variant kVariants[] = {dg::Variant::kSm90Fp8, dg::Variant::kSm100, dg::Variant::kSm100Ring};
constexpr dg::MmaType kMmaTypes[] = {dg::MmaType::kFp8xFp4, dg::MmaType::kFp8xFp8, dg::MmaType::kBf16xBf16,
                                     dg::MmaType::kFp4xFp4};
constexpr dg::Activation kActivations[] = {dg::Activation::kSwiglu, dg::Activation::kSitu};

nb::tuple dims(const dg::Region& r, const int64_t (&v)[2]) {
  return r.ndim == 1 ? nb::make_tuple(v[0]) : nb::make_tuple(v[0], v[1]);
}

nb::dict layout(const std::string& variant, int64_t num_ranks, int64_t num_experts, int64_t num_max_tokens_per_rank,
                int64_t num_topk, int64_t hidden, int64_t intermediate_hidden, int64_t num_shared_experts,
                const std::string& mma_type, const std::string& activation, int64_t num_sms, int64_t num_ring_tokens) {
  dg::BufferArgs a;
  a.variant = parse(variant, kVariants, "variant");
  a.num_ranks = num_ranks;
  a.num_experts = num_experts;
  a.num_max_tokens_per_rank = num_max_tokens_per_rank;
  a.num_topk = num_topk;
  a.hidden = hidden;
  a.intermediate_hidden = intermediate_hidden;
  a.num_shared_experts = num_shared_experts;
  a.mma_type = parse(mma_type, kMmaTypes, "mma_type");
  a.activation = parse(activation, kActivations, "activation");
  a.num_sms = num_sms;
  a.num_ring_tokens = num_ring_tokens;
  const dg::BufferLayout l = dg::buffer_layout(a);
  nb::list regions;
  for (const dg::Region& r : l.regions) {
    regions.append(nb::make_tuple(r.name, r.offset, r.nbytes, megamoe::dtype_name(r.dtype), dims(r, r.shape),
                                  dims(r, r.strides), dg::to_string(r.role), r.sliced));
  }
  nb::dict d;
  d["token_alignment"] = l.token_alignment;
  d["num_max_tokens"] = l.num_max_tokens;
  d["num_max_pool_tokens"] = l.num_max_pool_tokens;
  d["num_ring_tokens"] = l.num_ring_tokens;
  d["num_sf_ring_tokens"] = l.num_sf_ring_tokens;
  d["num_shared_sf_tokens"] = l.num_shared_sf_tokens;
  d["workspace_bytes"] = l.workspace_bytes;
  d["nbytes"] = l.nbytes;
  d["regions"] = regions;
  return d;
}

}  // namespace

void register_buffers(nb::module_& m) {
  m.def("deepgemm_buffer_layout", &layout, nb::arg("variant"), nb::arg("num_ranks"), nb::arg("num_experts"),
        nb::arg("num_max_tokens_per_rank"), nb::arg("num_topk"), nb::arg("hidden"), nb::arg("intermediate_hidden"),
        nb::arg("num_shared_experts"), nb::arg("mma_type"), nb::arg("activation"), nb::arg("num_sms"),
        nb::arg("num_ring_tokens"),
        "megamoe::deepgemm::buffer_layout: DeepGEMM's MegaMoE symmetric buffer as {field: value, 'regions':\n"
        "[(name, offset, nbytes, dtype name, shape, strides, role, sliced)]} (see megamoe.buffers.deepgemm_layout).");
  m.def(
      "deepgemm_block_m",
      [](int64_t num_ranks, int64_t num_experts, int64_t num_max_tokens_per_rank, int64_t num_tokens, int64_t num_topk,
         const std::string& mma_type) {
        return dg::block_m(num_ranks, num_experts, num_max_tokens_per_rank, num_tokens, num_topk,
                           parse(mma_type, kMmaTypes, "mma_type"));
      },
      nb::arg("num_ranks"), nb::arg("num_experts"), nb::arg("num_max_tokens_per_rank"), nb::arg("num_tokens"),
      nb::arg("num_topk"), nb::arg("mma_type"),
      "megamoe::deepgemm::block_m: DeepGEMM's block M for a call of num_tokens tokens (get_block_m_for_mega_moe).");
}
