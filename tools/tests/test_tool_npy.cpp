// SPDX-License-Identifier: Apache-2.0
// The .npy reader and writer: round trips, every header version and dtype,
// float64 narrowing at the edges of float's range, and one test per kind of
// malformed file (each must name the part of the file at fault).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "npy.hpp"

namespace tandem::tool {
namespace {

/// A .npy file with header dict `dict`, version `major`.0, then `data`.
std::string npy(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i) {
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return out + header + data;
}

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // the test machine is little-endian, as .npy '<' is
    s.append(b, sizeof(T));
  }
  return s;
}

std::string field_of(const std::string& file) {
  try {
    parse_npy(file);
  } catch (const NpyError& e) {
    return e.field();
  }
  return "(no error)";
}

std::string message_of(const std::string& file) {
  try {
    parse_npy(file);
  } catch (const NpyError& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kDict23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

TEST(Npy, WriterRoundTripsEveryBitPattern) {
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.5f,
                                     -2.25f,
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::max(),
                                     1e-30f,
                                     3.0f,
                                     7.0f};
  for (const Shape& shape : {Shape{12}, Shape{3, 4}, Shape{2, 3, 1, 2}}) {
    const std::string file = encode_npy(shape, values);
    const NpyArray a = parse_npy(file);
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.dtype, NpyDtype::f4);
    ASSERT_EQ(a.values.size(), values.size());
    EXPECT_EQ(std::memcmp(a.values.data(), values.data(), values.size() * sizeof(float)), 0);
  }
}

TEST(Npy, WriterHeaderIsVersion1AlignedToSixtyFour) {
  const std::string file = encode_npy({5}, {1, 2, 3, 4, 5});
  ASSERT_GE(file.size(), 10u);
  EXPECT_EQ(file.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(file[6], 1);
  EXPECT_EQ(file[7], 0);
  const std::size_t header_len =
      static_cast<unsigned char>(file[8]) | (static_cast<unsigned char>(file[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(file[10 + header_len - 1], '\n');
  const std::string header = file.substr(10, header_len);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(header.find("'shape': (5,)"), std::string::npos);
  EXPECT_EQ(file.size(), 10 + header_len + 20);
}

TEST(Npy, WriterHandlesScalarsAndEmptyArrays) {
  NpyArray scalar = parse_npy(encode_npy({}, {4.0f}));
  EXPECT_TRUE(scalar.shape.empty());
  ASSERT_EQ(scalar.values.size(), 1u);
  EXPECT_EQ(scalar.values[0], 4.0f);
  NpyArray empty = parse_npy(encode_npy({0, 3}, {}));
  EXPECT_EQ(empty.shape, (Shape{0, 3}));
  EXPECT_TRUE(empty.values.empty());
  EXPECT_THROW(encode_npy({2, 2}, {1, 2, 3}), NpyError);
  EXPECT_THROW(encode_npy({-1}, {}), NpyError);
}

TEST(Npy, ReadsVersions2And3) {
  const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6});
  for (int major : {1, 2, 3}) {
    const NpyArray a = parse_npy(npy(kDict23, data, major));
    EXPECT_EQ(a.shape, (Shape{2, 3})) << major;
    EXPECT_EQ(a.values[5], 6.0f) << major;
  }
}

TEST(Npy, AcceptsDoubleQuotesAndAnyKeyOrder) {
  const NpyArray a =
      parse_npy(npy("{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<f4\"}",
                    bytes_of<float>({1, 2})));
  EXPECT_EQ(a.shape, (Shape{1, 2}));
}

TEST(Npy, ConvertsFloat64ToNearestFloat32) {
  const double big = static_cast<double>(std::numeric_limits<float>::max());
  const NpyArray a = parse_npy(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }",
                                   bytes_of<double>({0.1, big, big * (1 + 1e-9), 1e39, -1e300,
                                                     std::numeric_limits<double>::quiet_NaN()})));
  EXPECT_EQ(a.dtype, NpyDtype::f8);
  EXPECT_EQ(a.values[0], 0.1f);
  EXPECT_EQ(a.values[1], std::numeric_limits<float>::max());
  EXPECT_EQ(a.values[2], std::numeric_limits<float>::max());  // within half an ulp
  EXPECT_EQ(a.values[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(a.values[4], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(a.values[5]));
}

TEST(Npy, ConvertsMaskDtypes) {
  const NpyArray b = parse_npy(npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }",
                                   std::string("\x00\x01\x01\x00", 4)));
  EXPECT_EQ(b.dtype, NpyDtype::b1);
  EXPECT_EQ(b.values, (std::vector<float>{0, 1, 1, 0}));
  const NpyArray i4 = parse_npy(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                                    bytes_of<std::int32_t>({0, -7, 1})));
  EXPECT_EQ(i4.values, (std::vector<float>{0, -7, 1}));
  const NpyArray i8 = parse_npy(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                                    bytes_of<std::int64_t>({0, std::int64_t{1} << 40, 1})));
  EXPECT_EQ(i8.values[1], 1099511627776.0f);
  EXPECT_NE(i8.values[1], 0.0f);  // a large non-zero keep value stays non-zero
}

TEST(Npy, IntegersKeepTheirExactValues) {
  // Index inputs (sequence offsets, block tables) are read as integers:
  // 2^24 + 1 has no float32, and −1 pads a block table.
  const std::int64_t big = (std::int64_t{1} << 24) + 1;
  const NpyArray i8 = parse_npy(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                                    bytes_of<std::int64_t>({big, -1, std::int64_t{1} << 40})));
  EXPECT_EQ(i8.integers, (std::vector<std::int64_t>{big, -1, std::int64_t{1} << 40}));
  const NpyArray i4 = parse_npy(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
                                    bytes_of<std::int32_t>({2147483647, -2147483647 - 1})));
  EXPECT_EQ(i4.integers, (std::vector<std::int64_t>{2147483647, -2147483648LL}));
  // Float and boolean arrays hold no integers.
  const NpyArray f4 = parse_npy(
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", bytes_of<float>({3.0f})));
  EXPECT_TRUE(f4.integers.empty());
}

TEST(Npy, RejectsFortranOrder) {
  const std::string f =
      npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0'));
  EXPECT_EQ(field_of(f), "fortran_order");
  EXPECT_NE(message_of(f).find("Fortran order"), std::string::npos);
}

TEST(Npy, RejectsBigEndianAndUnsupportedDtypes) {
  const std::string data(24, '\0');
  const std::string be = npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data);
  EXPECT_EQ(field_of(be), "descr");
  EXPECT_NE(message_of(be).find("big-endian"), std::string::npos);
  for (const char* d : {"<c8", "<i2", "<u4", "<f16", "|O", "<U3", "=f4", ""}) {
    const std::string f =
        npy(std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (2, 3), }", data);
    EXPECT_EQ(field_of(f), "descr") << d;
    EXPECT_NE(message_of(f).find("unsupported dtype"), std::string::npos) << d;
  }
  const std::string rec =
      npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }", data);
  EXPECT_EQ(field_of(rec), "descr");
}

TEST(Npy, ReadsHalfBitsAndCodesExactly) {
  // float16 1.5, -2^-24 (the smallest subnormal), 65504 (the largest finite)
  const std::string half = npy("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                               std::string("\x00\x3e\x01\x80\xff\x7b", 6));
  const NpyArray h = parse_npy(half);
  EXPECT_EQ(h.dtype, NpyDtype::f2);
  EXPECT_EQ(h.values, (std::vector<float>{1.5f, -std::ldexp(1.0f, -24), 65504.0f}));
  // <u2 keeps bit patterns; |i1 two's complement codes; |u1 bytes
  const NpyArray bits = parse_npy(npy("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }",
                                      std::string("\x80\x3f\xff\xff", 4)));
  EXPECT_EQ(bits.integers, (std::vector<std::int64_t>{0x3f80, 0xffff}));
  const NpyArray i8 = parse_npy(
      npy("{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", std::string("\x81\x7f", 2)));
  EXPECT_EQ(i8.integers, (std::vector<std::int64_t>{-127, 127}));
  const NpyArray u8 = parse_npy(
      npy("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", std::string("\xfe", 1)));
  EXPECT_EQ(u8.integers, (std::vector<std::int64_t>{254}));
}

TEST(Npy, RejectsDataOfTheWrongLength) {
  const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6});
  const std::string truncated = npy(kDict23, data.substr(0, 20));
  EXPECT_EQ(field_of(truncated), "data");
  EXPECT_NE(message_of(truncated).find("truncated data"), std::string::npos);
  EXPECT_NE(message_of(truncated).find("needs 24 bytes, the file holds 20"), std::string::npos);
  const std::string trailing = npy(kDict23, data + "xx");
  EXPECT_EQ(field_of(trailing), "data");
  EXPECT_NE(message_of(trailing).find("does not match the data size"), std::string::npos);
}

TEST(Npy, RejectsAbsurdSizesWithoutAllocating) {
  // 2^62 * 4 elements overflow int64; 2^31 * 2^31 elements fit but their bytes do not.
  EXPECT_EQ(field_of(npy("{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (4611686018427387904, 4), }",
                         "")),
            "shape");
  EXPECT_EQ(field_of(npy("{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (2147483648, 2147483648), }",
                         "")),
            "shape");
  EXPECT_EQ(field_of(npy("{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (99999999999999999999,), }",
                         "")),
            "shape");
  // Fits in 64 bits, but the file is tiny: a truncation, found before any allocation.
  EXPECT_EQ(field_of(npy("{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (1000000000, 1000000000), }",
                         "abcd")),
            "data");
  // A zero dimension makes any other dimension harmless.
  EXPECT_EQ(parse_npy(npy("{'descr': '<f4', 'fortran_order': False, "
                          "'shape': (0, 9223372036854775807), }",
                          ""))
                .values.size(),
            0u);
}

TEST(Npy, RejectsMalformedHeaderDicts) {
  const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6});
  struct Bad {
    const char* dict;
    const char* field;
  };
  const Bad bad[] = {
      {"{'descr': '<f4', 'fortran_order': False, }", "shape"},
      {"{'fortran_order': False, 'shape': (2, 3), }", "descr"},
      {"{'descr': '<f4', 'shape': (2, 3), }", "fortran_order"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1, }", "header"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "header"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3), }", "header"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", "header"},
      {"{'descr': 4, 'fortran_order': False, 'shape': (2, 3), }", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", "descr"},
      {"{'descr': '<f4', 'fortran_order': 'False', 'shape': (2, 3), }", "fortran_order"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': '(2, 3)', }", "shape"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 3), }", "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } trailing", "header"},
      {"['descr', '<f4']", "header"},
      {"", "header"},
  };
  for (const auto& b : bad) {
    EXPECT_EQ(field_of(npy(b.dict, data)), b.field) << b.dict << "\n"
                                                    << message_of(npy(b.dict, data));
  }
}

TEST(Npy, RejectsBrokenPreambles) {
  const std::string good = npy(kDict23, bytes_of<float>({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(field_of(""), "magic");
  EXPECT_EQ(field_of("\x93NUMP"), "magic");
  EXPECT_EQ(field_of("PK\x03\x04" + good), "magic");
  EXPECT_EQ(field_of(good.substr(0, 8)), "version");
  std::string v4 = good;
  v4[6] = 4;
  EXPECT_EQ(field_of(v4), "version");
  std::string minor = good;
  minor[7] = 1;
  EXPECT_EQ(field_of(minor), "version");
  std::string past = good.substr(0, 40);
  EXPECT_EQ(field_of(past), "header");
  EXPECT_NE(message_of(past).find("runs past the end"), std::string::npos);
  std::string no_newline = good;
  const std::size_t header_len =
      static_cast<unsigned char>(good[8]) | (static_cast<unsigned char>(good[9]) << 8);
  no_newline[10 + header_len - 1] = ' ';  // the header's closing newline
  EXPECT_EQ(field_of(no_newline), "header");
  EXPECT_EQ(field_of(std::string("\x93NUMPY\x02\x00\x01\x00", 10)), "header");
}

TEST(Npy, FileErrorsNameTheFile) {
  try {
    read_npy("/nonexistent/tandem/x.npy");
    FAIL() << "no error";
  } catch (const NpyError& e) {
    EXPECT_EQ(e.field(), "file");
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tandem/x.npy"), std::string::npos);
  }
  EXPECT_THROW(read_npy("/"), NpyError);
}

}  // namespace
}  // namespace tandem::tool
