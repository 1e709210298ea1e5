#include <cstdint>
#include <string>

#include "megamoe/quant.h"
#include "megamoe/tensor.h"
#include "megamoe/version.h"

namespace megamoe {

const char* version() noexcept { return MEGAMOE_VERSION_STRING; }

int64_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool: return 1;
  }
  return 1;
}

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kInt8: return "int8";
  }
  return "unknown";
}

std::string to_string(const Device& d) {
  switch (d.type) {
    case Device::Type::kCPU: return d.index == 0 ? std::string("cpu") : "cpu:" + std::to_string(d.index);
    case Device::Type::kCUDA: return "cuda:" + std::to_string(d.index);
  }
  return "unknown device type " + std::to_string(static_cast<int>(d.type)) + ":" + std::to_string(d.index);
}

TensorRef::TensorRef(void* ptr, DType dt, std::initializer_list<int64_t> shp,
                     std::initializer_list<int64_t> str, Device dev)
    : data(ptr), dtype(dt), ndim(static_cast<int>(shp.size())), device(dev) {
  int i = 0;
  for (int64_t s : shp) {
    if (i < kMaxRank) shape[i] = s;
    ++i;
  }
  i = 0;
  for (int64_t s : str) {
    if (i < kMaxRank) strides[i] = s;
    ++i;
  }
  if (ndim > kMaxRank || static_cast<int>(str.size()) != ndim) ndim = -1;  // rejected later
}

TensorRef::TensorRef(void* ptr, DType dt, std::initializer_list<int64_t> shp, Device dev)
    : data(ptr), dtype(dt), ndim(static_cast<int>(shp.size())), device(dev) {
  int i = 0;
  for (int64_t s : shp) {
    if (i < kMaxRank) shape[i] = s;
    ++i;
  }
  if (ndim > kMaxRank) {
    ndim = -1;
    return;
  }
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = st;
    if (__builtin_mul_overflow(st, shape[d], &st)) st = INT64_MAX;  // the validator rejects the shape
  }
}

TensorRef TensorRef::from_arrays(void* ptr, DType dt, int nd, const int64_t* shp, const int64_t* str,
                                 Device dev) {
  TensorRef t;
  t.data = ptr;
  t.dtype = dt;
  t.device = dev;
  if (nd < 0 || nd > kMaxRank || (nd > 0 && shp == nullptr)) {
    t.ndim = nd < 0 || nd > kMaxRank ? nd : -1;  // rejected by rank later
    return t;
  }
  t.ndim = nd;
  for (int d = 0; d < nd; ++d) t.shape[d] = shp[d];
  if (str != nullptr) {
    for (int d = 0; d < nd; ++d) t.strides[d] = str[d];
  } else {
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; --d) {
      t.strides[d] = st;
      if (__builtin_mul_overflow(st, t.shape[d], &st)) st = INT64_MAX;  // the validator rejects the shape
    }
  }
  return t;
}

int64_t TensorRef::numel() const noexcept {
  // Saturating: a shape whose product overflows must never look small (or empty) to a
  // null-pointer or size check; the validator rejects such shapes by name.
  int64_t n = 1;
  for (int d = 0; d < ndim && d < kMaxRank; ++d) {
    if (shape[d] < 0) return INT64_MAX;  // before the zero test: (0, -1) is not empty
  }
  for (int d = 0; d < ndim && d < kMaxRank; ++d) {
    if (shape[d] == 0) return 0;
  }
  for (int d = 0; d < ndim && d < kMaxRank; ++d) {
    if (__builtin_mul_overflow(n, shape[d], &n)) return INT64_MAX;
  }
  return n;
}

std::string TensorRef::shape_str() const {
  // A rank the contract does not use (from_arrays keeps it for the error message) has no
  // sizes stored beyond kMaxRank.
  if (ndim < 0 || ndim > kMaxRank) return "(a " + std::to_string(ndim) + "-D shape)";
  std::string s = "(";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  if (ndim == 1) s += ",";
  return s + ")";
}

bool TensorRef::is_contiguous() const noexcept {
  if (ndim < 0 || ndim > kMaxRank) return false;
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != st) return false;
    if (__builtin_mul_overflow(st, shape[d], &st)) return false;
  }
  return true;
}

}  // namespace megamoe
