// safetensors.h: read and write .safetensors files (8-byte little-endian header length,
// a JSON header, then the raw tensor bytes) for the megamoe-stage CLI.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checked.h"
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
  /// Zero-filled tensor of @p dtype (a name st_dtype_size knows) and @p shape. Throws
  /// CliError naming @p what ("tensor 'x_sf'") when a size is negative, the byte count
  /// does not fit in int64, or the host cannot allocate it.
  Tensor(std::string dtype, std::vector<int64_t> shape, const std::string& what);
  /// Product of the sizes; throws CliError when one is negative or it does not fit in int64.
  int64_t numel() const;
  /// "[4096, 7168]".
  std::string shape_str() const;
  /// Contiguous CPU view for megamoe (dtype must map to a megamoe::DType).
  megamoe::TensorRef ref();
};

/// Longest piece of file-provided text (JSON, a name, a dtype, a parser message) that a
/// message repeats: a header field can be up to 100 MiB.
constexpr size_t kMaxQuotedBytes = 200;
/// @p s, cut to kMaxQuotedBytes bytes followed by "... (<full length> bytes)" when longer.
std::string clip(const std::string& s);

/// Bytes per element of a safetensors dtype name; 0 when unknown.
int64_t st_dtype_size(const std::string& dtype);
/// Element count of @p shape; overflowed when a size is negative or the product does not fit.
Checked shape_numel(const std::vector<int64_t>& shape);
/// The value of @p v; throws CliError "<what> does not fit in int64" when it overflowed.
int64_t checked_value(Checked v, const std::string& what);
/// Resize @p buf to @p bytes zero bytes; throws CliError naming @p what when the host
/// cannot allocate them (instead of std::bad_alloc or std::length_error).
void allocate_bytes(std::vector<uint8_t>& buf, int64_t bytes, const std::string& what);

/// Read every tensor of @p path. Throws CliError naming the file (and tensor) on a missing
/// file, a directory or other file that is not regular (checked without opening it: a FIFO
/// would block), a truncated file or short read, a bad header length, invalid JSON or JSON
/// nested deeper than 64 levels, a malformed entry, data offsets out of range or a byte
/// count that does not equal dtype size * shape exactly. File text quoted in a message is
/// cut to kMaxQuotedBytes.
/// With @p metadata, the header's "__metadata__" string entries are stored there.
std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata = nullptr);

/// Write @p tensors (in this order, contiguous, header padded to 8 bytes) to @p path.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace megamoe_cli
