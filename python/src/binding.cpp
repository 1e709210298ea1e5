// binding.cpp: megamoe._C, the thin nanobind layer over the C++ API.
//
// It only translates: every array argument (anything DLPack or the buffer protocol can
// export: NumPy, PyTorch, CuPy, JAX, DLPack capsules) becomes a megamoe::TensorRef
// (data pointer, dtype, shape, strides in elements, device), QuantScheme is the C++
// struct itself, and megamoe::Error becomes ValueError (invalid argument) or RuntimeError.
// Every check of the staging contract lives in the library (src/contract/validate.cpp).
// The staging entry points take their parameters from argument tables, one per entry point
// and the same as megamoe._signature's, which fill a call's arguments by name and say where
// the library names an argument otherwise (StageArgs::x_q is Python's x_fp8): its messages
// are reworded to the parameter's name.
//
// What nanobind refuses to import is explained rather than called "not an array": a
// NumPy array whose dtype DLPack cannot carry (big-endian, structured, object, ...) or
// whose byte strides are not whole elements raises ValueError saying so, and NumPy arrays
// of ml_dtypes' bfloat16 / float8_e4m3fn / float8_e5m2 are taken as what they are. Only
// objects that are no array at all raise TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "megamoe/megamoe.h"

#include "megamoe/cpu.h"
#include "megamoe/plan.h"

namespace nb = nanobind;
using megamoe::DType;
using megamoe::Error;
using megamoe::ErrorCode;
using megamoe::QuantElem;
using megamoe::QuantScheme;
using megamoe::ScaleType;
using megamoe::TensorRef;

namespace {

[[noreturn]] void invalid(const std::string& name, const std::string& expected,
                          const std::string& got) {
  throw Error(ErrorCode::kInvalidArgument,
              "megamoe: " + name + ": expected " + expected + ", got " + got);
}

std::string type_name_of(nb::handle h) { return nb::type_name(h.type()).c_str(); }

[[noreturn]] void not_an_array(nb::handle h, const std::string& name) {
  throw nb::type_error(("megamoe: " + name + ": expected an array (DLPack or buffer protocol), got " +
                        (h.is_none() ? std::string("None") : type_name_of(h)))
                           .c_str());
}

/// @p msg with every occurrence of @p from that stands as a name of its own (not inside a
/// longer identifier) replaced by @p to.
std::string replace_name(std::string msg, const std::string& from, const std::string& to) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  size_t p = msg.find(from);
  while (p != std::string::npos) {
    const size_t end = p + from.size();
    if ((p == 0 || !ident(msg[p - 1])) && (end == msg.size() || !ident(msg[end]))) {
      msg.replace(p, from.size(), to);
      p = msg.find(from, p + to.size());
    } else {
      p = msg.find(from, end);
    }
  }
  return msg;
}

/// Name of a DLPack dtype, for messages about dtypes megamoe has no DType for.
std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  const std::string bits = std::to_string(dt.bits);
  const char* fixed = nullptr;  // a name that already implies the width
  int fixed_bits = 8;
  std::string s;
  switch (static_cast<C>(dt.code)) {
    case C::Int: s = "int" + bits; break;
    case C::UInt: s = "uint" + bits; break;
    case C::Float: s = "float" + bits; break;
    case C::Bfloat: s = "bfloat" + bits; break;
    case C::Complex: s = "complex" + bits; break;
    case C::Bcomplex: s = "bcomplex" + bits; break;
    case C::Bool: s = dt.bits == 8 ? "bool" : "bool" + bits; break;
    case C::Float8_E3M4: fixed = "float8_e3m4"; break;
    case C::Float8_E4M3: fixed = "float8_e4m3"; break;
    case C::Float8_E4M3B11FNUZ: fixed = "float8_e4m3b11fnuz"; break;
    case C::Float8_E4M3FN: fixed = "float8_e4m3fn"; break;
    case C::Float8_E4M3FNUZ: fixed = "float8_e4m3fnuz"; break;
    case C::Float8_E5M2: fixed = "float8_e5m2"; break;
    case C::Float8_E5M2FNUZ: fixed = "float8_e5m2fnuz"; break;
    case C::Float8_E8M0FNU: fixed = "float8_e8m0fnu"; break;
    case C::Float6_E2M3FN: fixed = "float6_e2m3fn", fixed_bits = 6; break;
    case C::Float6_E3M2FN: fixed = "float6_e3m2fn", fixed_bits = 6; break;
    case C::Float4_E2M1FN: fixed = "float4_e2m1fn", fixed_bits = 4; break;
    default: s = "DLPack type code " + std::to_string(dt.code) + " of " + bits + " bits"; break;
  }
  if (fixed != nullptr) s = dt.bits == fixed_bits ? fixed : std::string(fixed) + " of " + bits + " bits";
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

/// The DType of a DLPack dtype, or nothing when megamoe has none for it.
std::optional<DType> to_dtype(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  struct Known {
    C code;
    uint8_t bits;
    DType dtype;
  };
  static constexpr Known kKnown[] = {
      {C::Int, 8, DType::kInt8},           {C::Int, 32, DType::kInt32},
      {C::Int, 64, DType::kInt64},         {C::UInt, 8, DType::kUInt8},
      {C::Float, 16, DType::kFloat16},     {C::Float, 32, DType::kFloat32},
      {C::Bfloat, 16, DType::kBFloat16},   {C::Bool, 8, DType::kBool},
      {C::Float8_E4M3FN, 8, DType::kFloat8E4M3}, {C::Float8_E5M2, 8, DType::kFloat8E5M2},
  };
  if (dt.lanes != 1) return std::nullopt;
  for (const Known& k : kKnown) {
    if (dt.code == static_cast<uint8_t>(k.code) && dt.bits == k.bits) return k.dtype;
  }
  return std::nullopt;
}

const char* dlpack_device_name(int type) {
  switch (type) {
    case 1: return "CPU";
    case 2: return "CUDA";
    case 3: return "CUDA pinned host";
    case 4: return "OpenCL";
    case 7: return "Vulkan";
    case 8: return "Metal";
    case 9: return "VPI";
    case 10: return "ROCm";
    case 11: return "ROCm pinned host";
    case 12: return "ext_dev";
    case 13: return "CUDA managed";
    case 14: return "oneAPI";
    case 15: return "WebGPU";
    case 16: return "Hexagon";
    case 17: return "MAIA";
    default: return nullptr;
  }
}

/// CPU memory and CUDA pinned host memory (host-addressable, so the CPU backend reads it)
/// run on the CPU; CUDA and CUDA managed memory on CUDA device @p id. Anything else is
/// refused here, before the library could hand it to a backend.
megamoe::Device to_device(int type, int id, const std::string& name) {
  switch (type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: return megamoe::Device::cpu();
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      if (id < 0) invalid(name, "a CUDA device ordinal >= 0", "device id " + std::to_string(id));
      return megamoe::Device::cuda(id);
    default: break;
  }
  const char* dev = dlpack_device_name(type);
  invalid(name, "a CPU or CUDA tensor",
          "DLPack device type " + std::to_string(type) + (dev ? std::string(" (") + dev + ")" : ""));
}

template <typename Size>
[[noreturn]] void rank_error(const std::string& name, size_t ndim, const Size* shape) {
  std::string s = "(";
  for (size_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  invalid(name, "a tensor of rank <= 2", std::to_string(ndim) + "-D tensor of shape " + s + ")");
}

/// An argument whose dtype megamoe has no DType for: its TensorRef carries a placeholder
/// dtype, and @c got describes the real one.
struct Unrepresented {
  TensorRef* field;
  std::string name;     ///< the caller's, for the message raised here
  std::string library;  ///< the library's, as its messages say it
  std::string got;
};

/// Raises the error for arguments of dtypes the library cannot be told about. Which dtypes
/// a tensor accepts is the library's knowledge (it may depend on the scheme and shapes), so
/// the library is asked: each such tensor is given a placeholder dtype that it rejects
/// (every tensor rejects bool or int64), and the library's message about the placeholder
/// is reworded to name the real dtype (the entry point rewords the library's names of
/// arguments to the caller's). @p check runs the library's checks only; it must never stage
/// anything.
template <typename Check>
[[noreturn]] void raise_unrepresented(const std::vector<Unrepresented>& bad, Check&& check) {
  for (DType placeholder : {DType::kBool, DType::kInt64}) {
    for (const Unrepresented& b : bad) b.field->dtype = placeholder;
    try {
      check();
    } catch (const Error& e) {
      const std::string msg = e.what();
      const std::string tail = std::string(", got dtype ") + megamoe::dtype_name(placeholder);
      for (const Unrepresented& b : bad) {
        const std::string head = "megamoe: " + b.library + ": expected dtype ";
        if (msg.size() > head.size() + tail.size() && msg.compare(0, head.size(), head) == 0 &&
            msg.compare(msg.size() - tail.size(), tail.size(), tail) == 0) {
          throw Error(ErrorCode::kInvalidArgument,
                      msg.substr(0, msg.size() - tail.size()) + ", got " + b.got);
        }
      }
      // Another complaint came first; it may stem from the placeholder itself (its size
      // enters the overlap checks), so it is not reported.
    }
  }
  throw Error(ErrorCode::kInvalidArgument, "megamoe: " + bad[0].name + ": unsupported " + bad[0].got);
}

/// What keeps NumPy dtype @p dt out of DLPack and the buffer protocol, worded to follow
/// "got"; empty when the dtype is not the reason. @p mapped receives the DType of the
/// ml_dtypes types megamoe has (bfloat16, float8_e4m3fn, float8_e5m2), which DLPack
/// cannot carry.
std::string numpy_dtype_problem(nb::handle dt, std::optional<DType>* mapped) {
  const std::string kind = nb::str(dt.attr("kind")).c_str();
  const int64_t itemsize = nb::cast<int64_t>(dt.attr("itemsize"));
  if (kind == "O") return "object array";
  if (!dt.attr("fields").is_none()) return "structured dtype " + std::string(nb::str(dt).c_str());
  if (!nb::cast<bool>(dt.attr("isnative"))) {
    const std::string order = nb::str(dt.attr("byteorder")).c_str();
    const std::string base = nb::str(dt.attr("newbyteorder")("=").attr("name")).c_str();
    return (order == ">" ? "big-endian " : "little-endian ") + base;
  }
  const std::string name = nb::str(dt.attr("name")).c_str();
  if (name == "bfloat16" && itemsize == 2) {
    *mapped = DType::kBFloat16;
    return "";
  }
  if (name == "float8_e4m3fn" && itemsize == 1) {
    *mapped = DType::kFloat8E4M3;
    return "";
  }
  if (name == "float8_e5m2" && itemsize == 1) {
    *mapped = DType::kFloat8E5M2;
    return "";
  }
  const bool word = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
  const bool plain = ((kind == "b" || kind == "i" || kind == "u") && word) ||
                     (kind == "f" && word && itemsize >= 2) ||
                     (kind == "c" && (itemsize == 8 || itemsize == 16));
  return plain ? "" : "dtype " + std::string(nb::str(dt).c_str());
}

bool is_numpy_array(nb::handle h) {
  PyObject* modules = PySys_GetObject("modules");  // borrowed, like the item below
  PyObject* numpy = modules != nullptr ? PyDict_GetItemString(modules, "numpy") : nullptr;
  if (numpy == nullptr) return false;  // no NumPy array exists before NumPy is loaded
  const int r = PyObject_IsInstance(h.ptr(), nb::borrow(numpy).attr("ndarray").ptr());
  if (r < 0) PyErr_Clear();
  return r == 1;
}

std::string tuple_text(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

[[noreturn]] void byte_strides_error(const std::string& name, int64_t itemsize,
                                     const std::vector<int64_t>& strides) {
  invalid(name,
          "byte strides that are whole multiples of the element size (" +
              std::to_string(itemsize) + " bytes)",
          "byte strides " + tuple_text(strides));
}

// The payloads of the two DLPack capsule kinds (DLManagedTensor, DLManagedTensorVersioned),
// read only to say why nanobind refused a capsule.
struct DLManaged {
  nb::dlpack::dltensor tensor;
  void* manager_ctx;
  void (*deleter)(DLManaged*);
};
struct DLManagedVersioned {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(DLManagedVersioned*);
  uint64_t flags;
  nb::dlpack::dltensor tensor;
};

[[noreturn]] void refused_capsule(nb::handle h, const std::string& name) {
  const char* raw = PyCapsule_GetName(h.ptr());
  if (raw == nullptr) PyErr_Clear();
  const std::string cap = raw != nullptr ? raw : "";
  if (cap == "used_dltensor" || cap == "used_dltensor_versioned") {
    invalid(name, "a DLPack capsule not imported before",
            "one already consumed (a capsule can be imported only once)");
  }
  if (cap == "dltensor" || cap == "dltensor_versioned") {
    void* p = PyCapsule_GetPointer(h.ptr(), raw);
    if (p == nullptr) PyErr_Clear();
    if (p != nullptr) {
      const nb::dlpack::dltensor& t = cap == "dltensor" ? static_cast<DLManaged*>(p)->tensor
                                                        : static_cast<DLManagedVersioned*>(p)->tensor;
      if (t.ndim < 0 || t.ndim > TensorRef::kMaxRank) {
        invalid(name, "a tensor of rank <= 2", std::to_string(t.ndim) + "-D DLPack tensor");
      }
    }
    invalid(name, "a DLPack tensor that can be imported", "a capsule nanobind refused");
  }
  throw nb::type_error(("megamoe: " + name +
                        ": expected an array (DLPack or buffer protocol), got a PyCapsule named '" +
                        cap + "'")
                           .c_str());
}

using RoArray = nb::ndarray<nb::ro>;
using RwArray = nb::ndarray<>;

/// An array argument as the caller passed it, with its names: the caller's (the Python
/// parameter's, which messages of the binding use) and the library's (which the library's
/// messages use; the same unless the entry point's argument table says otherwise).
struct PyArray {
  nb::handle obj;
  const char* name = "";
  const char* library = "";
  bool is_none() const { return obj.is_none(); }
};

/// Imports the arrays of one call and keeps them alive for its duration.
class Arrays {
 public:
  /// Imports input @p a into @p dst. With @p stop_if_empty, returns true as soon as @p a is
  /// known to be a 2-D array without rows, before its dtype or device are looked at.
  bool input(const PyArray& a, TensorRef& dst, bool stop_if_empty = false) {
    return load(a.obj, a, false, dst, stop_if_empty, std::nullopt);
  }

  /// Imports optional input @p a into @p dst unless it is None.
  void input(const PyArray& a, std::optional<TensorRef>& dst) {
    if (!a.is_none()) input(a, dst.emplace());
  }

  void output(const PyArray& a, TensorRef& dst) { load(a.obj, a, true, dst, false, std::nullopt); }

  /// Imports optional output @p a into @p dst unless it is None.
  void output(const PyArray& a, std::optional<TensorRef>& dst) {
    if (!a.is_none()) output(a, dst.emplace());
  }

  /// The arguments imported with a placeholder dtype (see raise_unrepresented).
  const std::vector<Unrepresented>& unrepresented() const { return bad_; }

 private:
  /// Imports @p h, argument @p arg (@p h is arg.obj or the array it is read as).
  bool load(nb::handle h, const PyArray& arg, bool writable, TensorRef& dst, bool stop_if_empty,
            std::optional<DType> as) {
    if (writable) {
      RwArray a;
      if (nb::try_cast(h, a, false)) return take(std::move(a), rw_, arg, dst, false, as);
      RoArray r;
      if (nb::try_cast(h, r, false)) invalid(arg.name, "a writable array", "a read-only array");
    } else {
      RoArray a;
      if (nb::try_cast(h, a, false)) return take(std::move(a), ro_, arg, dst, stop_if_empty, as);
    }
    return refused(h, arg, writable, dst, stop_if_empty);
  }

  template <typename Array>
  bool take(Array&& a, std::vector<Array>& keep, const PyArray& arg, TensorRef& dst,
            bool stop_if_empty, std::optional<DType> as) {
    const char* name = arg.name;
    keep.push_back(std::move(a));
    const Array& k = keep.back();
    const size_t ndim = k.ndim();
    if (ndim > static_cast<size_t>(TensorRef::kMaxRank)) rank_error(name, ndim, k.shape_ptr());
    dst.ndim = static_cast<int>(ndim);
    for (size_t d = 0; d < ndim; ++d) {
      dst.shape[d] = k.shape_ptr()[d];
      dst.strides[d] = k.stride(d);
    }
    if (stop_if_empty && ndim == 2 && dst.shape[0] == 0) return true;
    dst.data = const_cast<void*>(static_cast<const void*>(k.data()));
    dst.device = to_device(k.device_type(), k.device_id(), name);
    if (!as) as = to_dtype(k.dtype());
    if (as) {
      dst.dtype = *as;
    } else {
      bad_.push_back({&dst, name, arg.library, "dtype " + dlpack_dtype_name(k.dtype())});
    }
    return false;
  }

  /// nanobind could not import @p h. Raises the error that says why, except for NumPy
  /// arrays whose dtype is to be reported with the library's list (recorded in bad_) or is
  /// one of ml_dtypes' that megamoe has (imported as bytes); those return like load().
  bool refused(nb::handle h, const PyArray& arg, bool writable, TensorRef& dst, bool stop_if_empty) {
    const std::string name = arg.name;
    if (PyCapsule_CheckExact(h.ptr())) refused_capsule(h, name);
    if (is_numpy_array(h)) return refused_numpy(h, arg, writable, dst, stop_if_empty);
    if (nb::hasattr(h, "__dlpack__")) {
      try {
        (void)h.attr("__dlpack__")();
      } catch (const nb::python_error& e) {
        invalid(name, "an array DLPack can export",
                "a " + type_name_of(h) + " whose __dlpack__() raised " + type_name_of(e.value()) +
                    ": " + nb::str(e.value()).c_str());
      }
      invalid(name, "a DLPack tensor that can be imported",
              "a " + type_name_of(h) + " whose DLPack export nanobind refused");
    }
    if (PyObject_CheckBuffer(h.ptr())) refused_buffer(h, name);
    not_an_array(h, name);
  }

  bool refused_numpy(nb::handle h, const PyArray& arg, bool writable, TensorRef& dst,
                     bool stop_if_empty) {
    const std::string name = arg.name;
    std::vector<int64_t> shape, strides;
    for (nb::handle s : h.attr("shape")) shape.push_back(nb::cast<int64_t>(s));
    for (nb::handle s : h.attr("strides")) strides.push_back(nb::cast<int64_t>(s));
    if (shape.size() > static_cast<size_t>(TensorRef::kMaxRank)) {
      rank_error(name, shape.size(), shape.data());
    }
    dst.ndim = static_cast<int>(shape.size());
    for (int d = 0; d < dst.ndim; ++d) dst.shape[d] = shape[d];
    if (stop_if_empty && dst.ndim == 2 && dst.shape[0] == 0) return true;

    nb::object dt = h.attr("dtype");
    std::optional<DType> mapped;
    std::string got = numpy_dtype_problem(dt, &mapped);
    if (!got.empty()) {
      // Only validation sees this ref (no data, no strides): enough to learn the dtypes
      // the library accepts here.
      bad_.push_back({&dst, name, arg.library, std::move(got)});
      return false;
    }
    const int64_t itemsize = nb::cast<int64_t>(dt.attr("itemsize"));
    for (int64_t s : strides) {
      if (itemsize <= 0 || s % itemsize != 0) byte_strides_error(name, itemsize, strides);
    }
    if (mapped) {
      // The same bytes as unsigned integers (which DLPack carries), read as what they are.
      nb::object bytes = h.attr("view")(itemsize == 1 ? "u1" : "u2");
      return load(bytes, arg, writable, dst, false, mapped);
    }
    invalid(name, "an array DLPack or the buffer protocol can export",
            "a NumPy array of dtype " + std::string(nb::str(dt).c_str()) + " that both refused");
  }

  [[noreturn]] static void refused_buffer(nb::handle h, const std::string& name) {
    Py_buffer view;
    if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      not_an_array(h, name);
    }
    const std::string format = view.format != nullptr ? view.format : "B";
    const int64_t itemsize = view.itemsize;
    std::vector<int64_t> strides;
    for (int d = 0; d < view.ndim && view.strides != nullptr; ++d) strides.push_back(view.strides[d]);
    PyBuffer_Release(&view);
    for (int64_t s : strides) {
      if (itemsize <= 0 || s % itemsize != 0) byte_strides_error(name, itemsize, strides);
    }
    invalid(name, "a buffer of native-endian numbers", "buffer format '" + format + "'");
  }

  std::vector<RoArray> ro_;
  std::vector<RwArray> rw_;
  std::vector<Unrepresented> bad_;
};

/// A Python float as an fp32 argument @p name (round to nearest, as DeepGEMM's SM90
/// pre-dispatch casts its double argument). NaN and +-Inf pass (the validator names them);
/// a finite value beyond fp32's range is refused here, its conversion being undefined.
float to_f32_arg(double v, const char* name) {
  if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    throw Error(ErrorCode::kInvalidArgument,
                std::string("megamoe: ") + name + ": expected a value within float32's range, got " + buf);
  }
  return static_cast<float>(v);
}

std::optional<float> as_float(const std::optional<double>& v) {
  if (!v) return std::nullopt;
  return to_f32_arg(*v, "routed_scaling_factor");
}

/// A Python int argument @p name (anything with __index__) as an int64: a value outside
/// int64 is a ValueError naming it and the value, in the words of megamoe._signature (not
/// nanobind's "incompatible function arguments", which names neither); a non-int (a float,
/// a str) is a TypeError naming it.
int64_t to_i64_arg(nb::handle h, const char* name) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw nb::type_error((std::string("megamoe: ") + name + ": expected an int, got " +
                          nb::type_name(h.type()).c_str()).c_str());
  nb::object idx = nb::steal(PyNumber_Index(h.ptr()));
  if (!idx.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    return static_cast<int64_t>(v);
  }
  const int64_t bits = nb::cast<int64_t>(idx.attr("bit_length")());
  const std::string text = bits <= 128 ? std::string(nb::str(idx).c_str())
                                       : std::string(overflow < 0 ? "a negative" : "an") + " int of " +
                                             std::to_string(bits) + " bits";
  throw nb::value_error((std::string("megamoe: ") + name + ": " + text + " does not fit in int64").c_str());
}

/// The arguments of the staging entry points (prepare_inputs, stage_routing, route,
/// route_and_stage, rmsnorm_and_stage and the explain twins), each in the member named as
/// its Python parameter; an entry point's argument table (below) says which it takes, in
/// which order.
/// The initializers are the defaults of the parameters that have one (arrays: None).
struct Handles {
  PyArray hidden_states, router_logits, e_score_correction_bias, topk_weights, topk_ids;
  PyArray x_fp8, x_sf, topk_idx_out, topk_weights_out, is_padding, shared_x_sf;
  std::optional<int64_t> shared_block_m;
  QuantScheme hidden_quant = QuantScheme::mxfp8();
  std::optional<int64_t> top_k;
  std::optional<double> routed_scaling_factor;
  PyArray tid2eid, input_ids, logical_to_physical_map, logical_replica_count, expert_load_view,
      record_enabled, logits_nonfinite_count;
  PyArray global_scale, x_scales, nonfinite_count, expert_scales;
  bool full_buffer = false;
  uintptr_t stream = 0;
  bool enable_pdl = false;
  // rmsnorm_and_stage's norm (RmsNormArgs); eps is a double as Python passes it, made an
  // fp32 with to_f32_arg.
  PyArray x, residual, weight, y, residual_out;
  double eps = 1e-6;
  // gate_route_and_stage's gate (GateArgs): weight and y as above (y an input there, None:
  // hidden_states), and the logits it may write.
  PyArray logits_out;
  // mhc_pre_and_stage's mHC step (MhcPreArgs; residual and y as above); its floats are
  // doubles as Python passes them, made fp32 with to_f32_arg.
  PyArray fn, hc_scale, hc_base, norm_weight, post_mix, comb_mix, pre_mix_in, pre_mix, layer_input;
  double rms_eps = 1e-6, hc_pre_eps = 1e-6, hc_sinkhorn_eps = 1e-6, hc_post_mult_value = 2.0, norm_eps = 1e-6;
  int64_t sinkhorn_repeat = 20;
};

megamoe::Stream stream_of(const Handles& h) { return reinterpret_cast<megamoe::Stream>(h.stream); }

/// One row of an entry point's argument table: the Python parameter @c name, the member of
/// Handles that receives it (rows are written with MEGAMOE_ARG, which spells the name once
/// for both) and, for an array the library names otherwise, the library's name (the entry
/// point rewords the library's messages to the parameter's name). Everything else follows
/// from the member's type: an array (PyArray) is any Python object or None; an optional
/// int or float takes None; the default of a parameter that is not required is the
/// member's initializer.
template <typename M, bool kRequired>
struct Param {
  using Member = M;
  const char* name;
  M Handles::*member;
  const char* library;

  /// This row with the library's name for the argument.
  constexpr Param library_name(const char* lib) const { return {name, member, lib}; }
};

template <bool kRequired, typename M>
constexpr Param<M, kRequired> make_param(const char* name, M Handles::*member) {
  return {name, member, nullptr};
}

#define MEGAMOE_ARG(member) make_param<false>(#member, &Handles::member)
#define MEGAMOE_REQUIRED_ARG(member) make_param<true>(#member, &Handles::member)

/// The C++ type nanobind converts a parameter to: arrays stay Python objects until Arrays
/// imports them (so that their errors name them).
template <typename M>
struct PyParam {
  using type = M;
};
template <>
struct PyParam<PyArray> {
  using type = nb::handle;
};

template <typename M>
constexpr bool kTakesNone = false;
template <>
constexpr bool kTakesNone<PyArray> = true;
template <typename T>
constexpr bool kTakesNone<std::optional<T>> = true;

/// The nanobind annotation of row @p p. Arrays take None even when required, so that a
/// missing one gets the TypeError naming it (and so that T == 0 returns whatever they are).
template <typename M, bool R>
auto nb_arg(const Param<M, R>& p) {
  if constexpr (kTakesNone<M>) {
    if constexpr (R) {
      return nb::arg(p.name).none();
    } else {
      return nb::arg(p.name).none() = nb::none();
    }
  } else if constexpr (R) {
    return nb::arg(p.name);
  } else {
    return nb::arg(p.name) = Handles{}.*p.member;
  }
}

template <typename M, bool R>
void fill(Handles& h, const Param<M, R>& p, typename PyParam<M>::type v) {
  if constexpr (std::is_same_v<M, PyArray>) {
    h.*p.member = PyArray{v, p.name, p.library != nullptr ? p.library : p.name};
  } else {
    h.*p.member = std::move(v);
  }
}

/// Runs @p fn with the library's names of @p table's arguments in its errors reworded to
/// the parameters' names.
template <typename Table, typename Fn>
auto with_parameter_names(const Table& table, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    auto rename = [&msg](const auto& p) {
      if (p.library != nullptr) msg = replace_name(std::move(msg), p.library, p.name);
    };
    std::apply([&](const auto&... p) { (rename(p), ...); }, table);
    throw Error(e.code(), msg);
  }
}

template <typename Table, typename Fn, size_t... I>
void def_entry(nb::module_& m, const char* name, const Table& table, Fn fn, const char* doc,
               std::index_sequence<I...>) {
  m.def(
      name,
      [table, fn](typename PyParam<typename std::tuple_element_t<I, Table>::Member>::type... v) {
        Handles h;
        (fill(h, std::get<I>(table), std::move(v)), ...);
        return with_parameter_names(table, [&] { return fn(h); });
      },
      nb_arg(std::get<I>(table))..., doc);
}

/// Defines entry point @p name of @p m: its parameters are the rows of @p table (names,
/// order, types, defaults); a call fills Handles by name and runs @p fn on them.
template <typename Table, typename Fn>
void def_entry(nb::module_& m, const char* name, const Table& table, Fn fn, const char* doc) {
  def_entry(m, name, table, fn, doc, std::make_index_sequence<std::tuple_size_v<Table>>());
}

// The argument tables, one per entry point, spliced from shared pieces as those of
// megamoe._signature (PREPARE, ROUTING, ROUTE, ROUTE_AND_STAGE), whose names and order they
// are; tests/python/test_signature.py checks the module's parameters against them.

/// The staged tensor: x_q in the C++ API (StageArgs::x_q) and the library's messages, x_fp8
/// in Python (vLLM's parameter name).
constexpr const char kQuantized[] = "x_q";
/// The router's non-finite counter (RouterArgs::nonfinite_count), named apart from
/// StageArgs::nonfinite_count in the library's messages; route calls it nonfinite_count,
/// route_and_stage logits_nonfinite_count.
constexpr const char kRouterCounter[] = "nonfinite_count (router)";

// prepare_megamoe_inputs' outputs and options from x_fp8 on, which route_and_stage takes too.
constexpr auto kStaged = std::make_tuple(
    MEGAMOE_REQUIRED_ARG(x_fp8).library_name(kQuantized), MEGAMOE_REQUIRED_ARG(x_sf),
    MEGAMOE_REQUIRED_ARG(topk_idx_out), MEGAMOE_REQUIRED_ARG(topk_weights_out), MEGAMOE_ARG(is_padding),
    MEGAMOE_ARG(shared_x_sf), MEGAMOE_ARG(shared_block_m), MEGAMOE_ARG(hidden_quant));
constexpr auto kStageOptions = std::make_tuple(MEGAMOE_ARG(global_scale), MEGAMOE_ARG(x_scales),
                                               MEGAMOE_ARG(nonfinite_count), MEGAMOE_ARG(full_buffer));
constexpr auto kLaunch = std::make_tuple(MEGAMOE_ARG(stream), MEGAMOE_ARG(enable_pdl));

constexpr auto kPrepare = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(hidden_states), MEGAMOE_REQUIRED_ARG(topk_weights),
                    MEGAMOE_REQUIRED_ARG(topk_ids)),
    kStaged, kStageOptions, std::make_tuple(MEGAMOE_ARG(routed_scaling_factor), MEGAMOE_ARG(expert_scales)),
    kLaunch);

constexpr auto kRouting = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(topk_weights), MEGAMOE_REQUIRED_ARG(topk_ids),
                    MEGAMOE_REQUIRED_ARG(topk_idx_out), MEGAMOE_REQUIRED_ARG(topk_weights_out),
                    MEGAMOE_ARG(is_padding), MEGAMOE_ARG(full_buffer), MEGAMOE_ARG(routed_scaling_factor),
                    MEGAMOE_ARG(expert_scales)),
    kLaunch);

// The router's logits, bias (required, None allowed) and public top-k, then its options.
constexpr auto kRouterHead =
    std::make_tuple(MEGAMOE_REQUIRED_ARG(router_logits), MEGAMOE_REQUIRED_ARG(e_score_correction_bias),
                    MEGAMOE_REQUIRED_ARG(topk_weights), MEGAMOE_REQUIRED_ARG(topk_ids));
constexpr auto kRouterOptions = std::make_tuple(
    MEGAMOE_ARG(top_k), MEGAMOE_ARG(routed_scaling_factor), MEGAMOE_ARG(tid2eid), MEGAMOE_ARG(input_ids),
    MEGAMOE_ARG(logical_to_physical_map), MEGAMOE_ARG(logical_replica_count), MEGAMOE_ARG(expert_load_view),
    MEGAMOE_ARG(record_enabled));

constexpr auto kRoute =
    std::tuple_cat(kRouterHead, std::make_tuple(MEGAMOE_ARG(is_padding)), kRouterOptions,
                   std::make_tuple(MEGAMOE_ARG(nonfinite_count).library_name(kRouterCounter)), kLaunch);

constexpr auto kRouteAndStage = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(hidden_states)), kRouterHead, kStaged, kRouterOptions,
    std::make_tuple(MEGAMOE_ARG(logits_nonfinite_count).library_name(kRouterCounter)), kStageOptions, kLaunch);

// The norm's inputs in place of hidden_states (the residual required, None allowed), then
// prepare_inputs' arguments; eps and the norm's outputs keyword-only in Python.
constexpr auto kNormAndStage = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(x), MEGAMOE_REQUIRED_ARG(residual), MEGAMOE_REQUIRED_ARG(weight),
                    MEGAMOE_REQUIRED_ARG(topk_weights), MEGAMOE_REQUIRED_ARG(topk_ids)),
    kStaged, std::make_tuple(MEGAMOE_ARG(eps), MEGAMOE_ARG(y), MEGAMOE_ARG(residual_out)), kStageOptions,
    std::make_tuple(MEGAMOE_ARG(routed_scaling_factor), MEGAMOE_ARG(expert_scales)), kLaunch);

// route_and_stage's arguments with the gate weight in place of router_logits; y (None:
// hidden_states), logits_out and the logits' counter keyword-only in Python.
constexpr auto kGateRouteAndStage = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(hidden_states), MEGAMOE_REQUIRED_ARG(weight),
                    MEGAMOE_REQUIRED_ARG(e_score_correction_bias), MEGAMOE_REQUIRED_ARG(topk_weights),
                    MEGAMOE_REQUIRED_ARG(topk_ids)),
    kStaged, kRouterOptions,
    std::make_tuple(MEGAMOE_ARG(y), MEGAMOE_ARG(logits_out),
                    MEGAMOE_ARG(logits_nonfinite_count).library_name(kRouterCounter)),
    kStageOptions, kLaunch);

// route's arguments with the gate's y and weight in place of router_logits; logits_out
// keyword-only in Python.
constexpr auto kGateAndRoute = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(y), MEGAMOE_REQUIRED_ARG(weight), MEGAMOE_REQUIRED_ARG(e_score_correction_bias),
                    MEGAMOE_REQUIRED_ARG(topk_weights), MEGAMOE_REQUIRED_ARG(topk_ids), MEGAMOE_ARG(is_padding)),
    kRouterOptions,
    std::make_tuple(MEGAMOE_ARG(logits_out), MEGAMOE_ARG(nonfinite_count).library_name(kRouterCounter)), kLaunch);

// mHC's inputs and its required outputs in place of hidden_states, then prepare_inputs'
// arguments; mHC's scalars and optional tensors keyword-only in Python.
constexpr auto kMhcAndStage = std::tuple_cat(
    std::make_tuple(MEGAMOE_REQUIRED_ARG(residual), MEGAMOE_REQUIRED_ARG(fn), MEGAMOE_REQUIRED_ARG(hc_scale),
                    MEGAMOE_REQUIRED_ARG(hc_base), MEGAMOE_REQUIRED_ARG(norm_weight), MEGAMOE_REQUIRED_ARG(post_mix),
                    MEGAMOE_REQUIRED_ARG(comb_mix), MEGAMOE_REQUIRED_ARG(topk_weights), MEGAMOE_REQUIRED_ARG(topk_ids)),
    kStaged,
    std::make_tuple(MEGAMOE_ARG(rms_eps), MEGAMOE_ARG(hc_pre_eps), MEGAMOE_ARG(hc_sinkhorn_eps),
                    MEGAMOE_ARG(hc_post_mult_value), MEGAMOE_ARG(sinkhorn_repeat), MEGAMOE_ARG(norm_eps),
                    MEGAMOE_ARG(pre_mix_in), MEGAMOE_ARG(pre_mix), MEGAMOE_ARG(layer_input), MEGAMOE_ARG(y)),
    kStageOptions, std::make_tuple(MEGAMOE_ARG(routed_scaling_factor), MEGAMOE_ARG(expert_scales)), kLaunch);

#undef MEGAMOE_ARG
#undef MEGAMOE_REQUIRED_ARG

/// Imports the arrays of @p h into @p args. Returns false when the call has nothing to do:
/// a 2-D hidden_states without rows (the reference reads num_tokens and returns before
/// looking at anything else), except in full-buffer mode, whose top-k tail is filled even
/// then (so every argument is read and checked). @p routed: the staging half of
/// route_and_stage, whose top-k inputs are the router's outputs (not read here), whose
/// routed_scaling_factor is the router's and whose T is the router's (so hidden_states is
/// imported whatever its rows, for the library to check, and the dtype errors are left to
/// the caller, who validates both halves). @p normed: the staging half of rmsnorm_and_stage,
/// whose rows are the norm's (no hidden_states: StageArgs::hidden_states stays empty; T
/// comes from x, read by the caller, who also reports the dtypes the library has no name for).
/// @p hidden: hidden_states as the caller has already imported it (gate_route_and_stage's y
/// when y is None: a DLPack capsule can be imported only once).
bool load_stage(Arrays& arrays, const Handles& h, megamoe::StageArgs& args, bool routed = false,
                bool normed = false, const TensorRef* hidden = nullptr) {
  if (hidden != nullptr) {
    args.hidden_states = *hidden;
  } else if (routed) {
    arrays.input(h.hidden_states, args.hidden_states);
  }
  if (!routed) {
    if (!normed && arrays.input(h.hidden_states, args.hidden_states, !h.full_buffer)) return false;
    arrays.input(h.topk_weights, args.topk_weights);
    arrays.input(h.topk_ids, args.topk_ids);
  }
  arrays.input(h.is_padding, args.is_padding);
  arrays.output(h.x_fp8, args.x_q);
  // None: no tensor (a scheme without scales, bf16; every other scheme rejects the absent x_sf).
  if (!h.x_sf.is_none()) arrays.output(h.x_sf, args.x_sf);
  arrays.output(h.topk_idx_out, args.topk_idx_out);
  arrays.output(h.topk_weights_out, args.topk_weights_out);
  arrays.output(h.shared_x_sf, args.shared_x_sf);
  // NVFP4 static reads global_scale; NVFP4 online writes it.
  if (h.hidden_quant.scale2 == megamoe::Scale2::kOnline) {
    arrays.output(h.global_scale, args.global_scale);
  } else {
    arrays.input(h.global_scale, args.global_scale);
  }
  arrays.output(h.x_scales, args.x_scales);
  arrays.output(h.nonfinite_count, args.nonfinite_count);
  args.shared_block_m = h.shared_block_m;
  args.hidden_quant = h.hidden_quant;
  args.full_buffer = h.full_buffer;
  if (!routed) {
    args.routed_scaling_factor = as_float(h.routed_scaling_factor);
    arrays.input(h.expert_scales, args.expert_scales);
  }
  args.enable_pdl = h.enable_pdl;
  if (!routed && !normed && !arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate(args); });
  }
  return true;
}

void prepare_inputs(const Handles& h) {
  Arrays arrays;
  megamoe::StageArgs args;
  if (!load_stage(arrays, h, args)) return;
  nb::gil_scoped_release release;
  megamoe::prepare_inputs(args, stream_of(h));
}

std::string explain(const Handles& h) {
  Arrays arrays;
  megamoe::StageArgs args;
  if (!load_stage(arrays, h, args)) return "nothing to do: hidden_states has no rows (T == 0)";
  return megamoe::explain(args);
}

/// Imports the arrays of @p h into @p args (stage_routing's and explain_routing's). Returns
/// false when the call has nothing to do: T is topk_ids.shape[0], as in the library; without
/// rows (and outside full-buffer mode) nothing else is read.
bool load_routing(Arrays& arrays, const Handles& h, megamoe::RoutingArgs& args) {
  if (arrays.input(h.topk_ids, args.topk_ids, !h.full_buffer)) return false;
  arrays.input(h.topk_weights, args.topk_weights);
  arrays.input(h.is_padding, args.is_padding);
  arrays.output(h.topk_idx_out, args.topk_idx_out);
  arrays.output(h.topk_weights_out, args.topk_weights_out);
  args.full_buffer = h.full_buffer;
  args.routed_scaling_factor = as_float(h.routed_scaling_factor);
  arrays.input(h.expert_scales, args.expert_scales);
  args.enable_pdl = h.enable_pdl;
  if (!arrays.unrepresented().empty()) {
    // There is no validate-only entry for routing calls: the copy without output pointers
    // fails the library's last check (non-null data) if it passes every other, so nothing
    // is ever written.
    raise_unrepresented(arrays.unrepresented(), [&] {
      megamoe::RoutingArgs probe = args;
      probe.topk_idx_out.data = nullptr;
      probe.topk_weights_out.data = nullptr;
      megamoe::stage_routing(probe);
    });
  }
  return true;
}

void stage_routing(const Handles& h) {
  Arrays arrays;
  megamoe::RoutingArgs args;
  if (!load_routing(arrays, h, args)) return;
  nb::gil_scoped_release release;
  megamoe::stage_routing(args, stream_of(h));
}

std::string explain_routing(const Handles& h) {
  Arrays arrays;
  megamoe::RoutingArgs args;
  if (!load_routing(arrays, h, args)) return "nothing to do: topk_ids has no rows (T == 0)";
  return megamoe::explain(args);
}

/// Imports the router's arrays of @p h into @p r, its logits' non-finite counter from
/// @p counter (route's nonfinite_count, route_and_stage's logits_nonfinite_count). Returns
/// false (nothing imported but the logits) when @p stop_if_empty and router_logits is 2-D
/// without rows: the library reads T from the logits and returns at once then.
bool load_router(Arrays& arrays, const Handles& h, megamoe::RouterArgs& r, bool stop_if_empty,
                 const PyArray& counter);

/// Everything of load_router but the logits (gate_route_and_stage computes them).
void load_router_options(Arrays& arrays, const Handles& h, megamoe::RouterArgs& r, const PyArray& counter) {
  arrays.input(h.e_score_correction_bias, r.e_score_correction_bias);
  arrays.output(h.topk_weights, r.topk_weights);
  arrays.output(h.topk_ids, r.topk_ids);
  arrays.input(h.tid2eid, r.tid2eid);
  arrays.input(h.input_ids, r.input_ids);
  arrays.input(h.logical_to_physical_map, r.logical_to_physical_map);
  arrays.input(h.logical_replica_count, r.logical_replica_count);
  arrays.output(h.expert_load_view, r.expert_load_view);
  arrays.input(h.record_enabled, r.record_enabled);
  arrays.output(counter, r.nonfinite_count);
  // top_k defaults to the width of topk_ids; without a usable width, a valid placeholder
  // (E >= 1 is checked first) lets the library report what is wrong with topk_ids.
  r.top_k = h.top_k.value_or(r.topk_ids.ndim == 2 ? r.topk_ids.shape[1] : 1);
  r.routed_scaling_factor = as_float(h.routed_scaling_factor);
}

bool load_router(Arrays& arrays, const Handles& h, megamoe::RouterArgs& r, bool stop_if_empty,
                 const PyArray& counter) {
  if (arrays.input(h.router_logits, r.router_logits, stop_if_empty)) return false;
  load_router_options(arrays, h, r, counter);
  return true;
}

/// Imports the arrays of route's (and explain_route's) @p h into @p r; false when
/// router_logits has no rows (nothing to do).
bool load_route(Arrays& arrays, const Handles& h, megamoe::RouterArgs& r) {
  if (!load_router(arrays, h, r, true, h.nonfinite_count)) return false;
  arrays.input(h.is_padding, r.is_padding);
  r.enable_pdl = h.enable_pdl;
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_router(r); });
  }
  return true;
}

void route(const Handles& h) {
  Arrays arrays;
  megamoe::RouterArgs r;
  if (!load_route(arrays, h, r)) return;
  nb::gil_scoped_release release;
  megamoe::route(r, stream_of(h));
}

std::string explain_route(const Handles& h) {
  Arrays arrays;
  megamoe::RouterArgs r;
  if (!load_route(arrays, h, r)) return "nothing to do: router_logits has no rows (T == 0)";
  return megamoe::explain(r);
}

/// Imports the arrays of route_and_stage's (and explain_route_and_stage's) @p h into @p r
/// and @p a; false when the call has nothing to do. T is the router's (the logits' rows);
/// the staging half is read in full otherwise.
bool load_route_and_stage(Arrays& arrays, const Handles& h, megamoe::RouterArgs& r, megamoe::StageArgs& a) {
  if (!load_router(arrays, h, r, !h.full_buffer, h.logits_nonfinite_count)) return false;
  load_stage(arrays, h, a, true);
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_router(r, &a); });
  }
  return true;
}

void route_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::RouterArgs r;
  megamoe::StageArgs a;
  if (!load_route_and_stage(arrays, h, r, a)) return;
  nb::gil_scoped_release release;
  megamoe::route_and_stage(r, a, stream_of(h));
}

std::string explain_route_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::RouterArgs r;
  megamoe::StageArgs a;
  if (!load_route_and_stage(arrays, h, r, a)) return "nothing to do: router_logits has no rows (T == 0)";
  return megamoe::explain(r, a);
}

/// rmsnorm_and_stage: the norm's arrays into RmsNormArgs, the staging's into StageArgs (its
/// rows are the norm's: no hidden_states). A 2-D x without rows returns at once outside
/// full-buffer mode (the library reads T from x and returns then; nothing else is read).
bool load_norm(Arrays& arrays, const Handles& h, megamoe::RmsNormArgs& n, megamoe::StageArgs& a) {
  if (arrays.input(h.x, n.x, !h.full_buffer)) return false;
  arrays.input(h.residual, n.residual);
  arrays.input(h.weight, n.weight);
  n.eps = to_f32_arg(h.eps, "eps");
  arrays.output(h.y, n.y);
  arrays.output(h.residual_out, n.residual_out);
  load_stage(arrays, h, a, false, true);
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_rmsnorm(n, a); });
  }
  return true;
}

void rmsnorm_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::RmsNormArgs n;
  megamoe::StageArgs a;
  if (!load_norm(arrays, h, n, a)) return;
  nb::gil_scoped_release release;
  megamoe::rmsnorm_and_stage(n, a, stream_of(h));
}

std::string explain_rmsnorm_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::RmsNormArgs n;
  megamoe::StageArgs a;
  if (!load_norm(arrays, h, n, a)) return "nothing to do: x has no rows (T == 0)";
  return megamoe::explain(n, a);
}

/// gate_route_and_stage: the gate's arrays into GateArgs (y: hidden_states when None), the
/// router's but its logits into RouterArgs, the staging's into StageArgs (as route_and_stage).
/// A 2-D y without rows returns at once outside full-buffer mode (the library reads T from y).
bool load_gate(Arrays& arrays, const Handles& h, megamoe::GateArgs& g, megamoe::RouterArgs& r,
               megamoe::StageArgs& a) {
  const bool y_is_hidden = h.y.is_none();
  if (arrays.input(y_is_hidden ? h.hidden_states : h.y, g.y, !h.full_buffer)) return false;
  arrays.input(h.weight, g.weight);
  arrays.output(h.logits_out, g.logits_out);
  load_router_options(arrays, h, r, h.logits_nonfinite_count);
  load_stage(arrays, h, a, true, false, y_is_hidden ? &g.y : nullptr);
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_gate(g, r, &a); });
  }
  return true;
}

void gate_route_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::GateArgs g;
  megamoe::RouterArgs r;
  megamoe::StageArgs a;
  if (!load_gate(arrays, h, g, r, a)) return;
  nb::gil_scoped_release release;
  megamoe::gate_route_and_stage(g, r, a, stream_of(h));
}

std::string explain_gate_route_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::GateArgs g;
  megamoe::RouterArgs r;
  megamoe::StageArgs a;
  if (!load_gate(arrays, h, g, r, a)) return "nothing to do: hidden_states has no rows (T == 0)";
  return megamoe::explain(g, r, &a);
}

/// gate_and_route: the gate's arrays into GateArgs, the router's but its logits into
/// RouterArgs (with route's padding mask and PDL flag). A 2-D y without rows returns at once.
bool load_gate_route(Arrays& arrays, const Handles& h, megamoe::GateArgs& g, megamoe::RouterArgs& r) {
  if (arrays.input(h.y, g.y, true)) return false;
  arrays.input(h.weight, g.weight);
  arrays.output(h.logits_out, g.logits_out);
  load_router_options(arrays, h, r, h.nonfinite_count);
  arrays.input(h.is_padding, r.is_padding);
  r.enable_pdl = h.enable_pdl;
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_gate(g, r); });
  }
  return true;
}

void gate_and_route(const Handles& h) {
  Arrays arrays;
  megamoe::GateArgs g;
  megamoe::RouterArgs r;
  if (!load_gate_route(arrays, h, g, r)) return;
  nb::gil_scoped_release release;
  megamoe::gate_and_route(g, r, stream_of(h));
}

std::string explain_gate_and_route(const Handles& h) {
  Arrays arrays;
  megamoe::GateArgs g;
  megamoe::RouterArgs r;
  if (!load_gate_route(arrays, h, g, r)) return "nothing to do: y has no rows (T == 0)";
  return megamoe::explain(g, r);
}

/// mhc_pre_and_stage: mHC's arrays into MhcPreArgs, the staging's into StageArgs (its rows
/// are y: no hidden_states). A 2-D residual without rows returns at once outside
/// full-buffer mode (the library reads T from it and returns then; nothing else is read).
bool load_mhc(Arrays& arrays, const Handles& h, megamoe::MhcPreArgs& m, megamoe::StageArgs& a) {
  if (arrays.input(h.residual, m.residual, !h.full_buffer)) return false;
  arrays.input(h.fn, m.fn);
  arrays.input(h.hc_scale, m.hc_scale);
  arrays.input(h.hc_base, m.hc_base);
  arrays.input(h.norm_weight, m.norm_weight);
  arrays.input(h.pre_mix_in, m.pre_mix_in);
  m.rms_eps = to_f32_arg(h.rms_eps, "rms_eps");
  m.hc_pre_eps = to_f32_arg(h.hc_pre_eps, "hc_pre_eps");
  m.hc_sinkhorn_eps = to_f32_arg(h.hc_sinkhorn_eps, "hc_sinkhorn_eps");
  m.hc_post_mult_value = to_f32_arg(h.hc_post_mult_value, "hc_post_mult_value");
  m.norm_eps = to_f32_arg(h.norm_eps, "norm_eps");
  m.sinkhorn_repeat = h.sinkhorn_repeat;
  arrays.output(h.post_mix, m.post_mix);
  arrays.output(h.comb_mix, m.comb_mix);
  arrays.output(h.pre_mix, m.pre_mix);
  arrays.output(h.layer_input, m.layer_input);
  arrays.output(h.y, m.y);
  load_stage(arrays, h, a, false, true);
  if (!arrays.unrepresented().empty()) {
    raise_unrepresented(arrays.unrepresented(), [&] { megamoe::validate_mhc_pre(m, a); });
  }
  return true;
}

void mhc_pre_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::MhcPreArgs m;
  megamoe::StageArgs a;
  if (!load_mhc(arrays, h, m, a)) return;
  nb::gil_scoped_release release;
  megamoe::mhc_pre_and_stage(m, a, stream_of(h));
}

std::string explain_mhc_pre_and_stage(const Handles& h) {
  Arrays arrays;
  megamoe::MhcPreArgs m;
  megamoe::StageArgs a;
  if (!load_mhc(arrays, h, m, a)) return "nothing to do: residual has no rows (T == 0)";
  return megamoe::explain(m, a);
}

/// One TensorSpec as Python's (shape, dtype name).
nb::object spec_tuple(const megamoe::TensorSpec& t) {
  nb::object shape = t.ndim == 1 ? nb::object(nb::make_tuple(t.shape[0]))
                                 : nb::object(nb::make_tuple(t.shape[0], t.shape[1]));
  return nb::make_tuple(shape, megamoe::dtype_name(t.dtype));
}

nb::dict output_shapes(int64_t T, int64_t H, int64_t K, const QuantScheme& scheme,
                       std::optional<int64_t> shared_block_m) {
  const megamoe::OutputShapes o = megamoe::output_shapes(T, H, K, scheme, shared_block_m);
  auto opt = [](const std::optional<megamoe::TensorSpec>& t) {
    return t ? spec_tuple(*t) : nb::none();
  };
  nb::dict d;
  d["x_fp8"] = spec_tuple(o.x_q);
  d["x_sf"] = spec_tuple(o.x_sf);
  d["topk_idx_out"] = spec_tuple(o.topk_idx_out);
  d["topk_weights_out"] = spec_tuple(o.topk_weights_out);
  d["shared_x_sf"] = opt(o.shared_x_sf);
  d["x_scales"] = opt(o.x_scales);
  d["global_scale"] = opt(o.global_scale);
  return d;
}

/// Python's QuantScheme(has_scale2=True) without scale2 is a static second-level scale
/// (vLLM's QuantKey has a scale2 or not; one that exists is usually the static global scale).
megamoe::Scale2 resolve_scale2(bool has_scale2, std::optional<megamoe::Scale2> scale2) {
  if (!scale2) return has_scale2 ? megamoe::Scale2::kStatic : megamoe::Scale2::kNone;
  if (has_scale2 && *scale2 == megamoe::Scale2::kNone) {
    throw nb::value_error("megamoe: QuantScheme: has_scale2=True contradicts scale2=Scale2.NONE");
  }
  return *scale2;
}

/// The amax floor's bits for hashing, with the values operator== equates mapped together
/// (+0.0 and -0.0; every NaN).
uint32_t floor_key(float f) {
  if (f == 0.0f) return 0;
  if (std::isnan(f)) return 0x7FC00000u;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

nb::tuple scheme_state(const QuantScheme& q) {
  return nb::make_tuple(q.elem, q.scale, q.group_m, q.group_k, q.is_static, q.symmetric, q.scale2,
                        q.rounding, q.amax_floor);
}

/// megamoe._C.UnsupportedError (a RuntimeError): a valid request this build or backend
/// cannot serve (kUnsupported), so that callers can tell it from a failure and fall back.
PyObject* g_unsupported = nullptr;

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = e.code() == ErrorCode::kInvalidArgument ? PyExc_ValueError
                     : e.code() == ErrorCode::kUnsupported   ? g_unsupported
                                                             : PyExc_RuntimeError;
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

// DeepGEMM's MegaMoE buffers (buffers_binding.cpp).
void register_buffers(nb::module_& m);

NB_MODULE(_C, m) {
  m.doc() = "megamoe._C: native bindings of the megamoe C++ library (use the megamoe package).";
  g_unsupported = PyErr_NewExceptionWithDoc(
      "megamoe._C.UnsupportedError",
      "A valid request this build or backend cannot serve (e.g. CUDA tensors given to a build\n"
      "without CUDA, or a mode the CUDA backend does not stage yet); a RuntimeError.",
      PyExc_RuntimeError, nullptr);
  if (g_unsupported == nullptr) throw nb::python_error();
  m.attr("UnsupportedError") = nb::handle(g_unsupported);
  nb::register_exception_translator(&translate_error);
  // torch keeps QuantScheme (registered as a pytree constant) alive past interpreter
  // teardown; that is not a leak worth a warning at exit.
  nb::set_leak_warnings(false);

  nb::enum_<QuantElem>(m, "QuantElem", "Element type of the quantized values.")
      .value("FLOAT8_E4M3", QuantElem::kFloat8E4M3, "fp8 e4m3fn, one byte per value")
      .value("FLOAT8_E5M2", QuantElem::kFloat8E5M2, "fp8 e5m2, one byte per value (MXFP8 e5m2)")
      .value("INT8", QuantElem::kInt8, "int8 (rejected)")
      .value("FLOAT4_E2M1", QuantElem::kFloat4E2M1,
             "fp4 e2m1, two values per byte, low nibble = even column (MXFP4, NVFP4)")
      .value("BFLOAT16", QuantElem::kBFloat16, "bf16, two bytes per value, no scales (bf16 pass-through)");

  nb::enum_<ScaleType>(m, "ScaleType", "Type of the per-group scale factor.")
      .value("UE8M0", ScaleType::kUE8M0, "power-of-two exponent byte, packed 4 per int32")
      .value("FLOAT32", ScaleType::kFloat32, "plain fp32 scale")
      .value("FLOAT16", ScaleType::kFloat16, "fp16 scale (rejected)")
      .value("FLOAT8_E4M3", ScaleType::kFloat8E4M3, "fp8 e4m3 scale byte, packed 4 per int32 (NVFP4)")
      .value("NONE", ScaleType::kNone, "no scales (bf16 pass-through)");

  nb::enum_<megamoe::Scale2>(m, "Scale2", "The second-level scale of a scheme.")
      .value("NONE", megamoe::Scale2::kNone, "none (fp8, MXFP4)")
      .value("STATIC", megamoe::Scale2::kStatic,
             "a caller-given fp32 scalar, global_scale= (NVFP4 static)")
      .value("PER_TOKEN", megamoe::Scale2::kPerToken,
             "one fp32 per token, written to x_scales= (NVFP4 per-token)")
      .value("ONLINE", megamoe::Scale2::kOnline,
             "one fp32 for the tensor, computed and written to global_scale= (NVFP4 online)");

  nb::enum_<megamoe::Rounding>(m, "Rounding", "How a value exactly between two codes is rounded.")
      .value("DEFAULT", megamoe::Rounding::kDefault,
             "the element codec's reference rule: e4m3 / e5m2 nearest even, e2m1 toward zero")
      .value("NEAREST_EVEN", megamoe::Rounding::kNearestEven, "to the even code (IEEE, PTX cvt.rn)")
      .value("TIES_TOWARD_ZERO", megamoe::Rounding::kTiesTowardZero,
             "to the smaller magnitude (DeepGEMM's fp4 reference)");

  nb::class_<QuantScheme>(
      m, "QuantScheme",
      "A hidden-state quantization scheme, shaped like vLLM's QuantKey plus what FP4 needs.\n\n"
      "Staging accepts fp8 e4m3 (UE8M0 or fp32 scales, G dividing 128), MXFP8 e5m2 (UE8M0,\n"
      "G = 32), MXFP4 (UE8M0, G = 32, either tie rule) and NVFP4 (e4m3 scales, G = 16, static\n"
      "or per-token second-level scale), dynamic, symmetric, with a finite amax floor that is\n"
      "0 (a zero group's unit scale) or positive. Presets: mxfp8(), fp8_ue8m0_g128(),\n"
      "fp8_fp32_g128(), fp8_fp32_g32(), mxfp8_e5m2(), mxfp4(), nvfp4_static(),\n"
      "nvfp4_per_token(); with_amax_floor() changes the floor.")
      .def(
          "__init__",
          [](QuantScheme* self, QuantElem elem, ScaleType scale, nb::handle group_m, nb::handle group_k,
             bool is_static, bool symmetric, bool has_scale2, std::optional<megamoe::Scale2> scale2,
             megamoe::Rounding rounding, double amax_floor) {
            QuantScheme q{elem,
                          scale,
                          to_i64_arg(group_m, "group_m"),
                          to_i64_arg(group_k, "group_k"),
                          is_static,
                          symmetric,
                          resolve_scale2(has_scale2, scale2)};
            q.rounding = rounding;
            q.amax_floor = to_f32_arg(amax_floor, "amax_floor");
            new (self) QuantScheme(q);
          },
          nb::arg("elem") = QuantElem::kFloat8E4M3, nb::arg("scale") = ScaleType::kUE8M0,
          nb::arg("group_m").none() = 1, nb::arg("group_k").none() = 32, nb::arg("is_static") = false,
          nb::arg("symmetric") = true, nb::arg("has_scale2") = false, nb::kw_only(),
          nb::arg("scale2").none() = nb::none(), nb::arg("rounding") = megamoe::Rounding::kDefault,
          nb::arg("amax_floor") = 1e-4,
          "Build a scheme; the defaults give MXFP8 (fp8 e4m3, UE8M0 scales, groups of 1x32).\n"
          "scale2 (keyword) overrides has_scale2, which alone means Scale2.STATIC.")
      .def_rw("elem", &QuantScheme::elem, "Quantized element type (QuantElem).")
      .def_rw("scale", &QuantScheme::scale, "Scale type (ScaleType).")
      .def_prop_rw(
          "group_m", [](const QuantScheme& q) { return q.group_m; },
          [](QuantScheme& q, nb::handle v) { q.group_m = to_i64_arg(v, "group_m"); },
          nb::for_setter(nb::arg("value").none()), "Group rows (1 = per token).")
      .def_prop_rw(
          "group_k", [](const QuantScheme& q) { return q.group_k; },
          [](QuantScheme& q, nb::handle v) { q.group_k = to_i64_arg(v, "group_k"); },
          nb::for_setter(nb::arg("value").none()), "Group columns G along the hidden dimension (<= 0: per tensor / per token).")
      .def_rw("is_static", &QuantScheme::is_static, "Static (precomputed) scales.")
      .def_rw("symmetric", &QuantScheme::symmetric, "Symmetric quantization (no zero point).")
      .def_rw("scale2", &QuantScheme::scale2, "Second-level scale (Scale2).")
      .def_rw("rounding", &QuantScheme::rounding, "Tie rule of the element encoding (Rounding).")
      .def_prop_rw(
          "amax_floor", [](const QuantScheme& q) { return q.amax_floor; },
          [](QuantScheme& q, double v) { q.amax_floor = to_f32_arg(v, "amax_floor"); },
          "Lower bound of a group's amax (fp32; 1e-4 by default, 1e-10 for SM90 / SGLang).")
      .def_prop_rw(
          "has_scale2", [](const QuantScheme& q) { return q.scale2 != megamoe::Scale2::kNone; },
          [](QuantScheme& q, bool v) {
            if (!v) q.scale2 = megamoe::Scale2::kNone;
            else if (q.scale2 == megamoe::Scale2::kNone) q.scale2 = megamoe::Scale2::kStatic;
          },
          "A second-level scale exists (setting True keeps a per-token one, else makes it static).")
      .def_prop_ro("ue8m0", &QuantScheme::ue8m0, "True for UE8M0 scales.")
      .def_prop_ro("name", [](const QuantScheme& q) { return megamoe::scheme_name(q); },
                   "Short name (\"mxfp8\", \"mxfp4_rne\", \"nvfp4_static\", ...; \"unsupported\").")
      .def_static("mxfp8", &QuantScheme::mxfp8, "fp8 e4m3 + UE8M0 scales, G = 32 (the default).")
      .def_static("fp8_ue8m0_g128", &QuantScheme::fp8_ue8m0_g128, "fp8 e4m3 + UE8M0 scales, G = 128.")
      .def_static("fp8_fp32_g128", &QuantScheme::fp8_fp32_g128,
                  "fp8 e4m3 + fp32 scales, G = 128 (Hopper / DeepGEMM SM90).")
      .def_static("fp8_fp32_g32", &QuantScheme::fp8_fp32_g32, "fp8 e4m3 + fp32 scales, G = 32.")
      .def_static("bf16", &QuantScheme::bf16,
                  "bf16 pass-through: x_q is the input as bf16, no scales (scale NONE, group_k 0).")
      .def_static("mxfp8_e5m2", &QuantScheme::mxfp8_e5m2,
                  "fp8 e5m2 + UE8M0 scales, G = 32 (FlashInfer's mxfp8_e5m2: scale from amax / 57344).")
      .def_static("mxfp4", &QuantScheme::mxfp4, nb::arg("rounding") = megamoe::Rounding::kTiesTowardZero,
                  "fp4 e2m1 + UE8M0 scales, G = 32; ties toward zero (DeepGEMM) unless rounding says.")
      .def_static("nvfp4_static", &QuantScheme::nvfp4_static,
                  "NVFP4 (e4m3 scales, G = 16) with a static global scale (global_scale=).")
      .def_static("nvfp4_per_token", &QuantScheme::nvfp4_per_token,
                  "NVFP4 (e4m3 scales, G = 16) with per-token second-level scales (x_scales=).")
      .def_static("nvfp4_online", &QuantScheme::nvfp4_online,
                  "NVFP4 (e4m3 scales, G = 16) with a global scale computed from the whole tensor\n"
                  "(max|x| / 2688) and written to global_scale=, then NVFP4 static's groups.")
      .def(
          "with_amax_floor",
          [](const QuantScheme& q, double floor) { return q.with_amax_floor(to_f32_arg(floor, "amax_floor")); },
          nb::arg("floor"), "This scheme with another amax floor (e.g. 1e-10 for the SM90 pre-dispatch).")
      .def(nb::self == nb::self, "Field-wise equality.")
      .def(
          "__ne__", [](const QuantScheme& a, const QuantScheme& b) { return !(a == b); },
          nb::is_operator(), "Field-wise inequality.")
      .def(
          "__hash__",
          [](const QuantScheme& q) {
            return nb::hash(nb::make_tuple(static_cast<int>(q.elem), static_cast<int>(q.scale),
                                           q.group_m, q.group_k, q.is_static, q.symmetric,
                                           static_cast<int>(q.scale2), static_cast<int>(q.rounding),
                                           floor_key(q.amax_floor)));
          },
          "Hash of the fields (consistent with ==).")
      .def("__repr__", [](const QuantScheme& q) { return megamoe::to_string(q); },
           "Text naming every field, as used in error messages.")
      .def("__getstate__", &scheme_state, "Pickle support.")
      .def(
          "__setstate__",
          [](QuantScheme& q, const nb::tuple& s) {
            // 7 fields: pickles of megamoe 0.2 (a has_scale2 bool); 9: every field.
            if (s.size() != 7 && s.size() != 9) throw nb::value_error("megamoe: QuantScheme: bad pickle state");
            const bool old = s.size() == 7;
            QuantScheme r{nb::cast<QuantElem>(s[0]), nb::cast<ScaleType>(s[1]), nb::cast<int64_t>(s[2]),
                          nb::cast<int64_t>(s[3]),   nb::cast<bool>(s[4]),      nb::cast<bool>(s[5])};
            r.scale2 = old ? resolve_scale2(nb::cast<bool>(s[6]), std::nullopt) : nb::cast<megamoe::Scale2>(s[6]);
            if (!old) {
              r.rounding = nb::cast<megamoe::Rounding>(s[7]);
              r.amax_floor = nb::cast<float>(s[8]);
            }
            new (&q) QuantScheme(r);
          },
          "Pickle support.");

  m.def("check_scheme", &megamoe::check_scheme, nb::arg("scheme"),
        "Raise ValueError naming the scheme unless staging accepts it.");
  m.def("has_cuda_backend", &megamoe::has_cuda_backend,
        "True when this build contains the CUDA backend.");
  m.def("version", &megamoe::version, "Library version, \"MAJOR.MINOR.PATCH\".");
  m.def("output_shapes", &output_shapes, nb::arg("T"), nb::arg("H"), nb::arg("K"), nb::arg("scheme"),
        nb::arg("shared_block_m").none() = nb::none(),
        "megamoe::output_shapes as {name: (shape, dtype name) or None} (see megamoe.output_shapes).");

  // The staging entry points: their parameters are the rows of their argument tables.
  def_entry(m, "prepare_inputs", kPrepare, &prepare_inputs,
            "Stage one MoE layer's inputs into caller-owned outputs (see megamoe.prepare_megamoe_inputs).\n\n"
            "Arrays are taken through DLPack or the buffer protocol (inputs may be read-only,\n"
            "outputs must be writable); x_fp8 may be uint8. CUDA work is launched on `stream`\n"
            "(a cudaStream_t as int, 0 = legacy default stream) with the GIL released.\n"
            "A 2-D hidden_states without rows returns at once, before any other argument is read,\n"
            "unless full_buffer is set (the top-k tail is filled then).\n"
            "TypeError: an array argument is no array; ValueError: an invalid argument (including\n"
            "arrays megamoe cannot take, e.g. big-endian, structured or object dtypes).");
  def_entry(m, "explain", kPrepare, &explain,
            "What prepare_inputs would launch for these arguments, as text (validated, nothing run;\n"
            "stream is ignored).");
  def_entry(m, "stage_routing", kRouting, &stage_routing,
            "Routing-only staging (see megamoe.stage_megamoe_routing): top-k repack, padding mask,\n"
            "full-buffer tail and routed scaling; topk_ids without rows returns at once unless\n"
            "full_buffer is set.");
  def_entry(m, "route", kRoute, &route,
            "The fused DeepSeek-V4 router alone (see megamoe.route): router_logits [T, E] to the\n"
            "public top-k topk_weights / topk_ids, with hash layers, EPLB and the logits' non-finite\n"
            "counter. top_k None: topk_ids.shape[1]; routed_scaling_factor None: no scaling. router_logits\n"
            "without rows returns at once.");
  def_entry(m, "route_and_stage", kRouteAndStage, &route_and_stage,
            "Route and stage in one call (see megamoe.route_and_stage): the router's top-k\n"
            "(topk_weights / topk_ids) and the staging of prepare_inputs with it as the top-k input.\n"
            "router_logits without rows returns at once unless full_buffer is set.");
  def_entry(m, "rmsnorm_and_stage", kNormAndStage, &rmsnorm_and_stage,
            "RMSNorm (optional residual add) and stage the normalized rows in one call (see\n"
            "megamoe.rmsnorm_and_stage): y = the normalized x (written when given), then the staging\n"
            "of prepare_inputs with y as hidden_states. x without rows returns at once unless\n"
            "full_buffer is set.");
  def_entry(m, "explain_routing", kRouting, &explain_routing,
            "What stage_routing would launch for these arguments, as text (validated, nothing run;\n"
            "stream is ignored).");
  def_entry(m, "explain_route", kRoute, &explain_route,
            "What route would launch for these arguments, as text (validated, nothing run; stream\n"
            "is ignored).");
  def_entry(m, "explain_route_and_stage", kRouteAndStage, &explain_route_and_stage,
            "What route_and_stage would launch for these arguments, as text (validated, nothing run;\n"
            "stream is ignored).");
  def_entry(m, "gate_route_and_stage", kGateRouteAndStage, &gate_route_and_stage,
            "Gate, route and stage in one call (see megamoe.gate_route_and_stage): the router logits\n"
            "computed from y (None: hidden_states) and the gate weight in the contract's fixed fp32\n"
            "order (written to logits_out when given), then route_and_stage on them. y without rows\n"
            "returns at once unless full_buffer is set. CPU backend only for now (CUDA tensors:\n"
            "UnsupportedError).");
  def_entry(m, "explain_gate_route_and_stage", kGateRouteAndStage, &explain_gate_route_and_stage,
            "What gate_route_and_stage would run for these arguments, as text (validated, nothing\n"
            "run; stream is ignored).");
  def_entry(m, "gate_and_route", kGateAndRoute, &gate_and_route,
            "Gate and route in one call (see megamoe.gate_and_route): the logits of\n"
            "gate_route_and_stage, then route on them; nothing is staged. y without rows returns at\n"
            "once. CPU backend only for now (CUDA tensors: UnsupportedError).");
  def_entry(m, "explain_gate_and_route", kGateAndRoute, &explain_gate_and_route,
            "What gate_and_route would run for these arguments, as text (validated, nothing run;\n"
            "stream is ignored).");
  def_entry(m, "explain_rmsnorm_and_stage", kNormAndStage, &explain_rmsnorm_and_stage,
            "What rmsnorm_and_stage would launch for these arguments, as text (validated, nothing\n"
            "run; stream is ignored).");
  def_entry(m, "mhc_pre_and_stage", kMhcAndStage, &mhc_pre_and_stage,
            "DeepSeek-V4's mHC pre step, RMSNorm and staging in one call (see\n"
            "megamoe.mhc_pre_and_stage): post_mix, comb_mix (and pre_mix, layer_input, y when given),\n"
            "then the staging of prepare_inputs with y as hidden_states. residual ([T, hc * H]) without\n"
            "rows returns at once unless full_buffer is set. CPU backend only for now (CUDA tensors:\n"
            "UnsupportedError).");
  def_entry(m, "explain_mhc_pre_and_stage", kMhcAndStage, &explain_mhc_pre_and_stage,
            "What mhc_pre_and_stage would run for these arguments, as text (validated, nothing run;\n"
            "stream is ignored).");
  m.def("set_cpu_threads", &megamoe::set_cpu_threads, nb::arg("n"),
        "Threads one CPU staging call may use, the caller included (0 = one per CPU).");
  m.def("cpu_threads", &megamoe::cpu_threads, "Threads a large CPU staging call uses now (>= 1).");
  register_buffers(m);
}
