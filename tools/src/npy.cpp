// SPDX-License-Identifier: Apache-2.0
// The .npy reader and writer. The header is a Python dict literal; it is
// parsed here by a small strict grammar (string keys; a string, a boolean or a
// tuple of non-negative integers as values) instead of being trusted.
#include "npy.hpp"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "tandem/storage.hpp"

namespace tandem::tool {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kMaxRank = 64;  // NumPy's own limit

[[noreturn]] void fail(const std::string& field, const std::string& message) {
  throw NpyError(field, message);
}

std::uint64_t load_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// A printable rendering of header text for error messages (at most 60 chars).
std::string excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 32 && u < 127) {
      out += c;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  if (s.size() > 60) out += "...";
  return out;
}

// ---- header dict grammar ----------------------------------------------------

struct Value {
  enum Kind { string, boolean, tuple } kind = string;
  std::string text;
  bool flag = false;
  Shape dims;
};

class HeaderParser {
 public:
  explicit HeaderParser(std::string_view s) : s_(s) {}

  std::map<std::string, Value> parse_dict() {
    std::map<std::string, Value> dict;
    skip_ws();
    expect('{', "the header must be a dict starting with '{'");
    skip_ws();
    while (!at('}')) {
      const std::string key = parse_string("a quoted key");
      skip_ws();
      expect(':', "expected ':' after key '" + key + "'");
      skip_ws();
      Value v = parse_value(key);
      if (!dict.emplace(key, std::move(v)).second) fail("header", "duplicate key '" + key + "'");
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
        continue;
      }
      if (!at('}')) error("expected ',' or '}' after the value of '" + key + "'");
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) error("unexpected text after the dict");
    return dict;
  }

 private:
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("header", "malformed header dict at byte " + std::to_string(pos_) + ": " + what +
                       " (header: \"" + excerpt(s_) + "\")");
  }
  void expect(char c, const std::string& what) {
    if (!at(c)) error(what);
    ++pos_;
  }
  std::string parse_string(const std::string& what) {
    if (!at('\'') && !at('"')) error("expected " + what);
    const char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') error("escape sequences are not supported in header strings");
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) error("unterminated string");
    ++pos_;
    return out;
  }
  std::int64_t parse_int() {
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') {
      error("expected a non-negative integer dimension");
    }
    std::int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const int digit = s_[pos_] - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
        fail("shape",
             "shape dimension does not fit a 64-bit integer (header: \"" + excerpt(s_) + "\")");
      }
      v = v * 10 + digit;
      ++pos_;
    }
    return v;
  }
  Value parse_value(const std::string& key) {
    Value v;
    if (at('\'') || at('"')) {
      v.kind = Value::string;
      v.text = parse_string("a string");
    } else if (s_.substr(pos_, 4) == "True") {
      v.kind = Value::boolean;
      v.flag = true;
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "False") {
      v.kind = Value::boolean;
      v.flag = false;
      pos_ += 5;
    } else if (at('(')) {
      v.kind = Value::tuple;
      ++pos_;
      skip_ws();
      bool trailing_comma = false;
      while (!at(')')) {
        if (v.dims.size() >= kMaxRank) {
          fail("shape", "shape has more than " + std::to_string(kMaxRank) + " dimensions");
        }
        v.dims.push_back(parse_int());
        skip_ws();
        trailing_comma = false;
        if (at(',')) {
          ++pos_;
          trailing_comma = true;
          skip_ws();
        } else if (!at(')')) {
          error("expected ',' or ')' in the shape tuple");
        }
      }
      ++pos_;
      if (v.dims.size() == 1 && !trailing_comma) {
        error("a one-element shape tuple needs a trailing comma, as in (5,)");
      }
    } else if (at('[')) {
      fail("descr", "value of '" + key +
                        "' is a list: structured (record) dtypes are not supported; "
                        "save a plain float32 array");
    } else {
      error("unsupported value for key '" + key + "'");
    }
    return v;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

NpyDtype parse_descr(const std::string& d) {
  if (d == "<f4") return NpyDtype::f4;
  if (d == "<f8") return NpyDtype::f8;
  if (d == "|b1") return NpyDtype::b1;
  if (d == "<i4") return NpyDtype::i4;
  if (d == "<i8") return NpyDtype::i8;
  if (d == "<f2") return NpyDtype::f2;
  if (d == "<u2") return NpyDtype::u2;
  if (d == "|i1") return NpyDtype::i1;
  if (d == "|u1") return NpyDtype::u1;
  if (!d.empty() && d[0] == '>') {
    fail("descr", "descr '" + d +
                      "' is big-endian; only little-endian data is read "
                      "(convert with a.astype(a.dtype.newbyteorder('<')))");
  }
  fail("descr", "unsupported dtype descr '" + excerpt(d) +
                    "'; supported: <f4, <f8, <f2 (float16), <u2 (bfloat16 bits), |b1, <i4, <i8, "
                    "|i1 and |u1 (8-bit cache codes)");
}

std::size_t item_size(NpyDtype t) {
  switch (t) {
    case NpyDtype::f4:
      return 4;
    case NpyDtype::f8:
      return 8;
    case NpyDtype::b1:
      return 1;
    case NpyDtype::i4:
      return 4;
    case NpyDtype::i8:
      return 8;
    case NpyDtype::f2:
    case NpyDtype::u2:
      return 2;
    case NpyDtype::i1:
    case NpyDtype::u1:
      return 1;
  }
  return 1;
}

/// double → float, rounding to nearest; finite values beyond float's range
/// become ±FLT_MAX or ±inf as IEEE rounding says (a plain cast would be UB).
float narrow(double d) {
  constexpr double kRoundsToInf = 0x1.ffffffp+127;  // FLT_MAX + half an ulp
  if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    const float big = std::fabs(d) >= kRoundsToInf ? std::numeric_limits<float>::infinity()
                                                   : std::numeric_limits<float>::max();
    return d < 0 ? -big : big;
  }
  return static_cast<float>(d);
}

}  // namespace

const char* to_string(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::f4:
      return "<f4";
    case NpyDtype::f8:
      return "<f8";
    case NpyDtype::b1:
      return "|b1";
    case NpyDtype::i4:
      return "<i4";
    case NpyDtype::i8:
      return "<i8";
    case NpyDtype::f2:
      return "<f2";
    case NpyDtype::u2:
      return "<u2";
    case NpyDtype::i1:
      return "|i1";
    case NpyDtype::u1:
      return "|u1";
  }
  return "?";
}

NpyHeader parse_npy_header(std::string_view bytes) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    fail("magic", "not a .npy file: it does not start with \\x93NUMPY");
  }
  if (bytes.size() < 10) fail("version", "file ends inside the .npy preamble");
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  NpyHeader h;
  h.major = u[6];
  h.minor = u[7];
  if (h.major < 1 || h.major > 3 || h.minor != 0) {
    fail("version", "unsupported .npy format version " + std::to_string(h.major) + "." +
                        std::to_string(h.minor) + " (supported: 1.0, 2.0, 3.0)");
  }
  const std::size_t len_bytes = h.major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + len_bytes;
  if (bytes.size() < prefix) fail("header", "file ends inside the header length");
  const std::uint64_t header_len = load_le(u + 8, static_cast<int>(len_bytes));
  if (header_len > bytes.size() - prefix) {
    fail("header", "header length " + std::to_string(header_len) + " runs past the end of the " +
                       std::to_string(bytes.size()) + "-byte file");
  }
  const std::string_view header = bytes.substr(prefix, header_len);
  if (header.empty() || header.back() != '\n') {
    fail("header", "header does not end with a newline (header: \"" + excerpt(header) + "\")");
  }
  const auto dict = HeaderParser(header.substr(0, header.size() - 1)).parse_dict();
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      fail("header", "unexpected key '" + excerpt(key) +
                         "' in the header dict (expected descr, fortran_order, shape)");
    }
  }
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.count(key)) fail(key, std::string("header dict has no '") + key + "' key");
  }
  const Value& descr = dict.at("descr");
  if (descr.kind != Value::string) fail("descr", "'descr' must be a string such as '<f4'");
  h.dtype = parse_descr(descr.text);
  const Value& fortran = dict.at("fortran_order");
  if (fortran.kind != Value::boolean) fail("fortran_order", "'fortran_order' must be True/False");
  const Value& shape = dict.at("shape");
  if (shape.kind != Value::tuple) fail("shape", "'shape' must be a tuple of integers");
  h.shape = shape.dims;
  if (fortran.flag) {
    fail("fortran_order",
         "array is stored in Fortran order; save a C-order array "
         "(numpy.ascontiguousarray) instead");
  }
  std::int64_t count = 1;
  for (std::int64_t d : h.shape) {
    if (__builtin_mul_overflow(count, d, &count)) {
      fail("shape", "shape " + to_string(h.shape) + " has more elements than fit in 64 bits");
    }
  }
  h.count = count;
  const auto isz = static_cast<std::int64_t>(item_size(h.dtype));
  std::int64_t need = 0;
  if (__builtin_mul_overflow(count, isz, &need)) {
    fail("shape", "shape " + to_string(h.shape) + " needs more bytes than fit in 64 bits");
  }
  h.data_offset = prefix + header_len;
  const auto have = static_cast<std::uint64_t>(bytes.size() - h.data_offset);
  if (have < static_cast<std::uint64_t>(need)) {
    fail("data", "truncated data: shape " + to_string(h.shape) + " of " + to_string(h.dtype) +
                     " needs " + std::to_string(need) + " bytes, the file holds " +
                     std::to_string(have));
  }
  if (have > static_cast<std::uint64_t>(need)) {
    fail("data", "header shape " + to_string(h.shape) +
                     " does not match the data size: " + to_string(h.dtype) + " needs " +
                     std::to_string(need) + " bytes, the file holds " + std::to_string(have));
  }
  return h;
}

NpyArray parse_npy(std::string_view bytes) {
  const NpyHeader h = parse_npy_header(bytes);
  NpyArray a;
  a.shape = h.shape;
  a.dtype = h.dtype;
  a.values.resize(static_cast<std::size_t>(h.count));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + h.data_offset;
  const std::size_t n = a.values.size();
  switch (h.dtype) {
    case NpyDtype::f4:
      for (std::size_t i = 0; i < n; ++i) {
        a.values[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(p + 4 * i, 4)));
      }
      break;
    case NpyDtype::f8:
      for (std::size_t i = 0; i < n; ++i) {
        a.values[i] = narrow(std::bit_cast<double>(load_le(p + 8 * i, 8)));
      }
      break;
    case NpyDtype::b1:
      for (std::size_t i = 0; i < n; ++i) a.values[i] = p[i] != 0 ? 1.0f : 0.0f;
      break;
    case NpyDtype::i4:
      a.integers.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        a.integers[i] =
            std::bit_cast<std::int32_t>(static_cast<std::uint32_t>(load_le(p + 4 * i, 4)));
      }
      break;
    case NpyDtype::i8:
      a.integers.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        a.integers[i] = std::bit_cast<std::int64_t>(load_le(p + 8 * i, 8));
      }
      break;
    case NpyDtype::f2:  // every float16 is a float: exact
      for (std::size_t i = 0; i < n; ++i) {
        const auto half = float16::from_bits(static_cast<std::uint16_t>(load_le(p + 2 * i, 2)));
        a.values[i] = static_cast<float>(static_cast<double>(half));
      }
      break;
    case NpyDtype::u2:  // bit patterns (bfloat16 when the case says so): kept as integers
      a.integers.resize(n);
      for (std::size_t i = 0; i < n; ++i)
        a.integers[i] = static_cast<std::int64_t>(load_le(p + 2 * i, 2));
      break;
    case NpyDtype::i1:
      a.integers.resize(n);
      for (std::size_t i = 0; i < n; ++i) a.integers[i] = static_cast<std::int8_t>(p[i]);
      break;
    case NpyDtype::u1:
      a.integers.resize(n);
      for (std::size_t i = 0; i < n; ++i) a.integers[i] = p[i];
      break;
  }
  for (std::size_t i = 0; i < a.integers.size(); ++i) {
    a.values[i] = static_cast<float>(a.integers[i]);
  }
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("file", "file '" + path + "' does not exist");
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail("file", "'" + path + "' is not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("file", "cannot open '" + path + "': " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) fail("file", "cannot read '" + path + "'");
  return parse_npy(buf.str());
}

std::string encode_npy(const Shape& shape, const std::vector<float>& values) {
  std::int64_t count = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count)) {
      fail("shape", "cannot write shape " + to_string(shape));
    }
  }
  if (static_cast<std::uint64_t>(count) != values.size()) {
    fail("shape", "shape " + to_string(shape) + " holds " + std::to_string(count) +
                      " elements, not " + std::to_string(values.size()));
  }
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad with spaces so that magic + version + length + header is a multiple
  // of 64 bytes (NumPy's alignment), ending with '\n'.
  std::size_t prefix = 10;
  std::size_t total = prefix + header.size() + 1;
  int major = 1;
  if (total + (64 - total % 64) % 64 - prefix > 0xffff) {
    major = 2;
    prefix = 12;
    total = prefix + header.size() + 1;
  }
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic);
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = header.size();
  for (std::size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out.reserve(out.size() + 4 * values.size());
  for (float v : values) {
    const auto bits = std::bit_cast<std::uint32_t>(v);
    for (int i = 0; i < 4; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  return out;
}

void write_npy(const std::string& path, const Shape& shape, const std::vector<float>& values) {
  const std::string bytes = encode_npy(shape, values);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("file", "cannot create '" + path + "': " + std::strerror(errno));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) fail("file", "cannot write '" + path + "'");
}

}  // namespace tandem::tool
