// Server limits, each against its own real server started with a small
// limit: message size (RESOURCE_EXHAUSTED from gRPC), session expiry
// (NOT_FOUND), buffers per session, requests in flight (RESOURCE_EXHAUSTED
// immediately). After each, the server still serves a valid request.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/integration/fixture.h"

namespace tokensel::itest {
namespace {

using ::testing::HasSubstr;
using Stub = v1::TokenSelect::Stub;
using Code = absl::StatusCode;

class LimitsTest : public ServerFixture {};

TEST_F(LimitsTest, RequestAboveMaxMessageBytesIsResourceExhausted) {
  StartServer({.extra_args = {"--max_message_bytes=65536"}});
  v1::GatherTokensRequest req;
  *req.mutable_activations() =
      InlineTensor(DType::kFloat32, {1, 64, 512}, std::string(64 * 512 * 4, '\0'));  // 128 KiB
  *req.mutable_indices() = InlineTensor(DType::kInt32, {1, 1}, std::string(4, '\0'));
  v1::OpResponse resp;
  EXPECT_THAT(client_->Call(&Stub::GatherTokens, req, &resp), StatusIs(Code::kResourceExhausted));
  ExpectStillServes();
}

TEST_F(LimitsTest, ExpiredSessionIsNotFound) {
  StartServer({.extra_args = {"--session_ttl=300ms"}});
  ExpectStillServes();  // renews the lease
  // Bounded wait past the lease (the reaper or the next call ends it).
  absl::Status s;
  for (int i = 0; i < 40; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    if (i < 4) continue;  // at least 500 ms idle
    v1::ListBuffersResponse resp;
    s = client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &resp);
    if (!s.ok()) break;
  }
  EXPECT_THAT(s, StatusIs(Code::kNotFound, "session"));
  // A new session works (and the expired one's buffer was unregistered).
  ASSERT_OK(client_->Open());
  v1::ListBuffersResponse listed;
  ASSERT_OK(client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &listed));
  EXPECT_EQ(listed.buffers_size(), 0);
  ASSERT_OK(client_->Register("arena", shm_.name(), 0, shm_.size()));
  ExpectStillServes();
}

TEST_F(LimitsTest, TooManyBuffersIsResourceExhausted) {
  StartServer({.extra_args = {"--max_buffers=2"}});  // "arena" is the first
  ASSERT_OK(client_->Register("second", shm_.name(), 0, 4096));
  EXPECT_THAT(client_->Register("third", shm_.name(), 4096, 4096),
              StatusIs(Code::kResourceExhausted, "2"));
  // Freeing one makes room again.
  ASSERT_OK(client_->Unregister("second"));
  ASSERT_OK(client_->Register("third", shm_.name(), 4096, 4096));
  ExpectStillServes();
}

TEST_F(LimitsTest, TooManyInFlightIsResourceExhaustedImmediately) {
  StartServer({.extra_args = {"--max_inflight=1"}});
  constexpr int64_t kS = 2048, kC = 128, kR = 2048;  // 1 MiB in, 1 MiB out per gather
  constexpr int kThreads = 6;
  Arena a(kArenaBytes);
  // Every thread writes the same output region with identical values.
  const Placed act = a.Place(DType::kFloat32, {1, kS, kC});
  const Placed idx = a.Place(DType::kInt32, {1, kR});
  const Placed out = a.Place(DType::kFloat32, {1, kR, kC});
  FillIndices(idx.View(shm_.data()), kS, false, rng_);
  v1::ExecuteRequest req;  // 16 gathers: long enough to overlap
  for (int i = 0; i < 16; ++i) {
    auto* g = req.add_ops()->mutable_gather_tokens();
    *g->mutable_activations() = act.Ref("arena");
    *g->mutable_indices() = idx.Ref("arena");
    *g->mutable_out() = out.Ref("arena");
    g->set_batch_first(true);
  }
  std::atomic<int> ok{0}, exhausted{0}, other{0};
  std::string other_error;
  absl::Mutex mu;
  for (int round = 0; round < 5 && (ok == 0 || exhausted == 0); ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        Client c(server_->UnixChannel());
        c.set_session(client_->session());
        v1::ExecuteResponse resp;
        const absl::Status s = c.Call(&Stub::Execute, req, &resp);
        if (s.ok()) {
          ++ok;
        } else if (s.code() == Code::kResourceExhausted) {
          ++exhausted;
        } else {
          ++other;
          absl::MutexLock lock(&mu);
          other_error = s.ToString();
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(exhausted.load(), 0) << "max_inflight=1 never refused a concurrent request";
  EXPECT_EQ(other.load(), 0) << other_error;
  ExpectStillServes();
}

}  // namespace
}  // namespace tokensel::itest
