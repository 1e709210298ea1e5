/// @file dlpack.h
/// @brief megamoe::from_dlpack(): a TensorRef for a DLPack DLTensor (header-only; include
/// <dlpack/dlpack.h> from DLPack 0.6 or later, e.g. Debian's libdlpack-dev, PyTorch's or
/// nanobind's copy, before or through this header).
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "megamoe/error.h"
#include "megamoe/tensor.h"

namespace megamoe {

/// @brief The TensorRef describing @p t (data + byte_offset, sizes, strides in elements; a
/// null strides array means row-major contiguous). Dtypes: float16/32, bfloat16, int8/32/64,
/// uint8, bool and float8_e4m3fn (DLPack 1.0 codes, matched by value so older headers work).
/// Devices: CPU and CUDA host-pinned memory map to the CPU, CUDA and CUDA managed memory to
/// the CUDA device. Anything else throws megamoe::Error(kInvalidArgument) naming @p name.
inline TensorRef from_dlpack(const DLTensor& t, const char* name = "tensor") {
  auto fail = [&](const std::string& what) -> void {
    throw Error(ErrorCode::kInvalidArgument, std::string("megamoe: ") + name + ": " + what);
  };
  constexpr int kBool = 6, kFloat8E4M3FN = 10, kFloat8E5M2 = 12;  // DLPack >= 0.8 / 1.0 enum values
  const int code = static_cast<int>(t.dtype.code), bits = t.dtype.bits;
  DType dt = DType::kUInt8;
  bool known = t.dtype.lanes == 1;
  if (known) {
    if (code == kDLFloat && bits == 16) dt = DType::kFloat16;
    else if (code == kDLFloat && bits == 32) dt = DType::kFloat32;
    else if (code == kDLBfloat && bits == 16) dt = DType::kBFloat16;
    else if (code == kDLInt && bits == 8) dt = DType::kInt8;
    else if (code == kDLInt && bits == 32) dt = DType::kInt32;
    else if (code == kDLInt && bits == 64) dt = DType::kInt64;
    else if (code == kDLUInt && bits == 8) dt = DType::kUInt8;
    else if (code == kBool && bits == 8) dt = DType::kBool;
    else if (code == kFloat8E4M3FN && bits == 8) dt = DType::kFloat8E4M3;
    else if (code == kFloat8E5M2 && bits == 8) dt = DType::kFloat8E5M2;
    else known = false;
  }
  if (!known) {
    fail("unsupported DLPack dtype (code " + std::to_string(code) + ", " + std::to_string(bits) + " bits, " +
         std::to_string(t.dtype.lanes) + " lanes)");
  }
  Device dev;
  switch (static_cast<int>(t.device.device_type)) {
    case kDLCPU:
    case kDLCUDAHost: dev = Device::cpu(); break;
    case kDLCUDA:
    case kDLCUDAManaged: dev = Device::cuda(t.device.device_id); break;
    default: fail("unsupported DLPack device type " + std::to_string(static_cast<int>(t.device.device_type)));
  }
  if (t.ndim < 0 || t.ndim > TensorRef::kMaxRank) {
    fail("expected a tensor of rank <= 2, got rank " + std::to_string(t.ndim));
  }
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  return TensorRef::from_arrays(data, dt, t.ndim, t.shape, t.strides, dev);
}

}  // namespace megamoe
