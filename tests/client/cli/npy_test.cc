#include "client/cli/npy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::cli {
namespace {

using kernels::DType;
using ::testing::HasSubstr;
using ::tokensel::testing::StatusIs;

// A header exactly as numpy 1.x writes it for np.save(np.arange(6, dtype='<i4').reshape(2, 3)).
std::string NumpyFile(const std::string& dict, const std::string& data, int version = 1) {
  std::string header = dict;
  const size_t prefix = version == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(version));
  out.push_back(0);
  for (size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string Int32Bytes(std::initializer_list<int32_t> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 4);
}

TEST(NpyTest, ParsesNumpyWrittenHeader) {
  const std::string data = Int32Bytes({0, 1, 2, 3, 4, 5});
  auto a = ParseNpy(NumpyFile("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", data));
  ASSERT_OK(a);
  EXPECT_EQ(a->dtype, DType::kInt32);
  EXPECT_THAT(a->shape, ::testing::ElementsAre(2, 3));
  EXPECT_EQ(a->data, data);
  // Version 2.0 (4-byte header length) and a 1-d shape "(6,)".
  auto b =
      ParseNpy(NumpyFile("{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }", data, 2));
  ASSERT_OK(b);
  EXPECT_THAT(b->shape, ::testing::ElementsAre(6));
  // A scalar: shape ().
  auto c = ParseNpy(
      NumpyFile("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", std::string(8, '\0')));
  ASSERT_OK(c);
  EXPECT_TRUE(c->shape.empty());
  EXPECT_EQ(c->NumElements(), 1);
}

TEST(NpyTest, EveryDTypeRoundTrips) {
  const std::pair<DType, const char*> cases[] = {
      {DType::kBool, "|b1"},  {DType::kInt8, "|i1"},    {DType::kUInt8, "|u1"},
      {DType::kInt16, "<i2"}, {DType::kFloat16, "<f2"}, {DType::kFloat32, "<f4"},
      {DType::kInt32, "<i4"}, {DType::kFloat64, "<f8"}, {DType::kInt64, "<i8"}};
  for (const auto& [dtype, descr] : cases) {
    NpyArray a;
    a.dtype = dtype;
    a.shape = {3, 0, 2};
    auto empty = SerializeNpy(a);
    ASSERT_OK(empty);
    a.shape = {3, 1, 2};
    a.data = std::string(6 * kernels::ElementSize(dtype), '\0');
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<char>(i * 37 + 1);
    auto bytes = SerializeNpy(a);
    ASSERT_OK(bytes);
    EXPECT_THAT(*bytes, HasSubstr(std::string("'descr': '") + descr + "'"));
    EXPECT_EQ((bytes->size() - a.data.size()) % 64, 0u) << "data not 64-byte aligned";
    auto back = ParseNpy(*bytes);
    ASSERT_OK(back);
    EXPECT_EQ(back->dtype, dtype);
    EXPECT_EQ(back->shape, a.shape);
    EXPECT_EQ(back->data, a.data);
  }
}

TEST(NpyTest, AcceptsNativeAndPipeByteOrderForOneByteTypes) {
  auto a = ParseNpy(
      NumpyFile("{'descr': '=i4', 'fortran_order': False, 'shape': (1,), }", Int32Bytes({7})));
  ASSERT_OK(a);
  auto b = ParseNpy(NumpyFile("{'descr': '<u1', 'fortran_order': False, 'shape': (1,), }", "x"));
  ASSERT_OK(b);
  EXPECT_EQ(b->dtype, DType::kUInt8);
}

TEST(NpyTest, RejectsWhatItCannotRepresent) {
  EXPECT_THAT(ParseNpy(NumpyFile("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }",
                                 std::string(24, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, "Fortran-order"));
  EXPECT_THAT(ParseNpy(NumpyFile("{'descr': '>i4', 'fortran_order': False, 'shape': (1,), }",
                                 std::string(4, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, "big-endian"));
  EXPECT_THAT(ParseNpy(NumpyFile("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
                                 std::string(8, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, "unsupported dtype '<c8'"));
  EXPECT_THAT(ParseNpy(NumpyFile("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
                                 std::string(20, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs 24 data bytes, the file has 20"));
  EXPECT_THAT(ParseNpy("\x93NUMPZ\x01\x00"), StatusIs(absl::StatusCode::kInvalidArgument, "magic"));
  EXPECT_THAT(
      ParseNpy(NumpyFile("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }",
                         std::string(4, '\0'))),
      StatusIs(absl::StatusCode::kInvalidArgument, "structured"));
  NpyArray bf16;
  bf16.dtype = DType::kBFloat16;
  bf16.shape = {1};
  bf16.data = "ab";
  EXPECT_THAT(SerializeNpy(bf16), StatusIs(absl::StatusCode::kInvalidArgument, "no numpy"));
}

TEST(NpyTest, ReadMissingFileIsNotFound) {
  EXPECT_THAT(ReadNpy("/nonexistent/x.npy"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/x.npy"));
}

}  // namespace
}  // namespace tokensel::cli
