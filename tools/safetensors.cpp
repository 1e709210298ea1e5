// safetensors.cpp: safetensors reader/writer with precise errors (see safetensors.h).
#include "safetensors.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace megamoe_cli {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  const char* name;
  int64_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"I64", 8},  {"U64", 8}, {"F64", 8}};

constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the safetensors format's own limit
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
/// Deepest JSON nesting a header may have. A valid header nests 3 levels (object, entry,
/// shape); the cap keeps every recursive walk of the parsed value (dump, comparison) shallow.
constexpr int kMaxJsonDepth = 64;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CliError(path + ": " + what);
}

/// ": <strerror(errno)>", or nothing when the stream failed without setting errno.
std::string errno_text() { return errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(); }

/// Compact JSON text of @p j, at most about kMaxQuotedBytes bytes: arrays and objects stop at the
/// first element past the budget ("..."), so a huge value costs no more than its start.
/// Recursion is bounded by the header's checked depth and, in any case, by the budget.
void dump_bounded(const json& j, std::string& out, int depth = 0) {
  if (out.size() > kMaxQuotedBytes || depth > kMaxJsonDepth) {
    out += "...";
    return;
  }
  if (!j.is_structured()) {
    // Strings are the only scalars of unbounded length.
    out += clip(j.dump(-1, ' ', false, json::error_handler_t::replace));
    return;
  }
  const bool obj = j.is_object();
  out += obj ? '{' : '[';
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (out.size() > kMaxQuotedBytes) {
      out += "...";
      break;
    }
    if (obj) out += clip(json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace)) + ": ";
    dump_bounded(*it, out, depth + 1);
  }
  out += obj ? '}' : ']';
}

std::string dump_bounded(const json& j) {
  std::string s;
  dump_bounded(j, s);
  return s;
}

/// Reject a header nested deeper than kMaxJsonDepth before it is parsed: the parser would
/// build (and later walk) the whole nested value. Brackets inside strings do not count.
void check_depth(const std::string& path, const std::string& header) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < header.size(); ++i) {
    const char c = header[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        fail(path, "invalid JSON header: nested deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels at byte " + std::to_string(i) + " of the header (a safetensors header nests 3)");
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // an unbalanced bracket is the parser's to report
    }
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

/// Parse one header entry into dtype, shape and [begin, end) offsets.
void parse_entry(const std::string& path, const std::string& name, const json& e,
                 uint64_t data_size, Tensor& t, uint64_t& begin, uint64_t& end) {
  const std::string where = "tensor '" + clip(name) + "': ";
  if (!e.is_object()) fail(path, where + "expected a JSON object, got " + e.type_name());
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) fail(path, where + "expected a string 'dtype'");
  t.dtype = dt->get<std::string>();
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) fail(path, where + "expected an array 'shape'");
  bool sizes_fit = true;
  for (const json& d : *sh) {
    // nlohmann keeps non-negative integers as unsigned; negative ones are signed.
    if (!d.is_number_unsigned()) {
      fail(path, where + "expected non-negative integer sizes in 'shape', got " + dump_bounded(*sh));
    }
    const uint64_t n = d.get<uint64_t>();
    sizes_fit = sizes_fit && n <= static_cast<uint64_t>(kInt64Max);
    t.shape.push_back(static_cast<int64_t>(n));
  }
  const Checked numel =
      sizes_fit ? shape_numel(t.shape) : Checked::overflow();
  if (!numel.ok()) fail(path, where + "shape too large: " + dump_bounded(*sh) + " has more than 2^63 - 1 elements");
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    fail(path, where + "expected 'data_offsets' [begin, end] of non-negative integers");
  }
  begin = (*off)[0].get<uint64_t>();
  end = (*off)[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    fail(path, where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] out of range: the data section has " + std::to_string(data_size) +
                   " bytes (truncated file?)");
  }
  const int64_t es = st_dtype_size(t.dtype);
  if (es == 0) return;  // a dtype megamoe does not read: load_inputs names it if it matters
  const Checked need = numel * es;
  // end - begin <= data_size < 2^63 (the file size came from a signed stream offset).
  if (!need.ok() || static_cast<uint64_t>(need.value()) != end - begin) {
    fail(path, where + "data_offsets span " + std::to_string(end - begin) + " bytes, but dtype " +
                   t.dtype + " with shape " + clip(shape_text(t.shape)) + " needs " +
                   (need.ok() ? std::to_string(need.value()) + " bytes"
                              : std::string("more than 2^63 - 1 bytes")));
  }
}

/// Read exactly @p n bytes at @p offset of @p f into @p dst; @p what names them in errors.
void read_exact(std::ifstream& f, const std::string& path, uint64_t offset, void* dst, uint64_t n,
                const std::string& what) {
  if (n == 0) return;  // dst may be the null data() of an empty buffer
  f.clear();
  f.seekg(static_cast<std::streamoff>(offset));
  if (!f) fail(path, what + ": cannot seek to byte " + std::to_string(offset));
  errno = 0;
  f.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  const auto got = static_cast<uint64_t>(f.gcount());
  if (got == n) return;
  if (f.eof()) {
    fail(path, what + ": unexpected end of file after " + std::to_string(offset + got) +
                   " bytes (needed " + std::to_string(offset + n) + ")");
  }
  fail(path, what + ": read error after " + std::to_string(offset + got) + " bytes" + errno_text());
}

}  // namespace

Tensor::Tensor(std::string dt, std::vector<int64_t> shp, const std::string& what)
    : dtype(std::move(dt)), shape(std::move(shp)) {
  const int64_t es = st_dtype_size(dtype);
  if (es == 0) throw CliError("internal: " + what + " has unknown dtype " + dtype);
  for (int64_t d : shape) {
    if (d < 0) throw CliError(what + ": expected non-negative sizes, got shape " + shape_text(shape));
  }
  const std::string type = dtype + " " + shape_text(shape);
  const int64_t bytes = checked_value(shape_numel(shape) * es, what + ": the byte count of " + type);
  allocate_bytes(data, bytes, what + " (" + type + ")");
}

int64_t Tensor::numel() const {
  return checked_value(shape_numel(shape), "the element count of shape " + shape_text(shape));
}

std::string Tensor::shape_str() const { return shape_text(shape); }

megamoe::TensorRef Tensor::ref() {
  using megamoe::DType;
  static const std::map<std::string, DType> kMap = {
      {"BF16", DType::kBFloat16}, {"F16", DType::kFloat16}, {"F32", DType::kFloat32},
      {"F8_E4M3", DType::kFloat8E4M3}, {"F8_E5M2", DType::kFloat8E5M2}, {"U8", DType::kUInt8}, {"BOOL", DType::kBool},
      {"I32", DType::kInt32}, {"I64", DType::kInt64}};
  auto it = kMap.find(dtype);
  if (it == kMap.end()) throw CliError("internal: dtype " + dtype + " has no megamoe equivalent");
  if (shape.size() == 1) return megamoe::TensorRef(data.data(), it->second, {shape[0]});
  if (shape.size() == 2) return megamoe::TensorRef(data.data(), it->second, {shape[0], shape[1]});
  throw CliError("internal: rank " + std::to_string(shape.size()) + " tensor passed to megamoe");
}

std::string clip(const std::string& s) {
  if (s.size() <= kMaxQuotedBytes) return s;
  return s.substr(0, kMaxQuotedBytes) + "... (" + std::to_string(s.size()) + " bytes)";
}

int64_t st_dtype_size(const std::string& dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (dtype == d.name) return d.size;
  }
  return 0;
}

Checked shape_numel(const std::vector<int64_t>& shape) {
  Checked n = 1;
  for (int64_t d : shape) n = d < 0 ? Checked::overflow() : n * d;
  return n;
}

int64_t checked_value(Checked v, const std::string& what) {
  if (!v.ok()) throw CliError(what + " does not fit in int64 (more than 2^63 - 1)");
  return v.value();
}

void allocate_bytes(std::vector<uint8_t>& buf, int64_t bytes, const std::string& what) {
  if (bytes < 0) throw CliError("internal: negative byte count for " + what);
  // More than the host's physical memory is refused before it is attempted: an allocator
  // may overcommit (and fault while the buffer is zeroed) or abort instead of throwing.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes / page > pages) {
    throw CliError("cannot allocate " + std::to_string(bytes) + " bytes for " + what +
                   ": out of host memory (more than its " + std::to_string(static_cast<int64_t>(pages) * page) +
                   " bytes)");
  }
  try {
    buf.assign(static_cast<size_t>(bytes), 0);
  } catch (const std::bad_alloc&) {
    throw CliError("cannot allocate " + std::to_string(bytes) + " bytes for " + what +
                   ": out of host memory");
  } catch (const std::length_error&) {
    throw CliError("cannot allocate " + std::to_string(bytes) + " bytes for " + what +
                   ": larger than a host buffer can be");
  }
}

std::map<std::string, Tensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  // Regular files only, checked before the open: opening a FIFO blocks until a writer comes,
  // and a FIFO, socket or device has no size to check the header against. A path whose
  // status cannot be read is left to the open, whose error names the cause.
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec) {
    using std::filesystem::file_type;
    switch (st.type()) {
      case file_type::regular:
        break;
      case file_type::directory:
        fail(path, "is a directory");
      default: {
        const file_type t = st.type();
        const char* kind = t == file_type::fifo        ? " (a FIFO)"
                           : t == file_type::character ? " (a character device)"
                           : t == file_type::block     ? " (a block device)"
                           : t == file_type::socket    ? " (a socket)"
                                                       : "";
        fail(path, std::string("not a regular file") + kind +
                       ": cannot determine the file size without reading it; --input reads regular files only");
      }
    }
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open file: ") + std::strerror(errno));
  // The path may have changed since the status check, and an ifstream opens a directory
  // without complaint and then reads nothing.
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory");
  f.seekg(0, std::ios::end);
  const std::streamoff end_pos = f ? static_cast<std::streamoff>(f.tellg()) : -1;
  if (end_pos < 0) fail(path, "cannot determine the file size (not a regular file?)");
  const auto fsize = static_cast<uint64_t>(end_pos);
  if (fsize < 8) {
    fail(path, "truncated file: " + std::to_string(fsize) +
                   " bytes, a safetensors file starts with an 8-byte header length");
  }
  uint8_t len_bytes[8];
  read_exact(f, path, 0, len_bytes, 8, "header length");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len_bytes[i];
  if (hlen > fsize - 8 || hlen > kMaxHeader) {
    fail(path, "bad header length: the header claims " + std::to_string(hlen) + " bytes, but " +
                   std::to_string(fsize - 8) + " bytes follow the 8-byte length" +
                   (hlen > kMaxHeader ? " (limit 100 MiB)" : " (truncated file?)"));
  }
  std::string header(static_cast<size_t>(hlen), '\0');
  read_exact(f, path, 8, header.data(), hlen, "header");
  check_depth(path, header);
  json h;
  try {
    h = json::parse(header);
  } catch (const json::parse_error& e) {
    // The parser's message quotes the last token read, which may be most of the header.
    fail(path, std::string("invalid JSON header: ") + clip(e.what()));
  }
  if (!h.is_object()) fail(path, std::string("invalid header: expected a JSON object, got ") + h.type_name());

  const uint64_t data_size = fsize - 8 - hlen;
  std::map<std::string, Tensor> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      // The format allows only string values there; anything else is skipped, not fatal.
      if (metadata != nullptr && it.value().is_object()) {
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const std::string what = "tensor '" + clip(it.key()) + "'";
    Tensor t;
    uint64_t begin = 0, end = 0;
    parse_entry(path, it.key(), it.value(), data_size, t, begin, end);
    // end <= data_size < fsize, which came from a non-negative streamoff: both fit int64.
    try {
      allocate_bytes(t.data, static_cast<int64_t>(end - begin), what);
    } catch (const CliError& e) {
      fail(path, e.what());
    }
    read_exact(f, path, 8 + hlen + begin, t.data.data(), end - begin, what);
    out.emplace(it.key(), std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t n = t->data.size();
    h[name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, std::string("cannot create file: ") + std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    if (n == 0) return;  // p may be the null data() of an empty tensor
    errno = 0;
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    if (!f) fail(path, "write error" + errno_text());
  };
  put(len_bytes, 8);
  put(header.data(), header.size());
  for (const auto& nt : tensors) put(nt.second->data.data(), nt.second->data.size());
  f.close();
  if (!f) fail(path, "write error" + errno_text());
}

}  // namespace megamoe_cli
