// tokensel::client pieces that need no server: status conversion, TensorRef,
// SharedRegion, CudaIpcRegion's build gate, option checks, and the
// deadline bound on wait_for_ready when nothing listens.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/client.h"
#include "tokensel/client/cuda_ipc_region.h"
#include "tokensel/client/fd_channel.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/status.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::client {
namespace {

using ::tokensel::testing::IsOk;
using ::tokensel::testing::StatusIs;

TEST(FromGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_OK(FromGrpcStatus(grpc::Status::OK));
  const struct {
    grpc::StatusCode grpc_code;
    absl::StatusCode absl_code;
  } cases[] = {
      {grpc::StatusCode::INVALID_ARGUMENT, absl::StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, absl::StatusCode::kDeadlineExceeded},
      {grpc::StatusCode::NOT_FOUND, absl::StatusCode::kNotFound},
      {grpc::StatusCode::ALREADY_EXISTS, absl::StatusCode::kAlreadyExists},
      {grpc::StatusCode::PERMISSION_DENIED, absl::StatusCode::kPermissionDenied},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StatusCode::kResourceExhausted},
      {grpc::StatusCode::FAILED_PRECONDITION, absl::StatusCode::kFailedPrecondition},
      {grpc::StatusCode::OUT_OF_RANGE, absl::StatusCode::kOutOfRange},
      {grpc::StatusCode::UNAVAILABLE, absl::StatusCode::kUnavailable},
      {grpc::StatusCode::INTERNAL, absl::StatusCode::kInternal},
      {grpc::StatusCode::UNAUTHENTICATED, absl::StatusCode::kUnauthenticated},
  };
  for (const auto& c : cases) {
    absl::Status s = FromGrpcStatus(grpc::Status(c.grpc_code, "indices: bad"));
    EXPECT_EQ(s.code(), c.absl_code);
    EXPECT_EQ(s.message(), "indices: bad");
  }
  // (Codes outside the enum cannot be constructed without UB: UBSan flags a
  // grpc::StatusCode of 99, so the kUnknown fallback is not exercised here.)
}

TEST(TensorRefTest, FillsByReference) {
  const v1::Tensor t = TensorRef::InBuffer("acts", 96)
                           .Dtype(v1::DTYPE_BFLOAT16)
                           .Shape({2, 3, 4})
                           .Strides({24, 8, 1})
                           .ToProto();
  EXPECT_EQ(t.dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_THAT(t.shape(), ::testing::ElementsAre(2, 3, 4));
  EXPECT_THAT(t.strides(), ::testing::ElementsAre(24, 8, 1));
  ASSERT_EQ(t.data_case(), v1::Tensor::kBuffer);
  EXPECT_EQ(t.buffer().buffer(), "acts");
  EXPECT_EQ(t.buffer().byte_offset(), 96u);
}

TEST(TensorRefTest, InlineValuesRoundTrip) {
  const std::vector<int64_t> values = {5, -1, 1LL << 40, 0, 7, 9};
  const TensorRef ref = TensorRef::InlineValues<int64_t>(values, {2, 3});
  EXPECT_OK(ref.Validate());
  const v1::Tensor t = ref.ToProto();
  EXPECT_EQ(t.dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(t.inline_data().size(), values.size() * 8);
  absl::StatusOr<std::vector<int64_t>> back = InlineValuesOf<int64_t>(t);
  ASSERT_OK(back.status());
  EXPECT_EQ(*back, values);
  EXPECT_THAT(InlineValuesOf<int32_t>(t).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "DTYPE_INT64, expected DTYPE_INT32"));
}

TEST(TensorRefTest, InlineOutputIsPresentWithoutData) {
  v1::GatherTokensRequest req;
  *req.mutable_out() = TensorRef::InlineOutput().ToProto();
  EXPECT_TRUE(req.has_out());
  EXPECT_EQ(req.out().data_case(), v1::Tensor::DATA_NOT_SET);
}

TEST(TensorRefTest, ValidateNamesTheProblem) {
  const std::vector<float> three = {1, 2, 3};
  EXPECT_THAT(TensorRef::InlineValues<float>(three, {2, 2}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "has 12 bytes"));
  EXPECT_THAT(TensorRef::InBuffer("b").Shape({2}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "DTYPE_UNSPECIFIED"));
  EXPECT_THAT(TensorRef::InBuffer("b").Dtype(v1::DTYPE_INT32).Shape({2, -1}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[1] = -1"));
  EXPECT_THAT(TensorRef::InBuffer("b").Dtype(v1::DTYPE_INT32).Shape({2, 2}).Strides({1}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "strides has 1 entries"));
  EXPECT_THAT(TensorRef::InBuffer("").Dtype(v1::DTYPE_INT32).Shape({2}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "buffer name"));
  EXPECT_THAT(TensorRef::InlineValues<float>(three, {3}).Strides({1}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "row-major"));
  EXPECT_THAT(TensorRef::InBuffer("b").Dtype(v1::DTYPE_INT8).Shape({1LL << 62, 8}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
}

TEST(FindOutputTest, ListsPresentNames) {
  v1::OpResponse resp;
  resp.add_outputs()->set_name("out");
  EXPECT_OK(FindOutput(resp, "out").status());
  EXPECT_THAT(FindOutput(resp, "inverse").status(),
              StatusIs(absl::StatusCode::kNotFound, "outputs: [out]"));
}

std::string TestPrefix() { return "/tokensel-ct-" + std::to_string(getpid()) + "-"; }

TEST(SharedRegionTest, CreateOpenUnlink) {
  const std::string name = SharedRegion::UniqueName(TestPrefix(), "a");
  {
    absl::StatusOr<SharedRegion> region =
        SharedRegion::Create(name, 4096, {.required_prefix = TestPrefix()});
    ASSERT_OK(region.status());
    EXPECT_EQ(region->size(), 4096u);
    std::memcpy(region->data() + 100, "tokensel", 8);
    EXPECT_THAT(SharedRegion::Create(name, 4096).status(),
                StatusIs(absl::StatusCode::kAlreadyExists, name));
    absl::StatusOr<SharedRegion> other = SharedRegion::Open(name);
    ASSERT_OK(other.status());
    EXPECT_EQ(other->size(), 4096u);
    EXPECT_EQ(std::memcmp(other->data() + 100, "tokensel", 8), 0);
    // The registration names the region's own descriptor.
    const v1::RegisterBufferRequest req = region->RegisterRequest("acts", 64);
    EXPECT_EQ(req.name(), "acts");
    EXPECT_EQ(req.fd().ticket(), LocalFdTicket(region->fd()));
    EXPECT_EQ(ParseLocalFdTicket(req.fd().ticket()), region->fd());
    EXPECT_EQ(req.fd().offset(), 64u);
    EXPECT_EQ(req.fd().size(), 4096u - 64u);
    const int fd = region->fd();
    SharedRegion moved = std::move(*region);
    EXPECT_EQ(moved.name(), name);
    EXPECT_EQ(moved.fd(), fd);
  }  // `moved` unlinks; `other` (Open) never does
  EXPECT_THAT(SharedRegion::Open(name).status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST(SharedRegionTest, SealedMemfdsCannotShrinkAndCloseTheirDescriptor) {
  int fd = -1;
  {
    absl::StatusOr<SharedRegion> region = SharedRegion::CreateSealed("unit", 8192);
    ASSERT_OK(region.status());
    EXPECT_EQ(region->size(), 8192u);
    EXPECT_EQ(region->name(), "memfd:unit");
    fd = region->fd();
    ASSERT_GE(fd, 0);
    EXPECT_EQ(fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
    EXPECT_NE(ftruncate(fd, 0), 0);
    region->data()[8191] = 7;  // mapped whole
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8192u);  // allocated up front
  }
  EXPECT_LT(fcntl(fd, F_GETFD), 0);  // closed with the region
  EXPECT_THAT(SharedRegion::CreateSealed("x", 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "size 0"));
  EXPECT_THAT(SharedRegion::CreateSealed(std::string(201, 'x'), 64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "label"));
}

TEST(FdChannelTest, PathsAndLocalTickets) {
  EXPECT_EQ(FdChannelPath("unix:///run/tokensel/tokensel.sock"), "/run/tokensel/tokensel.sock.fd");
  EXPECT_EQ(FdChannelPath("unix:rel/s.sock"), "rel/s.sock.fd");
  EXPECT_EQ(FdChannelPath("127.0.0.1:50051"), "");
  EXPECT_EQ(FdChannelPath("unix:"), "");
  EXPECT_EQ(ParseLocalFdTicket(LocalFdTicket(17)), 17);
  EXPECT_EQ(ParseLocalFdTicket("fd:-1"), -1);
  EXPECT_EQ(ParseLocalFdTicket("0123abcd"), -1);  // a server ticket
  EXPECT_EQ(ParseLocalFdTicket("fd:"), -1);
  EXPECT_THAT(SendFd("", "s", v1::FD_KIND_HOST_MEMORY, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not a unix socket"));
  EXPECT_THAT(SendFd("/nonexistent/tokensel.sock.fd", "s", v1::FD_KIND_HOST_MEMORY, 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, "listening there"));
}

TEST(SharedRegionTest, KeepsObjectWhenAsked) {
  const std::string name = SharedRegion::UniqueName(TestPrefix(), "keep");
  {
    absl::StatusOr<SharedRegion> region =
        SharedRegion::Create(name, 128, {.unlink_on_destroy = false});
    ASSERT_OK(region.status());
  }
  EXPECT_OK(SharedRegion::Open(name).status());
  shm_unlink(name.c_str());
}

TEST(SharedRegionTest, RejectsBadNamesAndSizes) {
  EXPECT_THAT(SharedRegion::Create("/other-x", 64, {.required_prefix = "/tokensel"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefix \"/tokensel\""));
  EXPECT_THAT(SharedRegion::Create("no-slash", 64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be \"/\""));
  EXPECT_THAT(SharedRegion::Create("/a/b", 64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SharedRegion::Create(SharedRegion::UniqueName(TestPrefix(), "z"), 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "size 0"));
}

TEST(CudaIpcRegionTest, GatedByBuild) {
  int dummy = 0;
  absl::StatusOr<CudaIpcRegion> region = CudaIpcRegion::FromDevicePointer(&dummy, sizeof(dummy));
  if (!CudaIpcRegion::BuiltWithCuda()) {
    EXPECT_THAT(region.status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
  } else {
    // Host memory is never accepted (no device: FAILED_PRECONDITION).
    EXPECT_FALSE(region.ok());
  }
  EXPECT_THAT(CudaIpcRegion::FromDevicePointer(nullptr, 1).status(), ::testing::Not(IsOk()));
}

TEST(ClientTest, RejectsBadOptions) {
  EXPECT_THAT(Client::Connect("").status(), StatusIs(absl::StatusCode::kInvalidArgument, "target"));
  EXPECT_THAT(Client::Connect(kDefaultTarget, {.deadline = absl::ZeroDuration()}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "deadline"));
  ClientOptions backoff;
  backoff.max_reconnect_backoff = absl::Milliseconds(10);
  EXPECT_THAT(Client::Connect(kDefaultTarget, backoff).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "backoff"));
}

// wait_for_ready waits for a server that never comes, but only until the
// deadline; without it an unreachable server fails fast with UNAVAILABLE.
TEST(ClientTest, NoServerEndsAtTheDeadline) {
  const std::string target = "unix:///tmp/tokensel-ct-none-" + std::to_string(getpid()) + ".sock";
  absl::StatusOr<Client> client = Client::Connect(target, {.deadline = absl::Milliseconds(300)});
  ASSERT_OK(client.status());
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->Ping(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(250));
  // The deadline ended the call (not the test timeout); how close to it is a
  // latency question for a benchmark, not a bound to gate CI on.
  EXPECT_LT(waited, absl::Seconds(60));
  EXPECT_THAT(client->WithWaitForReady(false).WithDeadline(absl::Seconds(20)).Ping(),
              StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace tokensel::client
