// binding.cpp: megamoe._C, the thin nanobind layer over the C++ API.
//
// It only translates: every array argument (anything DLPack or the buffer protocol can
// export: NumPy, PyTorch, CuPy, JAX, DLPack capsules) becomes a megamoe::TensorRef
// (data pointer, dtype, shape, strides in elements, device), QuantScheme is the C++
// struct itself, and megamoe::Error becomes ValueError (invalid argument) or RuntimeError.
// Every check of the staging contract lives in the library (src/validate.cpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "megamoe/megamoe.h"

namespace nb = nanobind;
using megamoe::DType;
using megamoe::Error;
using megamoe::ErrorCode;
using megamoe::QuantElem;
using megamoe::QuantScheme;
using megamoe::ScaleType;
using megamoe::TensorRef;

namespace {

[[noreturn]] void invalid(const char* name, const std::string& expected, const std::string& got) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("megamoe: ") + name + ": expected " + expected + ", got " + got);
}

/// Name of a DLPack dtype, for messages about dtypes megamoe does not know.
std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<C>(dt.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: base = "bool"; break;
    default: base = "dlpack_code" + std::to_string(dt.code) + "_bits"; break;
  }
  std::string s = base + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

DType to_dtype(nb::dlpack::dtype dt, const char* name) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    switch (static_cast<C>(dt.code)) {
      case C::Int:
        if (dt.bits == 32) return DType::kInt32;
        if (dt.bits == 64) return DType::kInt64;
        break;
      case C::UInt:
        if (dt.bits == 8) return DType::kUInt8;
        break;
      case C::Float:
        if (dt.bits == 16) return DType::kFloat16;
        if (dt.bits == 32) return DType::kFloat32;
        break;
      case C::Bfloat:
        if (dt.bits == 16) return DType::kBFloat16;
        break;
      case C::Bool:
        if (dt.bits == 8) return DType::kBool;
        break;
      case C::Float8_E4M3FN:
        if (dt.bits == 8) return DType::kFloat8E4M3;
        break;
      default: break;
    }
  }
  invalid(name,
          "dtype bfloat16, float16, float32, float8_e4m3fn, uint8, bool, int32 or int64",
          "dtype " + dlpack_dtype_name(dt));
}

megamoe::Device to_device(int type, int id, const char* name) {
  switch (type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory: host-addressable
      return megamoe::Device::cpu();
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      return megamoe::Device::cuda(id);
    default:
      invalid(name, "a CPU or CUDA tensor", "DLPack device type " + std::to_string(type));
  }
}

/// The TensorRef describing @p a (which must stay alive while the ref is used).
template <typename Array>
TensorRef to_ref(const Array& a, const char* name) {
  const size_t ndim = a.ndim();
  if (ndim > static_cast<size_t>(TensorRef::kMaxRank)) {
    std::string shape = "(";
    for (size_t d = 0; d < ndim; ++d) shape += (d ? ", " : "") + std::to_string(a.shape(d));
    invalid(name, "a tensor of rank <= 2", std::to_string(ndim) + "-D tensor of shape " +
                                               shape + ")");
  }
  TensorRef t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  t.ndim = static_cast<int>(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    t.shape[d] = static_cast<int64_t>(a.shape(d));
    t.strides[d] = a.stride(d);
  }
  t.device = to_device(a.device_type(), a.device_id(), name);
  return t;
}

std::string type_name_of(nb::handle h) { return nb::type_name(h.type()).c_str(); }

using RoArray = nb::ndarray<nb::ro>;
using RwArray = nb::ndarray<>;

/// Imports the arrays of one call and keeps them alive for its duration.
class Arrays {
 public:
  Arrays() {
    ro_.reserve(4);
    rw_.reserve(5);
  }

  TensorRef input(nb::handle h, const char* name) {
    RoArray a;
    if (!nb::try_cast(h, a, false)) not_an_array(h, name);
    ro_.push_back(std::move(a));
    return to_ref(ro_.back(), name);
  }

  TensorRef output(nb::handle h, const char* name) {
    RwArray a;
    if (!nb::try_cast(h, a, false)) {
      RoArray r;
      if (nb::try_cast(h, r, false)) invalid(name, "a writable array", "a read-only array");
      not_an_array(h, name);
    }
    rw_.push_back(std::move(a));
    return to_ref(rw_.back(), name);
  }

 private:
  [[noreturn]] static void not_an_array(nb::handle h, const char* name) {
    throw nb::type_error(("megamoe: " + std::string(name) +
                          ": expected an array (DLPack or buffer protocol), got " + type_name_of(h))
                             .c_str());
  }

  std::vector<RoArray> ro_;
  std::vector<RwArray> rw_;
};

void prepare_inputs(nb::handle hidden_states, nb::handle topk_weights, nb::handle topk_ids,
                    nb::handle x_fp8, nb::handle x_sf, nb::handle topk_idx_out,
                    nb::handle topk_weights_out, nb::handle is_padding, nb::handle shared_x_sf,
                    std::optional<int64_t> shared_block_m, const QuantScheme& hidden_quant,
                    uintptr_t stream, bool enable_pdl) {
  Arrays arrays;
  megamoe::StageArgs args;
  args.hidden_states = arrays.input(hidden_states, "hidden_states");
  args.topk_weights = arrays.input(topk_weights, "topk_weights");
  args.topk_ids = arrays.input(topk_ids, "topk_ids");
  if (!is_padding.is_none()) args.is_padding = arrays.input(is_padding, "is_padding");
  args.x_q = arrays.output(x_fp8, "x_fp8");
  args.x_sf = arrays.output(x_sf, "x_sf");
  args.topk_idx_out = arrays.output(topk_idx_out, "topk_idx_out");
  args.topk_weights_out = arrays.output(topk_weights_out, "topk_weights_out");
  if (!shared_x_sf.is_none()) args.shared_x_sf = arrays.output(shared_x_sf, "shared_x_sf");
  args.shared_block_m = shared_block_m;
  args.hidden_quant = hidden_quant;
  args.enable_pdl = enable_pdl;

  nb::gil_scoped_release release;
  megamoe::prepare_inputs(args, reinterpret_cast<megamoe::Stream>(stream));
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyErr_SetString(e.code() == ErrorCode::kInvalidArgument ? PyExc_ValueError
                                                             : PyExc_RuntimeError,
                    e.what());
  }
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "megamoe._C: native bindings of the megamoe C++ library (use the megamoe package).";
  nb::register_exception_translator(&translate_error);
  // torch keeps QuantScheme (registered as a pytree constant) alive past interpreter
  // teardown; that is not a leak worth a warning at exit.
  nb::set_leak_warnings(false);

  nb::enum_<QuantElem>(m, "QuantElem", "Element type of the quantized values.")
      .value("FLOAT8_E4M3", QuantElem::kFloat8E4M3, "fp8 e4m3fn (the one staging accepts)")
      .value("FLOAT8_E5M2", QuantElem::kFloat8E5M2, "fp8 e5m2 (rejected)")
      .value("INT8", QuantElem::kInt8, "int8 (rejected)")
      .value("FLOAT4_E2M1", QuantElem::kFloat4E2M1, "fp4 e2m1 (rejected)");

  nb::enum_<ScaleType>(m, "ScaleType", "Type of the per-group scale factor.")
      .value("UE8M0", ScaleType::kUE8M0, "power-of-two exponent byte, packed 4 per int32")
      .value("FLOAT32", ScaleType::kFloat32, "plain fp32 scale")
      .value("FLOAT16", ScaleType::kFloat16, "fp16 scale (rejected)");

  nb::class_<QuantScheme>(
      m, "QuantScheme",
      "A hidden-state quantization scheme, shaped like vLLM's QuantKey.\n\n"
      "Staging accepts: elem FLOAT8_E4M3, scale UE8M0 or FLOAT32, group_m 1, group_k\n"
      "dividing 128, dynamic, symmetric, no second-level scale. Presets: mxfp8(),\n"
      "fp8_ue8m0_g128(), fp8_fp32_g128(), fp8_fp32_g32().")
      .def(
          "__init__",
          [](QuantScheme* self, QuantElem elem, ScaleType scale, int64_t group_m, int64_t group_k,
             bool is_static, bool symmetric, bool has_scale2) {
            new (self) QuantScheme{elem, scale, group_m, group_k, is_static, symmetric, has_scale2};
          },
          nb::arg("elem") = QuantElem::kFloat8E4M3, nb::arg("scale") = ScaleType::kUE8M0,
          nb::arg("group_m") = 1, nb::arg("group_k") = 32, nb::arg("is_static") = false,
          nb::arg("symmetric") = true, nb::arg("has_scale2") = false,
          "Build a scheme; the defaults give MXFP8 (fp8 e4m3, UE8M0 scales, groups of 1x32).")
      .def_rw("elem", &QuantScheme::elem, "Quantized element type (QuantElem).")
      .def_rw("scale", &QuantScheme::scale, "Scale type (ScaleType).")
      .def_rw("group_m", &QuantScheme::group_m, "Group rows (1 = per token).")
      .def_rw("group_k", &QuantScheme::group_k,
              "Group columns G along the hidden dimension (<= 0: per tensor / per token).")
      .def_rw("is_static", &QuantScheme::is_static, "Static (precomputed) scales.")
      .def_rw("symmetric", &QuantScheme::symmetric, "Symmetric quantization (no zero point).")
      .def_rw("has_scale2", &QuantScheme::has_scale2, "A second-level scale exists.")
      .def_prop_ro("ue8m0", &QuantScheme::ue8m0, "True for UE8M0 scales.")
      .def_static("mxfp8", &QuantScheme::mxfp8, "fp8 e4m3 + UE8M0 scales, G = 32 (the default).")
      .def_static("fp8_ue8m0_g128", &QuantScheme::fp8_ue8m0_g128, "fp8 e4m3 + UE8M0 scales, G = 128.")
      .def_static("fp8_fp32_g128", &QuantScheme::fp8_fp32_g128,
                  "fp8 e4m3 + fp32 scales, G = 128 (Hopper / DeepGEMM SM90).")
      .def_static("fp8_fp32_g32", &QuantScheme::fp8_fp32_g32, "fp8 e4m3 + fp32 scales, G = 32.")
      .def(nb::self == nb::self, "Field-wise equality.")
      .def(
          "__ne__", [](const QuantScheme& a, const QuantScheme& b) { return !(a == b); },
          nb::is_operator(), "Field-wise inequality.")
      .def(
          "__hash__",
          [](const QuantScheme& q) {
            return nb::hash(nb::make_tuple(static_cast<int>(q.elem), static_cast<int>(q.scale),
                                           q.group_m, q.group_k, q.is_static, q.symmetric,
                                           q.has_scale2));
          },
          "Hash of the fields.")
      .def("__repr__", [](const QuantScheme& q) { return megamoe::to_string(q); },
           "Text naming every field, as used in error messages.")
      .def(
          "__getstate__",
          [](const QuantScheme& q) {
            return nb::make_tuple(q.elem, q.scale, q.group_m, q.group_k, q.is_static,
                                  q.symmetric, q.has_scale2);
          },
          "Pickle support.")
      .def(
          "__setstate__",
          [](QuantScheme& q, const nb::tuple& s) {
            new (&q) QuantScheme{nb::cast<QuantElem>(s[0]), nb::cast<ScaleType>(s[1]),
                                 nb::cast<int64_t>(s[2]),   nb::cast<int64_t>(s[3]),
                                 nb::cast<bool>(s[4]),      nb::cast<bool>(s[5]),
                                 nb::cast<bool>(s[6])};
          },
          "Pickle support.");

  m.def("check_scheme", &megamoe::check_scheme, nb::arg("scheme"),
        "Raise ValueError naming the scheme unless staging accepts it.");
  m.def("has_cuda_backend", &megamoe::has_cuda_backend,
        "True when this build contains the CUDA backend.");
  m.def("version", &megamoe::version, "Library version, \"MAJOR.MINOR.PATCH\".");

  m.def("prepare_inputs", &prepare_inputs, nb::arg("hidden_states"), nb::arg("topk_weights"),
        nb::arg("topk_ids"), nb::arg("x_fp8"), nb::arg("x_sf"), nb::arg("topk_idx_out"),
        nb::arg("topk_weights_out"), nb::arg("is_padding").none() = nb::none(),
        nb::arg("shared_x_sf").none() = nb::none(),
        nb::arg("shared_block_m").none() = nb::none(),
        nb::arg("hidden_quant") = QuantScheme::mxfp8(), nb::arg("stream") = 0,
        nb::arg("enable_pdl") = false,
        "Stage one MoE layer's inputs into caller-owned outputs (see megamoe.prepare_megamoe_inputs).\n\n"
        "Arrays are taken through DLPack or the buffer protocol (inputs may be read-only,\n"
        "outputs must be writable); x_fp8 may be uint8. CUDA work is launched on `stream`\n"
        "(a cudaStream_t as int, 0 = legacy default stream) with the GIL released.");
}
