// The server's health follows its backend (issue 12): a backend that loses a
// device (healthy() false, as CudaBackend after a sticky CUDA error) turns
// grpc.health.v1 NOT_SERVING within a reap interval, for good. A fake backend
// stands for the GPU (ServerOptions::make_backend).
#include <atomic>
#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "tests/server/core/forwarding_backend.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/testing/eventually.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::tokensel::server::testing::HealthCheck;
using ::tokensel::server::testing::InProcessServer;

using ::tokensel::server::testing::kNotServing;
using ::tokensel::server::testing::kServing;

// A CPU backend whose health the test sets.
class LosableBackend : public tokensel::testing::ForwardingBackend {
 public:
  explicit LosableBackend(std::shared_ptr<std::atomic<bool>> healthy)
      : healthy_(std::move(healthy)) {}
  bool healthy() const override { return healthy_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> healthy_;
};

int Health(InProcessServer& s, const std::string& service) {
  absl::StatusOr<int> status = HealthCheck(s.channel(), service);
  return status.ok() ? *status : -1;
}

TEST(ServerHealthTest, ALostDeviceTurnsHealthNotServingForGood) {
  auto healthy = std::make_shared<std::atomic<bool>>(true);
  ServerOptions options;
  options.reap_interval = absl::Milliseconds(10);
  options.make_backend = [healthy]() -> absl::StatusOr<std::unique_ptr<core::Backend>> {
    return std::unique_ptr<core::Backend>(new LosableBackend(healthy));
  };
  absl::StatusOr<std::unique_ptr<InProcessServer>> s = InProcessServer::Start(std::move(options));
  ASSERT_OK(s);
  EXPECT_EQ(Health(**s, ""), kServing);
  absl::SleepFor(absl::Milliseconds(50));  // several polls of a healthy backend
  EXPECT_EQ(Health(**s, "tokensel.v1.TokenSelect"), kServing);

  healthy->store(false);
  EXPECT_TRUE(tokensel::testing::Eventually([&] { return Health(**s, "") == kNotServing; }));
  EXPECT_EQ(Health(**s, "tokensel.v1.TokenSelect"), kNotServing);
  healthy->store(true);  // a lost context does not come back: nor does SERVING
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Health(**s, ""), kNotServing);
}

}  // namespace
}  // namespace tokensel::server
