// safetensors.cpp: safetensors reader/writer with precise errors (see safetensors.h).
#include "safetensors.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

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

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CliError(path + ": " + what);
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
  const std::string where = "tensor '" + name + "': ";
  if (!e.is_object()) fail(path, where + "expected a JSON object, got " + e.type_name());
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) fail(path, where + "expected a string 'dtype'");
  t.dtype = dt->get<std::string>();
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) fail(path, where + "expected an array 'shape'");
  uint64_t numel = 1;
  for (const json& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      fail(path, where + "expected non-negative integer sizes in 'shape', got " + sh->dump());
    }
    const uint64_t n = d.get<uint64_t>();
    if (n != 0 && numel > (uint64_t{1} << 62) / n) fail(path, where + "shape too large: " + sh->dump());
    numel *= n;
    t.shape.push_back(static_cast<int64_t>(n));
  }
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
  if (es > 0 && end - begin != numel * static_cast<uint64_t>(es)) {
    fail(path, where + "data_offsets span " + std::to_string(end - begin) + " bytes, but dtype " +
                   t.dtype + " with shape " + shape_text(t.shape) + " needs " +
                   std::to_string(numel * static_cast<uint64_t>(es)) + " bytes");
  }
}

}  // namespace

Tensor::Tensor(std::string dt, std::vector<int64_t> shp) : dtype(std::move(dt)), shape(std::move(shp)) {
  data.assign(static_cast<size_t>(numel() * st_dtype_size(dtype)), 0);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string Tensor::shape_str() const { return shape_text(shape); }

megamoe::TensorRef Tensor::ref() {
  using megamoe::DType;
  static const std::map<std::string, DType> kMap = {
      {"BF16", DType::kBFloat16}, {"F16", DType::kFloat16}, {"F32", DType::kFloat32},
      {"F8_E4M3", DType::kFloat8E4M3}, {"U8", DType::kUInt8}, {"BOOL", DType::kBool},
      {"I32", DType::kInt32}, {"I64", DType::kInt64}};
  auto it = kMap.find(dtype);
  if (it == kMap.end()) throw CliError("internal: dtype " + dtype + " has no megamoe equivalent");
  if (shape.size() == 1) return megamoe::TensorRef(data.data(), it->second, {shape[0]});
  if (shape.size() == 2) return megamoe::TensorRef(data.data(), it->second, {shape[0], shape[1]});
  throw CliError("internal: rank " + std::to_string(shape.size()) + " tensor passed to megamoe");
}

int64_t st_dtype_size(const std::string& dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (dtype == d.name) return d.size;
  }
  return 0;
}

const char* st_dtype_name(megamoe::DType dtype) {
  using megamoe::DType;
  switch (dtype) {
    case DType::kBFloat16: return "BF16";
    case DType::kFloat16: return "F16";
    case DType::kFloat32: return "F32";
    case DType::kFloat8E4M3: return "F8_E4M3";
    case DType::kUInt8: return "U8";
    case DType::kBool: return "BOOL";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
  }
  return "?";
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open file: ") + std::strerror(errno));
  f.seekg(0, std::ios::end);
  const auto fsize = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  if (fsize < 8) {
    fail(path, "truncated file: " + std::to_string(fsize) +
                   " bytes, a safetensors file starts with an 8-byte header length");
  }
  uint8_t len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len_bytes[i];
  if (hlen > fsize - 8 || hlen > kMaxHeader) {
    fail(path, "bad header length: the header claims " + std::to_string(hlen) + " bytes, but " +
                   std::to_string(fsize - 8) + " bytes follow the 8-byte length" +
                   (hlen > kMaxHeader ? " (limit 100 MiB)" : " (truncated file?)"));
  }
  std::string header(static_cast<size_t>(hlen), '\0');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  json h;
  try {
    h = json::parse(header);
  } catch (const json::parse_error& e) {
    fail(path, std::string("invalid JSON header: ") + e.what());
  }
  if (!h.is_object()) fail(path, std::string("invalid header: expected a JSON object, got ") + h.type_name());

  const uint64_t data_size = fsize - 8 - hlen;
  std::map<std::string, Tensor> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    Tensor t;
    uint64_t begin = 0, end = 0;
    parse_entry(path, it.key(), it.value(), data_size, t, begin, end);
    t.data.resize(static_cast<size_t>(end - begin));
    f.seekg(static_cast<std::streamoff>(8 + hlen + begin));
    f.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(end - begin));
    if (!f) fail(path, "tensor '" + it.key() + "': read error");
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
  f.write(reinterpret_cast<const char*>(len_bytes), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& nt : tensors) {
    f.write(reinterpret_cast<const char*>(nt.second->data.data()),
            static_cast<std::streamsize>(nt.second->data.size()));
  }
  f.close();
  if (!f) fail(path, "write error");
}

}  // namespace megamoe_cli
