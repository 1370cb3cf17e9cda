#include "server/core/buffer_registry.h"

#include <string>
#include <thread>

#include "absl/synchronization/barrier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/server/core/metric_reader.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::core {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using tokensel::testing::FakeRegionMapper;
using tokensel::testing::IsOk;
using tokensel::testing::StatusIs;

RegistryLimits Limits(uint32_t per_session, uint32_t total = 1000) {
  RegistryLimits limits;
  limits.max_buffers_per_session = per_session;
  limits.max_buffers = total;
  return limits;
}

class BufferRegistryTest : public ::testing::Test {
 protected:
  BufferRegistryTest() : registry_(&mapper_, nullptr, Limits(/*per_session=*/3), nullptr) {
    mapper_.AddObject("/obj", 4096);
  }
  // A spec naming `name`'s object by descriptor, as the fd channel delivers it.
  FdRegionSpec Shm(const std::string& name, uint64_t size, uint64_t offset = 0) {
    return mapper_.Spec(name, offset, size);
  }
  FakeRegionMapper mapper_;
  BufferRegistry registry_;
};

TEST_F(BufferRegistryTest, RegisterReportsInfoAndCounts) {
  absl::StatusOr<BufferInfo> info = registry_.Register("s1", "acts", Shm("/obj", 1024, 512));
  ASSERT_OK(info);
  EXPECT_EQ(info->name, "acts");
  EXPECT_EQ(info->kind, "host_shm");
  EXPECT_EQ(info->size, 1024u);
  EXPECT_EQ(registry_.buffer_count(), 1u);
  EXPECT_EQ(registry_.registered_bytes(), 1024u);
  EXPECT_EQ(mapper_.live_mappings(), 1);
  absl::StatusOr<BufferLease> lease = registry_.Acquire("s1", "acts");
  ASSERT_OK(lease);
  EXPECT_EQ((*lease)->region().size(), 1024u);
}

TEST_F(BufferRegistryTest, DuplicateNameInSessionIsAlreadyExistsWithoutMapping) {
  ASSERT_OK(registry_.Register("s1", "acts", Shm("/obj", 64)));
  EXPECT_THAT(registry_.Register("s1", "acts", Shm("/obj", 64)),
              StatusIs(absl::StatusCode::kAlreadyExists, "'acts'"));
  EXPECT_EQ(mapper_.map_calls(), 1);
  // Names are per session.
  EXPECT_OK(registry_.Register("s2", "acts", Shm("/obj", 64)));
  EXPECT_EQ(registry_.buffer_count(), 2u);
}

TEST_F(BufferRegistryTest, PerSessionLimit) {
  for (const char* name : {"a", "b", "c"})
    ASSERT_OK(registry_.Register("s1", name, Shm("/obj", 8)));
  EXPECT_THAT(registry_.Register("s1", "d", Shm("/obj", 8)),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_buffers"));
  EXPECT_EQ(mapper_.map_calls(), 3);
  EXPECT_OK(registry_.Register("s2", "d", Shm("/obj", 8)));  // other sessions unaffected
  ASSERT_OK(registry_.Unregister("s1", "a"));
  EXPECT_OK(registry_.Register("s1", "d", Shm("/obj", 8)));
}

TEST_F(BufferRegistryTest, NamesAreValidated) {
  EXPECT_OK(ValidateBufferName("layer.3/acts:fp16_x-1"));
  EXPECT_OK(ValidateBufferName(std::string(128, 'a')));
  EXPECT_THAT(ValidateBufferName(""), StatusIs(absl::StatusCode::kInvalidArgument, "name"));
  EXPECT_THAT(ValidateBufferName(std::string(129, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "129"));
  EXPECT_THAT(ValidateBufferName("a b"), StatusIs(absl::StatusCode::kInvalidArgument, "0x20"));
  EXPECT_THAT(ValidateBufferName(std::string("a\0b", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, "character 1"));
  EXPECT_THAT(registry_.Register("s1", "bad name", Shm("/obj", 8)),
              StatusIs(absl::StatusCode::kInvalidArgument, "name"));
  EXPECT_EQ(mapper_.map_calls(), 0);
}

TEST_F(BufferRegistryTest, MapperErrorsPassThroughAndRegisterNothing) {
  EXPECT_THAT(registry_.Register("s1", "x", Shm("/missing", 8)),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(registry_.Register("s1", "x", Shm("/obj", 8, 4090)),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(registry_.buffer_count(), 0u);
  EXPECT_EQ(mapper_.live_mappings(), 0);
  // No CUDA IPC mapper configured.
  EXPECT_THAT(registry_.Register("s1", "x", CudaIpcSpec{std::string(64, 'h'), "GPU-0", 0, 8}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuda_ipc"));
}

TEST_F(BufferRegistryTest, UnregisterIsDeferredWhileALeaseIsHeld) {
  uint8_t* object = mapper_.AddObject("/data", 16);
  object[3] = 42;
  ASSERT_OK(registry_.Register("s1", "acts", Shm("/data", 16)));
  absl::StatusOr<BufferLease> lease = registry_.Acquire("s1", "acts");
  ASSERT_OK(lease);
  ASSERT_OK(registry_.Unregister("s1", "acts"));
  // The name is gone at once ...
  EXPECT_THAT(registry_.Acquire("s1", "acts"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(registry_.buffer_count(), 0u);
  EXPECT_EQ(registry_.registered_bytes(), 0u);
  // ... but the mapping lives until the lease is released.
  EXPECT_EQ(mapper_.live_mappings(), 1);
  EXPECT_EQ(static_cast<const uint8_t*>((*lease)->region().data())[3], 42);
  lease = absl::CancelledError("released");
  EXPECT_EQ(mapper_.live_mappings(), 0);
  // The name can be registered again.
  EXPECT_OK(registry_.Register("s1", "acts", Shm("/data", 16)));
}

TEST_F(BufferRegistryTest, OtherSessionsBufferIsPermissionDeniedUnknownIsNotFound) {
  ASSERT_OK(registry_.Register("s1", "acts", Shm("/obj", 8)));
  EXPECT_THAT(registry_.Acquire("s2", "acts"),
              StatusIs(absl::StatusCode::kPermissionDenied, "another session"));
  EXPECT_THAT(registry_.Acquire("s2", "nope"), StatusIs(absl::StatusCode::kNotFound, "'nope'"));
  EXPECT_THAT(registry_.Unregister("s2", "acts"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(registry_.Acquire("s1", "acts"));
  EXPECT_THAT(registry_.Unregister("s1", "nope"), StatusIs(absl::StatusCode::kNotFound, "nope"));
}

TEST_F(BufferRegistryTest, UnregisterAllDropsOnlyThatSession) {
  ASSERT_OK(registry_.Register("s1", "a", Shm("/obj", 10)));
  ASSERT_OK(registry_.Register("s1", "b", Shm("/obj", 20)));
  ASSERT_OK(registry_.Register("s2", "a", Shm("/obj", 40)));
  ASSERT_OK(registry_.Register("s3", "z", Shm("/obj", 80)));
  registry_.UnregisterAll("s1");
  EXPECT_TRUE(registry_.List("s1").empty());
  EXPECT_EQ(registry_.List("s2").size(), 1u);
  EXPECT_EQ(registry_.buffer_count(), 2u);
  EXPECT_EQ(registry_.registered_bytes(), 120u);
  EXPECT_EQ(mapper_.live_mappings(), 2);
  // s1's names no longer exist anywhere; s2's "a" still does.
  EXPECT_THAT(registry_.Acquire("s1", "b"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(registry_.Acquire("s1", "a"), StatusIs(absl::StatusCode::kPermissionDenied));
  // A full session can register again after UnregisterAll.
  for (const char* name : {"a", "b", "c"})
    EXPECT_OK(registry_.Register("s1", name, Shm("/obj", 1)));
  registry_.UnregisterAll("nobody");
  EXPECT_EQ(registry_.buffer_count(), 5u);
}

TEST_F(BufferRegistryTest, ListIsSortedByNameAndPerSession) {
  ASSERT_OK(registry_.Register("s1", "c", Shm("/obj", 3)));
  ASSERT_OK(registry_.Register("s1", "a", Shm("/obj", 1)));
  ASSERT_OK(registry_.Register("s0", "b0", Shm("/obj", 9)));
  ASSERT_OK(registry_.Register("s1", "b", Shm("/obj", 2)));
  ASSERT_OK(registry_.Register("s2", "a", Shm("/obj", 9)));
  EXPECT_THAT(registry_.List("s1"),
              ElementsAre(Field(&BufferInfo::name, "a"), Field(&BufferInfo::name, "b"),
                          Field(&BufferInfo::name, "c")));
  EXPECT_TRUE(registry_.List("s9").empty());
}

TEST_F(BufferRegistryTest, ConcurrentRegisterOfOneNameHasOneWinnerAndDropsTheLoser) {
  // Both calls pass the early check, then meet inside Map(): a real race.
  absl::Barrier* barrier = new absl::Barrier(2);  // deleted by the last Block()
  mapper_.set_map_hook([barrier] {
    if (barrier->Block()) delete barrier;
  });
  absl::Status results[2];
  std::thread t0([&] { results[0] = registry_.Register("s1", "x", Shm("/obj", 8)).status(); });
  std::thread t1([&] { results[1] = registry_.Register("s1", "x", Shm("/obj", 8)).status(); });
  t0.join();
  t1.join();
  EXPECT_EQ(mapper_.map_calls(), 2);
  EXPECT_EQ(results[0].ok() + results[1].ok(), 1);
  const absl::Status& loser = results[0].ok() ? results[1] : results[0];
  EXPECT_THAT(loser, StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(mapper_.live_mappings(), 1);
  EXPECT_EQ(registry_.buffer_count(), 1u);
}

TEST(BufferRegistryMetricsTest, GaugesFollowRegistrations) {
  FakeRegionMapper mapper;
  mapper.AddObject("/obj", 100);
  ServiceMetrics metrics("test", "cpu");
  BufferRegistry registry(&mapper, nullptr, Limits(8), &metrics);
  ASSERT_OK(registry.Register("s1", "a", mapper.Spec("/obj", 0, 30)));
  ASSERT_OK(registry.Register("s2", "b", mapper.Spec("/obj", 0, 50)));
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_registered_buffers"), 2);
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_registered_bytes"), 80);
  ASSERT_OK(registry.Unregister("s1", "a"));
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_registered_bytes"), 50);
  registry.UnregisterAll("s2");
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_registered_buffers"), 0);
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_registered_bytes"), 0);
}

TEST(BufferRegistryLimitsTest, ServerWideLimitSpansSessions) {
  FakeRegionMapper mapper;
  mapper.AddObject("/obj", 100);
  BufferRegistry registry(&mapper, nullptr, Limits(/*per_session=*/10, /*total=*/3), nullptr);
  ASSERT_OK(registry.Register("s1", "a", mapper.Spec("/obj", 0, 8)));
  ASSERT_OK(registry.Register("s2", "a", mapper.Spec("/obj", 0, 8)));
  ASSERT_OK(registry.Register("s3", "a", mapper.Spec("/obj", 0, 8)));
  // A fourth session is refused although it has none: the server holds 3.
  EXPECT_THAT(registry.Register("s4", "a", mapper.Spec("/obj", 0, 8)),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_buffers) is 3"));
  EXPECT_EQ(mapper.live_mappings(), 3);  // refused before mapping
  ASSERT_OK(registry.Unregister("s2", "a"));
  EXPECT_OK(registry.Register("s4", "a", mapper.Spec("/obj", 0, 8)));
}

TEST(BufferRegistryLimitsTest, UnregisterIfCurrentLeavesAReplacementAlone) {
  FakeRegionMapper mapper;
  mapper.AddObject("/obj", 100);
  BufferRegistry registry(&mapper, nullptr, Limits(8), nullptr);
  ASSERT_OK(registry.Register("s1", "a", mapper.Spec("/obj", 0, 8)));
  absl::StatusOr<BufferLease> old = registry.Acquire("s1", "a");
  ASSERT_OK(old);
  ASSERT_OK(registry.Unregister("s1", "a"));
  ASSERT_OK(registry.Register("s1", "a", mapper.Spec("/obj", 0, 16)));
  EXPECT_FALSE(registry.UnregisterIfCurrent("s1", "a", *old));  // the replacement stays
  EXPECT_EQ(registry.buffer_count(), 1u);
  absl::StatusOr<BufferLease> current = registry.Acquire("s1", "a");
  ASSERT_OK(current);
  EXPECT_TRUE(registry.UnregisterIfCurrent("s1", "a", *current));
  EXPECT_EQ(registry.buffer_count(), 0u);
  EXPECT_FALSE(registry.UnregisterIfCurrent("s1", "a", *current));
}

TEST(BufferRegistryLimitsTest, CudaVmmWithoutAMapperIsFailedPrecondition) {
  FakeRegionMapper mapper;
  mapper.AddObject("/obj", 100);
  BufferRegistry registry(&mapper, nullptr, Limits(8), nullptr);
  FdRegionSpec spec = mapper.Spec("/obj", 0, 8);
  spec.kind = FdKind::kCudaVmm;
  EXPECT_THAT(registry.Register("s1", "v", spec),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuda_vmm"));
  EXPECT_EQ(mapper.map_calls(), 0);
}

}  // namespace
}  // namespace tokensel::core
