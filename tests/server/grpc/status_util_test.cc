#include "server/grpc/status_util.h"

#include <string>

#include "gtest/gtest.h"

namespace tokensel::server {
namespace {

struct CodeCase {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
  const char* name;
};

// Written out by hand from google.rpc.Code, independently of the mapping.
constexpr CodeCase kCases[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK, "OK"},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED, "CANCELLED"},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN, "UNKNOWN"},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT, "INVALID_ARGUMENT"},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND, "NOT_FOUND"},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS, "ALREADY_EXISTS"},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED, "PERMISSION_DENIED"},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED,
     "RESOURCE_EXHAUSTED"},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION,
     "FAILED_PRECONDITION"},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED, "ABORTED"},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE, "OUT_OF_RANGE"},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED, "UNIMPLEMENTED"},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL, "INTERNAL"},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE, "UNAVAILABLE"},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS, "DATA_LOSS"},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED, "UNAUTHENTICATED"},
};

TEST(StatusUtilTest, EveryCodeMapsOneToOneWithItsMessage) {
  for (const CodeCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string message = std::string("field x: ") + c.name;
    const grpc::Status g = ToGrpcStatus(absl::Status(c.absl_code, message));
    EXPECT_EQ(g.error_code(), c.grpc_code);
    if (c.absl_code == absl::StatusCode::kOk) {
      EXPECT_TRUE(g.ok());
      EXPECT_EQ(g.error_message(), "");  // absl drops the message of OK
    } else {
      EXPECT_EQ(g.error_message(), message);
    }
  }
}

TEST(StatusUtilTest, EveryCodeHasItsCanonicalName) {
  for (const CodeCase& c : kCases) {
    EXPECT_EQ(StatusCodeName(c.absl_code), c.name);
  }
  EXPECT_EQ(StatusCodeName(static_cast<absl::StatusCode>(99)), "UNKNOWN");
}

TEST(StatusUtilTest, EmptyMessagePassesThrough) {
  const grpc::Status g = ToGrpcStatus(absl::NotFoundError(""));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(g.error_message(), "");
}

}  // namespace
}  // namespace tokensel::server
