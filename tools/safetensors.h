// safetensors.h: read and write .safetensors files (8-byte little-endian header length,
// a JSON header, then the raw tensor bytes) for the megamoe-stage CLI.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "megamoe/tensor.h"

namespace megamoe_cli {

/// A usage or input error: the CLI prints the message and exits with status 2.
class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A host tensor in safetensors terms: dtype name ("BF16", "I32", ...), shape, raw bytes.
struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  ///< row-major, little-endian

  Tensor() = default;
  /// Zero-filled tensor of @p dtype (a name st_dtype_size knows) and @p shape.
  Tensor(std::string dtype, std::vector<int64_t> shape);
  int64_t numel() const;
  /// "[4096, 7168]".
  std::string shape_str() const;
  /// Contiguous CPU view for megamoe (dtype must map to a megamoe::DType).
  megamoe::TensorRef ref();
};

/// Bytes per element of a safetensors dtype name; 0 when unknown.
int64_t st_dtype_size(const std::string& dtype);
/// safetensors name of a megamoe dtype ("BF16", "F8_E4M3", ...).
const char* st_dtype_name(megamoe::DType dtype);

/// Read every tensor of @p path. Throws CliError naming the file (and tensor) on a missing
/// or truncated file, a bad header length, invalid JSON, a malformed entry, data offsets
/// out of range or a byte count that does not match dtype and shape.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

/// Write @p tensors (in this order, contiguous, header padded to 8 bytes) to @p path.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace megamoe_cli
