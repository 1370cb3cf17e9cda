// Handlers::Register passes the caller's principal to the mapper in the
// spec (FdRegionSpec::owner, CudaIpcSpec::owner): the device's FreeGate
// counts what that registration holds in the peer's share (free_gate.h;
// review2 of the seventh session, finding 1). The request has no such
// field: a client cannot name another peer.
#include <memory>
#include <string>
#include <variant>

#include "gtest/gtest.h"
#include "server/core/buffer_registry.h"
#include "server/core/region.h"
#include "server/grpc/handlers.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

// Records the spec it is asked to map and refuses it.
class RecordingMapper final : public core::RegionMapper {
 public:
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override {
    if (const auto* ipc = std::get_if<core::CudaIpcSpec>(&spec)) {
      owner = ipc->owner;
      ++maps;
    }
    return absl::UnavailableError("recorded");
  }
  std::string owner = "(none)";
  int maps = 0;
};

TEST(HandlersOwnerTest, ACudaIpcRegistrationCarriesTheCallersPrincipal) {
  RecordingMapper ipc;
  core::BufferRegistry registry(nullptr, &ipc, core::RegistryLimits{}, nullptr);
  ServiceDeps deps;
  deps.registry = &registry;
  Handlers handlers(deps);
  v1::RegisterBufferRequest request;
  request.set_name("acts");
  request.mutable_cuda_ipc()->set_handle(std::string(64, 'h'));
  request.mutable_cuda_ipc()->set_device_uuid("GPU-0");
  request.mutable_cuda_ipc()->set_size(16);
  v1::RegisterBufferResponse response;
  EXPECT_THAT(handlers.Register("s1", request, &response, "uid:1001"),
              ::tokensel::testing::StatusIs(absl::StatusCode::kUnavailable, "recorded"));
  EXPECT_EQ(ipc.maps, 1);
  EXPECT_EQ(ipc.owner, "uid:1001");
}

}  // namespace
}  // namespace tokensel::server
