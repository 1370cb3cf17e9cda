// The integration test fixture: one real tokensel-server per test, a shm
// arena registered as buffer "arena" by a client on the unix socket (or TCP),
// and a known-good request to prove the server still serves after an error.
#ifndef TOKENSEL_TESTS_SERVER_INTEGRATION_FIXTURE_H_
#define TOKENSEL_TESTS_SERVER_INTEGRATION_FIXTURE_H_

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/server_process.h"
#include "tests/testing/shm_region.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::itest {

using ::tokensel::testing::ServerOptions;
using ::tokensel::testing::ServerProcess;
using ::tokensel::testing::StatusIs;
using ::tokensel::testing::TestShm;

enum class Transport { kUnix, kTcp };

inline std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::kUnix ? "Unix" : "Tcp";
}

class ServerFixture : public ::testing::Test {
 protected:
  static constexpr uint64_t kArenaBytes = 4 << 20;

  // Starts the server with `options` and maps the arena; on the unix socket
  // it is registered as "arena" (a TCP session cannot receive descriptors:
  // only local clients register memory).
  void StartServer(ServerOptions options = {}, Transport transport = Transport::kUnix) {
    auto server = ServerProcess::Start(std::move(options));
    ASSERT_OK(server);
    server_ = std::move(server).value();
    auto shm = TestShm::Create(server_->shm_prefix() + "arena", kArenaBytes);
    ASSERT_OK(shm);
    shm_ = std::move(shm).value();
    FillBytes(shm_.data(), shm_.size(), rng_);
    client_ = MakeClient(transport);
    ASSERT_OK(client_->Open());
    if (transport == Transport::kUnix) {
      ASSERT_OK(client_->Register("arena", shm_.name(), 0, shm_.size()));
    }
  }

  std::unique_ptr<Client> MakeClient(Transport transport) const {
    if (transport == Transport::kTcp) return std::make_unique<Client>(server_->TcpChannel());
    auto client = std::make_unique<Client>(server_->UnixChannel());
    client->set_fd_channel(server_->fd_channel_path());
    return client;
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::string out = server_->Output();
      if (out.size() > 8000) out = "..." + out.substr(out.size() - 8000);
      std::fprintf(stderr, "--- server output (tail) ---\n%s\n---\n", out.c_str());
    }
  }

  // A valid batch-first fp32 gather by reference, checked against the
  // oracle: proves the server still serves correctly (after an error).
  void ExpectStillServes(Client* client = nullptr) {
    if (client == nullptr) client = client_.get();
    Arena arena(kArenaBytes);
    arena.Place(DType::kUInt8, {check_slot_ * 4096 + 1});  // keep checks apart
    ++check_slot_;
    const Placed act = arena.Place(DType::kFloat32, {2, 16, 8});
    const Placed idx = arena.Place(DType::kInt32, {2, 5});
    const Placed out = arena.Place(DType::kFloat32, {2, 5, 8});
    FillIndices(idx.View(shm_.data()), 16, /*unique=*/false, rng_);
    std::vector<uint8_t> oracle(shm_.data(), shm_.data() + shm_.size());
    ASSERT_OK(kernels::cpu::GatherTokens(
        {act.View(oracle.data()), idx.View(oracle.data()), out.View(oracle.data()), true},
        nullptr));
    v1::GatherTokensRequest req;
    *req.mutable_activations() = act.Ref("arena");
    *req.mutable_indices() = idx.Ref("arena");
    *req.mutable_out() = out.Ref("arena");
    req.set_batch_first(true);
    v1::OpResponse resp;
    ASSERT_OK(client->Call(&v1::TokenSelect::Stub::GatherTokens, req, &resp));
    ASSERT_EQ(0, std::memcmp(oracle.data(), shm_.data(), shm_.size()))
        << "shm differs from the oracle after a valid gather";
  }

  std::mt19937_64 rng_{20240611};
  std::unique_ptr<ServerProcess> server_;
  TestShm shm_;
  std::unique_ptr<Client> client_;
  int64_t check_slot_ = 0;
};

}  // namespace tokensel::itest

#endif  // TOKENSEL_TESTS_SERVER_INTEGRATION_FIXTURE_H_
