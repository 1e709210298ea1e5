/// @file tensor.h
/// @brief A non-owning reference to a strided tensor on the host or a CUDA device.
///
/// megamoe never allocates or frees caller memory: every input and output is described by
/// a TensorRef (pointer, dtype, shape, strides in *elements*, device). Any strides are
/// accepted, including zero (for inputs), negative and transposed ones; the backends take a
/// fast path when rows are contiguous and 16-byte aligned and a general path otherwise.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace megamoe {

/// @brief Element types that appear in the staging contract.
enum class DType : uint8_t {
  kBFloat16,     ///< bfloat16 (hidden states, top-k weights)
  kFloat16,      ///< IEEE binary16 (hidden states, top-k weights)
  kFloat32,      ///< IEEE binary32 (hidden states, weights, fp32 scales)
  kFloat8E4M3,   ///< float8 e4m3fn, one byte (quantized activations)
  kUInt8,        ///< raw bytes: accepted for x_q (NumPy has no fp8) and is_padding
  kBool,         ///< one byte, nonzero = true (is_padding)
  kInt32,        ///< int32 (top-k ids, packed UE8M0 scale words)
  kInt64,        ///< int64 (top-k ids, non-finite counter)
  kInt8,         ///< int8: accepted for packed fp4 x_q (vLLM's MXFP4 buffers)
  kFloat8E5M2,   ///< float8 e5m2, one byte (quantized activations of MXFP8 e5m2)
};

/// @brief Size of one element of @p t in bytes.
int64_t dtype_size(DType t) noexcept;
/// @brief Lower-case name of @p t ("bfloat16", "float8_e4m3fn", ...).
const char* dtype_name(DType t) noexcept;

/// @brief Where a tensor's memory lives.
struct Device {
  /// @brief Memory kind.
  enum class Type : uint8_t { kCPU, kCUDA };
  Type type = Type::kCPU;  ///< host or CUDA device memory
  int index = 0;           ///< CUDA device ordinal (0 for the host)

  /// @brief Host memory.
  static constexpr Device cpu() noexcept { return Device{Type::kCPU, 0}; }
  /// @brief Memory of CUDA device @p i.
  static constexpr Device cuda(int i = 0) noexcept { return Device{Type::kCUDA, i}; }
  /// @brief Same type and ordinal.
  bool operator==(const Device& o) const noexcept { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const noexcept { return !(*this == o); }
};

/// @brief "cpu" or "cuda:N".
std::string to_string(const Device& d);

/// @brief Non-owning view of a tensor of rank <= 2 (all tensors of the staging contract).
struct TensorRef {
  static constexpr int kMaxRank = 2;  ///< highest rank the contract uses

  void* data = nullptr;        ///< address of element [0, 0]; any address (unaligned is slower)
  DType dtype = DType::kFloat32;
  int ndim = 0;                ///< rank, 0..kMaxRank
  int64_t shape[kMaxRank] = {0, 0};    ///< sizes
  int64_t strides[kMaxRank] = {0, 0};  ///< strides in elements (not bytes); any sign
  Device device{};

  TensorRef() = default;
  /// @brief A tensor with explicit strides (in elements).
  TensorRef(void* ptr, DType dt, std::initializer_list<int64_t> shp,
            std::initializer_list<int64_t> str, Device dev = Device::cpu());
  /// @brief A contiguous row-major tensor.
  TensorRef(void* ptr, DType dt, std::initializer_list<int64_t> shp, Device dev = Device::cpu());
  /// @brief A tensor from runtime arrays (e.g. another framework's sizes and strides):
  /// @p ndim sizes at @p shape and strides in elements at @p strides (nullptr: row-major
  /// contiguous). A rank above kMaxRank gives a tensor the validator rejects by rank.
  static TensorRef from_arrays(void* ptr, DType dt, int ndim, const int64_t* shape, const int64_t* strides,
                               Device dev = Device::cpu());

  /// @brief Number of elements (product of the shape; 1 for rank 0; INT64_MAX when the
  /// product overflows or a size is negative, so it never looks small).
  int64_t numel() const noexcept;
  /// @brief Shape as text, e.g. "(4096, 7168)".
  std::string shape_str() const;
  /// @brief True when strides describe a dense row-major layout.
  bool is_contiguous() const noexcept;
};

}  // namespace megamoe
