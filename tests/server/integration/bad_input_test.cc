// Bad input against a real server, one case per test: the specific status
// code, a message naming the field, nothing written, and the server still
// serves the next valid request (ExpectStillServes).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/integration/fixture.h"
#include "tests/testing/http_get.h"
#include "tokensel/client/fd_channel.h"

namespace tokensel::itest {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Stub = v1::TokenSelect::Stub;
using Code = absl::StatusCode;

class BadInputTest : public ServerFixture {
 protected:
  void SetUp() override { StartServer(); }

  // A valid gather by reference; tests break one field.
  struct Gather {
    Placed act, idx, out;
    v1::GatherTokensRequest req;
  };
  Gather ValidGather() {
    Arena a(kArenaBytes);
    Gather g{a.Place(DType::kFloat32, {2, 16, 8}),
             a.Place(DType::kInt32, {2, 5}),
             a.Place(DType::kFloat32, {2, 5, 8}),
             {}};
    FillIndices(g.idx.View(shm_.data()), 16, false, rng_);
    *g.req.mutable_activations() = g.act.Ref("arena");
    *g.req.mutable_indices() = g.idx.Ref("arena");
    *g.req.mutable_out() = g.out.Ref("arena");
    g.req.set_batch_first(true);
    return g;
  }
  // Runs `req`, expects `code` with every substring in the message, and
  // checks the shm arena is unchanged.
  template <typename Req>
  void ExpectRejected(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&,
                                                   v1::OpResponse*),
                      const Req& req, Code code, std::vector<std::string> substrings) {
    const std::vector<uint8_t> before(shm_.data(), shm_.data() + shm_.size());
    v1::OpResponse resp;
    const absl::Status s = client_->Call(method, req, &resp);
    EXPECT_THAT(s, StatusIs(code));
    for (const auto& sub : substrings) EXPECT_THAT(std::string(s.message()), HasSubstr(sub));
    EXPECT_EQ(0, std::memcmp(before.data(), shm_.data(), shm_.size())) << "something was written";
    ExpectStillServes();
  }
  absl::Status RegisterShm(const std::string& name, const std::string& shm_name, uint64_t offset,
                           uint64_t size) {
    return client_->Register(name, shm_name, offset, size).status();
  }
};

TEST_F(BadInputTest, UnknownBufferIsNotFound) {
  Gather g = ValidGather();
  g.req.mutable_indices()->mutable_buffer()->set_buffer("no-such-buffer");
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kNotFound, {"indices", "no-such-buffer"});
}

TEST_F(BadInputTest, AnotherSessionsBufferIsPermissionDenied) {
  Client other(server_->UnixChannel());
  other.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(other.Open());
  ASSERT_OK(other.Register("theirs", shm_.name(), 0, 65536));
  Gather g = ValidGather();
  g.req.mutable_activations()->mutable_buffer()->set_buffer("theirs");
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kPermissionDenied, {"activations", "theirs"});
}

TEST_F(BadInputTest, ViewPastTheBufferIsOutOfRange) {
  Gather g = ValidGather();
  g.req.mutable_out()->mutable_buffer()->set_byte_offset(kArenaBytes - 100);
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kOutOfRange, {"out", "byte_offset"});
}

TEST_F(BadInputTest, ViewOffsetOverflowIsOutOfRange) {
  Gather g = ValidGather();
  g.req.mutable_out()->mutable_buffer()->set_byte_offset(std::numeric_limits<uint64_t>::max() - 16);
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kOutOfRange, {"out", "byte_offset"});
}

TEST_F(BadInputTest, RegionPastTheShmObjectIsOutOfRange) {
  EXPECT_THAT(RegisterShm("past", shm_.name(), kArenaBytes - 10, 4096),
              StatusIs(Code::kOutOfRange, "fd.offset"));
  ExpectStillServes();
}

TEST_F(BadInputTest, RegionOffsetOverflowIsOutOfRange) {
  EXPECT_THAT(
      RegisterShm("overflow", shm_.name(), std::numeric_limits<uint64_t>::max() - 100, 4096),
      StatusIs(Code::kOutOfRange, AllOf(HasSubstr("fd.offset"), HasSubstr("overflow"))));
  ExpectStillServes();
}

TEST_F(BadInputTest, StridesExceedingTheBufferAreOutOfRange) {
  Gather g = ValidGather();
  auto* act = g.req.mutable_activations();
  act->clear_strides();
  for (int64_t s : {int64_t{1} << 20, int64_t{8}, int64_t{1}}) act->add_strides(s);  // 4 MiB
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kOutOfRange, {"activations", "extent"});
}

TEST_F(BadInputTest, NegativeDimIsInvalid) {
  Gather g = ValidGather();
  g.req.mutable_activations()->set_shape(1, -16);
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kInvalidArgument, {"activations", "negative"});
}

TEST_F(BadInputTest, ZeroRetainedTokensIsInvalid) {
  Arena a(kArenaBytes);
  const Placed ids = a.Place(DType::kInt32, {2, 4});
  v1::SortTokensRequest req;
  *req.mutable_ids() = ids.Ref("arena");
  req.mutable_ids()->set_shape(1, 0);  // R = 0
  req.set_original_tokens(16);
  ExpectRejected(&Stub::SortTokens, req, Code::kInvalidArgument, {"ids"});
}

TEST_F(BadInputTest, ScatterDtypeMismatchIsInvalid) {
  Arena a(kArenaBytes);
  const Placed all = a.Place(DType::kFloat32, {2, 16, 8});
  const Placed layer = a.Place(DType::kFloat16, {2, 4, 8});
  const Placed idx = a.Place(DType::kInt32, {2, 4});
  FillIndices(idx.View(shm_.data()), 16, true, rng_);
  v1::ScatterTokensRequest req;
  *req.mutable_all() = all.Ref("arena");
  *req.mutable_layer() = layer.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  req.set_batch_first(true);
  ExpectRejected(&Stub::ScatterTokens, req, Code::kInvalidArgument, {"layer", "dtype"});
}

TEST_F(BadInputTest, IndexOutOfRangeIsInvalid) {
  Gather g = ValidGather();
  kernels::StoreIndex(g.idx.View(shm_.data()), 7, 16);  // row 1, position 2: S
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kInvalidArgument, {"indices", "16"});
}

TEST_F(BadInputTest, DuplicateScatterIndexIsInvalid) {
  Arena a(kArenaBytes);
  const Placed all = a.Place(DType::kFloat32, {1, 16, 8});
  const Placed layer = a.Place(DType::kFloat32, {1, 4, 8});
  const Placed idx = a.Place(DType::kInt64, {1, 4});
  for (int64_t r = 0; r < 4; ++r) kernels::StoreIndex(idx.View(shm_.data()), r, r == 3 ? 5 : r + 4);
  v1::ScatterTokensRequest req;
  *req.mutable_all() = all.Ref("arena");
  *req.mutable_layer() = layer.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  req.set_batch_first(true);
  ExpectRejected(&Stub::ScatterTokens, req, Code::kInvalidArgument, {"indices", "5"});
}

// This server's backend is the CPU (no GPU here): it has no cuda_ipc mapper
// at all, so no registration can make it open a handle, nor create a context
// on a GPU of the host (the sixth review). Malformed or well formed, a
// cuda_ipc registration is FAILED_PRECONDITION naming the kind; the
// mapper's own field checks (handle length, ...) are CudaIpcMapperTest's.
TEST_F(BadInputTest, CudaIpcOnACpuBackendIsRefusedWithoutAMapper) {
  for (const size_t handle_bytes : {size_t{10}, size_t{64}}) {
    v1::RegisterBufferRequest req;
    req.set_name("gpu");
    req.mutable_cuda_ipc()->set_handle(std::string(handle_bytes, '\x01'));
    req.mutable_cuda_ipc()->set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
    req.mutable_cuda_ipc()->set_size(4096);
    v1::RegisterBufferResponse resp;
    EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, req, &resp),
                StatusIs(Code::kFailedPrecondition, "this server cannot map cuda_ipc buffers"))
        << handle_bytes << "-byte handle";
  }
  ExpectStillServes();
}

TEST_F(BadInputTest, RegistrationByNameIsRefusedWhateverTheObject) {
  // Even the arena this client registered by descriptor: the server never
  // opens an object with its own rights.
  v1::RegisterBufferRequest req;
  req.set_name("by-name");
  req.mutable_host_shm()->set_shm_name(shm_.name());
  req.mutable_host_shm()->set_size(4096);
  v1::RegisterBufferResponse resp;
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, req, &resp),
              StatusIs(Code::kPermissionDenied, "registration by name is refused"));
  ExpectStillServes();
}

TEST_F(BadInputTest, DescriptorsThatAreNotSharedMemoryAreRefusedOnArrival) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  EXPECT_THAT(client::SendFd(server_->fd_channel_path(), client_->session(),
                             v1::FD_KIND_HOST_MEMORY, pipe_fds[0])
                  .status(),
              StatusIs(Code::kInvalidArgument, "a pipe cannot be registered"));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // A read-only descriptor of the arena: PERMISSION_DENIED.
  const int read_only = shm_open(shm_.name().c_str(), O_RDONLY | O_CLOEXEC, 0);
  ASSERT_GE(read_only, 0);
  EXPECT_THAT(client::SendFd(server_->fd_channel_path(), client_->session(),
                             v1::FD_KIND_HOST_MEMORY, read_only)
                  .status(),
              StatusIs(Code::kPermissionDenied, "not open for reading and writing"));
  close(read_only);
  ExpectStillServes();
}

// FD_KIND_CUDA_VMM on this server (CPU backend): FAILED_PRECONDITION, even
// on a host with a GPU: a CPU backend has no VMM mapper (it must not map, and
// create contexts on, GPUs it does not use). No ticket is issued and the
// server goes on.
TEST_F(BadInputTest, CudaVmmDescriptorsGetAPreciseError) {
  const int memfd = memfd_create("not-vmm", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  absl::StatusOr<v1::FdChannelReply> reply =
      client::SendFd(server_->fd_channel_path(), client_->session(), v1::FD_KIND_CUDA_VMM, memfd);
  close(memfd);
  ASSERT_FALSE(reply.ok());
  EXPECT_THAT(reply.status(), StatusIs(Code::kFailedPrecondition, "cuda_vmm: "));
  EXPECT_THAT(std::string(reply.status().message()),
              ::testing::HasSubstr("its backend does not use CUDA devices"));
  ExpectStillServes();
}

TEST_F(BadInputTest, ATicketServesOnlyItsSessionAndOnlyOnce) {
  const int fd = shm_open(shm_.name().c_str(), O_RDWR | O_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  absl::StatusOr<v1::FdChannelReply> reply =
      client::SendFd(server_->fd_channel_path(), client_->session(), v1::FD_KIND_HOST_MEMORY, fd);
  close(fd);
  ASSERT_OK(reply);
  v1::RegisterBufferRequest req;
  req.set_name("ticketed");
  req.mutable_fd()->set_ticket(reply->ticket());
  req.mutable_fd()->set_size(4096);
  v1::RegisterBufferResponse resp;
  Client other(server_->UnixChannel());
  ASSERT_OK(other.Open());
  EXPECT_THAT(other.Call(&Stub::RegisterBuffer, req, &resp),
              StatusIs(Code::kNotFound, "fd.ticket: no such ticket in this session"));
  ASSERT_OK(client_->Call(&Stub::RegisterBuffer, req, &resp));
  req.set_name("twice");
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, req, &resp), StatusIs(Code::kNotFound));
  ExpectStillServes();
}

// PassedFd.segments (a CUDA VMM buffer of several allocations), against the
// CPU server: the request's own checks come before any ticket is used up
// (the tickets then still register), a repeated, unknown or other session's
// ticket names its index and uses up none, and host-memory tickets are not
// segments. Every refusal registers nothing and the server keeps serving.
TEST_F(BadInputTest, VmmSegmentsAreCheckedBeforeAnyTicketIsUsed) {
  auto ticket = [&](Client* who) {
    const int fd = shm_open(shm_.name().c_str(), O_RDWR | O_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    absl::StatusOr<v1::FdChannelReply> reply =
        client::SendFd(server_->fd_channel_path(), who->session(), v1::FD_KIND_HOST_MEMORY, fd);
    close(fd);
    EXPECT_OK(reply);
    return reply.ok() ? reply->ticket() : std::string();
  };
  const std::string t0 = ticket(client_.get()), t1 = ticket(client_.get());
  Client other(server_->UnixChannel());
  ASSERT_OK(other.Open());
  const std::string theirs = ticket(&other);
  v1::RegisterBufferResponse resp;
  auto request = [](const std::vector<std::string>& tickets, uint64_t each) {
    v1::RegisterBufferRequest req;
    req.set_name("segmented");
    req.mutable_fd()->set_size(4096);
    req.mutable_fd()->set_device_uuid("GPU-00000000-0000-0000-0000-00000000000a");
    for (const std::string& t : tickets) {
      v1::VmmSegment* seg = req.mutable_fd()->add_segments();
      seg->set_ticket(t);
      seg->set_allocation_size(each);
    }
    return req;
  };
  v1::RegisterBufferRequest both = request({t0, t1}, 2 << 20);
  both.mutable_fd()->set_allocation_size(4 << 20);
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, both, &resp),
              StatusIs(Code::kInvalidArgument, "fd.segments supersedes fd.ticket"));
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer,
                            request(std::vector<std::string>(129, t0), 2 << 20), &resp),
              StatusIs(Code::kInvalidArgument,
                       "fd.segments has 129 entries; a buffer spans at "
                       "most 128"));
  v1::RegisterBufferRequest zero = request({t0, t1}, 2 << 20);
  zero.mutable_fd()->mutable_segments(1)->set_allocation_size(0);
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, zero, &resp),
              StatusIs(Code::kInvalidArgument, "fd.segments[1].allocation_size must be > 0"));
  EXPECT_THAT(
      client_->Call(&Stub::RegisterBuffer, request({t0, t1, t0}, 2 << 20), &resp),
      StatusIs(Code::kInvalidArgument, "fd.segments[2].ticket is fd.segments[0].ticket again"));
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, request({t0, theirs}, 2 << 20), &resp),
              StatusIs(Code::kNotFound, "fd.segments[1].ticket: no such ticket in this session"));
  // None of the above used a ticket up: host-memory tickets are redeemed
  // now, and refused as segments.
  EXPECT_THAT(client_->Call(&Stub::RegisterBuffer, request({t0, t1}, 2 << 20), &resp),
              StatusIs(Code::kInvalidArgument,
                       "fd.segments[0].ticket names a FD_KIND_HOST_MEMORY descriptor"));
  v1::RegisterBufferRequest plain;
  plain.set_name("plain");
  plain.mutable_fd()->set_ticket(theirs);
  plain.mutable_fd()->set_size(4096);
  EXPECT_OK(other.Call(&Stub::RegisterBuffer, plain, &resp));  // theirs was not used up
  v1::ListBuffersResponse list;
  ASSERT_OK(client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &list));
  for (const v1::BufferInfo& b : list.buffers()) EXPECT_NE(b.name(), "segmented");
  ExpectStillServes();
}

TEST_F(BadInputTest, InlineLengthMismatchIsInvalid) {
  Gather g = ValidGather();
  *g.req.mutable_indices() = InlineTensor(DType::kInt32, {2, 5}, std::string(39, '\0'));
  ExpectRejected(&Stub::GatherTokens, g.req, Code::kInvalidArgument, {"indices", "39", "40"});
}

TEST_F(BadInputTest, UnregisterWhileInUseIsDeferred) {
  // One large gather (64 MiB in, 64 MiB out) on buffer "big"; "big" is
  // unregistered while it runs. The op must complete OK with the right bytes;
  // afterwards the name is gone. If the op finished before the unregister
  // returned, or had not resolved its buffers yet (NOT_FOUND), the attempt
  // proves nothing and is redone (bounded).
  constexpr int64_t kS = 8192, kC = 2048, kR = 8192;
  const uint64_t bytes = uint64_t{kS} * kC * 4 * 2 + (1 << 20);
  auto big = TestShm::Create(server_->shm_prefix() + "big", bytes);
  ASSERT_OK(big);
  Arena a(bytes);
  const Placed act = a.Place(DType::kFloat32, {1, kS, kC});
  const Placed idx = a.Place(DType::kInt32, {1, kR});
  const Placed out = a.Place(DType::kFloat32, {1, kR, kC});
  FillBytes(big->data(), act.extent_bytes, rng_);
  FillIndices(idx.View(big->data()), kS, false, rng_);
  std::vector<uint8_t> expect(out.extent_bytes);
  Placed local_out = out;
  local_out.offset = 0;
  ASSERT_OK(kernels::cpu::GatherTokens(
      {act.View(big->data()), idx.View(big->data()), local_out.View(expect.data()), true},
      nullptr));
  v1::GatherTokensRequest req;
  *req.mutable_activations() = act.Ref("big");
  *req.mutable_indices() = idx.Ref("big");
  *req.mutable_out() = out.Ref("big");
  req.set_batch_first(true);

  bool proven = false;
  for (int attempt = 0; attempt < 5 && !proven; ++attempt) {
    std::memset(big->data() + out.offset, 0, out.extent_bytes);
    ASSERT_OK(client_->Register("big", big->name(), 0, big->size()));
    std::atomic<bool> op_done{false};
    absl::Status op_status;
    std::thread op([&] {
      v1::OpResponse resp;
      op_status = client_->Call(&Stub::GatherTokens, req, &resp);
      op_done = true;
    });
    // Unregister once the Execute is in flight (bounded wait for the server
    // to count it), so the lease is (very likely) already held.
    for (int i = 0; i < 200 && !op_done; ++i) {
      auto page = ::tokensel::testing::HttpGet(server_->metrics_port(), "/metrics");
      if (page.ok() &&
          ::tokensel::testing::MetricValue(page->body, "tokensel_inflight_requests") >= 1.0) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    absl::SleepFor(absl::Milliseconds(5 * attempt));
    const absl::Status unregistered = client_->Unregister("big");
    const bool raced = !op_done.load();
    op.join();
    ASSERT_OK(unregistered);
    std::fprintf(stderr, "attempt %d: unregister %s the op, op: %s\n", attempt,
                 raced ? "during" : "after", op_status.ToString().c_str());
    if (!raced) continue;                               // the op had already finished: inconclusive
    if (op_status.code() == Code::kNotFound) continue;  // not yet resolved: inconclusive
    ASSERT_OK(op_status) << "an op in flight failed because its buffer was unregistered";
    EXPECT_EQ(0, std::memcmp(expect.data(), big->data() + out.offset, expect.size()));
    proven = true;
  }
  EXPECT_TRUE(proven) << "never managed to unregister while the op was in flight";
  // The name is gone now.
  v1::OpResponse resp;
  EXPECT_THAT(client_->Call(&Stub::GatherTokens, req, &resp), StatusIs(Code::kNotFound, "big"));
  ExpectStillServes();
}

}  // namespace
}  // namespace tokensel::itest
