#include "client/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/number_formats.h"

namespace gcmoe::client {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

// The value of `'key': ` in the header dict, up to the next top-level comma or brace.
std::string HeaderValue(const std::string& header, const std::string& key) {
  const std::string needle = "'" + key + "':";
  const size_t at = header.find(needle);
  if (at == std::string::npos) return "";
  size_t start = at + needle.size();
  while (start < header.size() && header[start] == ' ') ++start;
  int depth = 0;
  size_t end = start;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) break;
  }
  return header.substr(start, end - start);
}

Result<std::vector<int64_t>> ParseShape(const std::string& text, const std::string& name) {
  // "(3, 4)", "(5,)", "()"
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    return InvalidArgument(name + ": cannot read the shape " + text);
  }
  std::vector<int64_t> shape;
  std::istringstream in(text.substr(1, text.size() - 2));
  for (std::string item; std::getline(in, item, ',');) {
    const size_t first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    char* end = nullptr;
    const long long d = std::strtoll(item.c_str() + first, &end, 10);
    if (d < 0 || (*end != '\0' && *end != ' ' && *end != 'L')) {
      return InvalidArgument(name + ": cannot read the shape " + text);
    }
    shape.push_back(d);
  }
  return shape;
}

size_t ElementBytes(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  if (descr == "<f2") return 2;
  return 0;
}

template <typename T>
T Load(const std::string& data, size_t i) {
  T v;
  std::memcpy(&v, data.data() + i * sizeof(T), sizeof(T));
  return v;
}

size_t ElementCount(const NpyArray& a) {
  size_t n = 1;
  for (const int64_t d : a.shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

Result<NpyArray> ParseNpy(const std::string& bytes, const std::string& name) {
  if (bytes.size() < 10 || bytes.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0) {
    return InvalidArgument(name + ": not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) |
                 (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return InvalidArgument(name + ": truncated .npy header");
    for (int i = 0; i < 4; ++i) {
      header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    }
    header_start = 12;
  } else {
    return InvalidArgument(name + ": unsupported .npy format version " + std::to_string(major));
  }
  if (bytes.size() < header_start + header_len) {
    return InvalidArgument(name + ": truncated .npy header");
  }
  const std::string header = bytes.substr(header_start, header_len);

  NpyArray array;
  std::string descr = HeaderValue(header, "descr");
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) {
    descr = descr.substr(1, descr.size() - 2);
  }
  array.descr = descr;
  if (ElementBytes(descr) == 0) {
    return InvalidArgument(name + ": dtype " + descr +
                           " is not supported (use float32, float64, float16, int32 or int64)");
  }
  if (HeaderValue(header, "fortran_order") != "False") {
    return InvalidArgument(name +
                           ": Fortran-order arrays are not supported; save "
                           "np.ascontiguousarray(x)");
  }
  GCMOE_ASSIGN_OR_RETURN(array.shape, ParseShape(HeaderValue(header, "shape"), name));
  const size_t data_bytes = ElementCount(array) * ElementBytes(descr);
  const size_t data_start = header_start + header_len;
  if (bytes.size() - data_start != data_bytes) {
    return InvalidArgument(name + ": holds " + std::to_string(bytes.size() - data_start) +
                           " data bytes, its shape and dtype need " + std::to_string(data_bytes));
  }
  array.data = bytes.substr(data_start);
  return array;
}

Result<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return ParseNpy(bytes.str(), path);
}

Result<std::vector<float>> NpyToFloat(const NpyArray& a, const std::string& name) {
  const size_t n = ElementCount(a);
  std::vector<float> values(n);
  if (a.descr == "<f4") {
    std::memcpy(values.data(), a.data.data(), n * 4);
  } else if (a.descr == "<f8") {
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(Load<double>(a.data, i));
  } else if (a.descr == "<f2") {
    for (size_t i = 0; i < n; ++i) values[i] = numerics::FP16ToFloat(Load<uint16_t>(a.data, i));
  } else {
    return InvalidArgument(name + ": expected a float array (float32, float64 or float16), got " +
                           a.descr);
  }
  return values;
}

Result<std::vector<int32_t>> NpyToInt32(const NpyArray& a, const std::string& name) {
  const size_t n = ElementCount(a);
  std::vector<int32_t> values(n);
  if (a.descr == "<i4") {
    std::memcpy(values.data(), a.data.data(), n * 4);
  } else if (a.descr == "<i8") {
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = Load<int64_t>(a.data, i);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        return InvalidArgument(name + ": value " + std::to_string(v) + " does not fit int32");
      }
      values[i] = static_cast<int32_t>(v);
    }
  } else {
    return InvalidArgument(name + ": expected an integer array (int32 or int64), got " + a.descr);
  }
  return values;
}

Status WriteNpyFloat32(const std::string& path, const std::vector<int64_t>& shape,
                       const std::vector<float>& values) {
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_text += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) shape_text += " ";
  }
  shape_text += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // The format pads the header with spaces and a newline so the data starts 64-byte aligned.
  const size_t unpadded = kMagicBytes + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return NotFound("cannot write " + path + ": " + std::strerror(errno));
  const char version[2] = {1, 0};
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(header_len & 0xFF),
                             static_cast<char>(header_len >> 8)};
  out.write(kMagic, kMagicBytes);
  out.write(version, 2);
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!out) return DataLoss("error writing " + path);
  return Status::Ok();
}

}  // namespace gcmoe::client
