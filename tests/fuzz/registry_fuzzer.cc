// libFuzzer target: BufferRegistry operations. The bytes drive a sequence of
// Register / Unregister / Acquire (lease held) / lease release / List /
// UnregisterAll across three sessions, against a model of what the registry
// must hold. After every step:
//  - the status code is exactly the one the contract promises (name
//    validation, FAILED_PRECONDITION for the unmappable kind, ALREADY_EXISTS,
//    RESOURCE_EXHAUSTED at max_buffers, the mapper's NOT_FOUND /
//    OUT_OF_RANGE, NOT_FOUND vs PERMISSION_DENIED on Acquire);
//  - buffer_count(), registered_bytes() and the two registry gauges equal
//    the model's; List() returns exactly the session's own buffers;
//  - deferred unregister: the live mappings are the registered buffers plus
//    the unregistered ones some held lease still references, and a held
//    lease's memory stays readable and writable (ASan would see a use after
//    unmap) until it is released;
//  - when the registry and every lease are gone, no mapping is left.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "server/core/buffer_registry.h"
#include "server/core/service_metrics.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/server/core/metric_reader.h"

namespace tokensel::fuzz {
namespace {

constexpr uint32_t kMaxBuffers = 3;
constexpr size_t kMaxLeases = 8;
constexpr int kMaxSteps = 64;
const char* const kSessions[] = {"s0", "s1", "s2"};
const char* const kObjects[] = {"/o0", "/o1", "/o2", "/missing"};
constexpr uint64_t kObjectSizes[] = {0, 16, 4096};

std::string PickName(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return "";
    case 1:
      return "bad name";
    case 2:
      return std::string(129, 'n');
    case 3:
      return std::string(128, 'n');
    case 4:
      return "a.b:c/d-e_F9";
    default:
      return "n" + std::to_string(fdp.ConsumeIntegralInRange(0, 3));
  }
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.:/-", c) != nullptr;
  });
}

struct Entry {
  uint64_t size = 0;
  uint64_t generation = 0;  // which registration of (session, name)
};

struct HeldLease {
  core::BufferLease lease;
  uint64_t generation = 0;
};

class Run {
 public:
  explicit Run(core::ServiceMetrics* metrics) : metrics_(metrics) {
    core::RegistryLimits limits;
    limits.max_buffers_per_session = kMaxBuffers;
    registry_.emplace(&mapper_, nullptr, limits, metrics);
    for (size_t i = 0; i < std::size(kObjectSizes); ++i) {
      mapper_.AddObject(kObjects[i], kObjectSizes[i]);
    }
  }

  void Step(FuzzedDataProvider& fdp) {
    const std::string session = kSessions[fdp.ConsumeIntegralInRange<size_t>(0, 2)];
    switch (fdp.ConsumeIntegralInRange(0, 7)) {
      case 0:
      case 1:
        Register(fdp, session);
        break;
      case 2:
        Unregister(session, PickName(fdp));
        break;
      case 3:
      case 4:
        Acquire(session, PickName(fdp), fdp.ConsumeBool());
        break;
      case 5:
        if (!leases_.empty()) {
          const size_t i = fdp.ConsumeIntegralInRange<size_t>(0, leases_.size() - 1);
          Touch(leases_[i]);
          leases_.erase(leases_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 6:
        List(session);
        break;
      default:
        registry_->UnregisterAll(session);
        for (auto it = model_.begin(); it != model_.end();) {
          it = it->first.first == session ? model_.erase(it) : std::next(it);
        }
        gauges_set_ = true;
        break;
    }
    CheckInvariants();
  }

  // Releases every lease, then destroys the registry: nothing stays mapped.
  void Finish() {
    for (const HeldLease& held : leases_) Touch(held);
    leases_.clear();
    CheckInvariants();
    registry_.reset();
    FUZZ_CHECK(mapper_.live_mappings() == 0);
  }

 private:
  using Key = std::pair<std::string, std::string>;

  void Register(FuzzedDataProvider& fdp, const std::string& session) {
    const std::string name = PickName(fdp);
    const size_t object = fdp.ConsumeIntegralInRange<size_t>(0, std::size(kObjects) - 1);
    uint64_t offset = fdp.ConsumeIntegralInRange<uint64_t>(0, 20);
    uint64_t size = fdp.ConsumeIntegralInRange<uint64_t>(0, 4100);
    if (fdp.ConsumeIntegralInRange(0, 7) == 0) offset = fdp.ConsumeIntegral<uint64_t>();
    if (fdp.ConsumeIntegralInRange(0, 7) == 0) size = fdp.ConsumeIntegral<uint64_t>();
    const bool cuda = fdp.ConsumeIntegralInRange(0, 15) == 0;
    core::RegionSpec spec = mapper_.Spec(kObjects[object], offset, size);
    if (cuda) spec = core::CudaIpcSpec{std::string(64, 'h'), "GPU-x", offset, size};

    absl::StatusCode expected = absl::StatusCode::kOk;
    const Key key(session, name);
    if (!ValidName(name)) {
      expected = absl::StatusCode::kInvalidArgument;
    } else if (cuda) {
      expected = absl::StatusCode::kFailedPrecondition;  // no cuda_ipc mapper
    } else if (model_.count(key) != 0) {
      expected = absl::StatusCode::kAlreadyExists;
    } else if (SessionCount(session) >= kMaxBuffers) {
      expected = absl::StatusCode::kResourceExhausted;
    } else if (object >= std::size(kObjectSizes)) {
      expected = absl::StatusCode::kNotFound;
    } else if (size > std::numeric_limits<uint64_t>::max() - offset ||
               offset + size > kObjectSizes[object]) {
      expected = absl::StatusCode::kOutOfRange;
    }
    absl::StatusOr<core::BufferInfo> info = registry_->Register(session, name, spec);
    FUZZ_CHECK(info.status().code() == expected);
    if (!info.ok()) return;
    FUZZ_CHECK(info->name == name && info->kind == "host_shm" && info->size == size);
    model_[key] = Entry{size, ++generation_};
    gauges_set_ = true;
  }

  void Unregister(const std::string& session, const std::string& name) {
    const absl::Status status = registry_->Unregister(session, name);
    const bool present = model_.erase(Key(session, name)) != 0;
    FUZZ_CHECK(status.ok() == present);
    if (!present) FUZZ_CHECK(status.code() == absl::StatusCode::kNotFound);
    if (present) gauges_set_ = true;
  }

  void Acquire(const std::string& session, const std::string& name, bool hold) {
    absl::StatusOr<core::BufferLease> lease = registry_->Acquire(session, name);
    auto it = model_.find(Key(session, name));
    if (it == model_.end()) {
      bool elsewhere = false;
      for (const auto& [key, entry] : model_) elsewhere |= key.second == name;
      FUZZ_CHECK(lease.status().code() ==
                 (elsewhere ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound));
      return;
    }
    FUZZ_CHECK(lease.ok() && *lease != nullptr);
    FUZZ_CHECK((*lease)->info().name == name && (*lease)->info().size == it->second.size);
    FUZZ_CHECK((*lease)->region().size() == it->second.size);
    HeldLease held{*std::move(lease), it->second.generation};
    Touch(held);
    if (hold && leases_.size() < kMaxLeases) leases_.push_back(std::move(held));
  }

  void List(const std::string& session) {
    std::vector<core::BufferInfo> listed = registry_->List(session);
    std::map<std::string, uint64_t> got;
    for (const core::BufferInfo& info : listed) got[info.name] = info.size;
    FUZZ_CHECK(got.size() == listed.size());
    std::map<std::string, uint64_t> want;
    for (const auto& [key, entry] : model_) {
      if (key.first == session) want[key.second] = entry.size;
    }
    FUZZ_CHECK(got == want);
  }

  // Writes and reads back every byte of a held lease's region.
  static void Touch(const HeldLease& held) {
    const core::MappedRegion& region = held.lease->region();
    auto* bytes = static_cast<uint8_t*>(region.data());
    for (uint64_t i = 0; i < region.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
    for (uint64_t i = 0; i < region.size(); ++i) FUZZ_CHECK(bytes[i] == static_cast<uint8_t>(i));
  }

  uint32_t SessionCount(const std::string& session) const {
    uint32_t n = 0;
    for (const auto& [key, entry] : model_) n += key.first == session;
    return n;
  }

  void CheckInvariants() const {
    uint64_t bytes = 0;
    std::set<uint64_t> registered;
    for (const auto& [key, entry] : model_) {
      bytes += entry.size;
      registered.insert(entry.generation);
    }
    FUZZ_CHECK(registry_->buffer_count() == model_.size());
    FUZZ_CHECK(registry_->registered_bytes() == bytes);
    if (gauges_set_) {
      FUZZ_CHECK(testing::GaugeValue(*metrics_, "tokensel_registered_buffers") ==
                 static_cast<double>(model_.size()));
      FUZZ_CHECK(testing::GaugeValue(*metrics_, "tokensel_registered_bytes") ==
                 static_cast<double>(bytes));
    }
    // Deferred unregister: unregistered buffers stay mapped while leased.
    std::set<uint64_t> deferred;
    for (const HeldLease& held : leases_) {
      if (registered.count(held.generation) == 0) deferred.insert(held.generation);
    }
    FUZZ_CHECK(mapper_.live_mappings() == static_cast<int>(model_.size() + deferred.size()));
  }

  core::ServiceMetrics* const metrics_;
  testing::FakeRegionMapper mapper_;
  std::optional<core::BufferRegistry> registry_;
  std::map<Key, Entry> model_;
  std::vector<HeldLease> leases_;
  uint64_t generation_ = 0;
  bool gauges_set_ = false;  // the gauges describe this run's registry
};

}  // namespace
}  // namespace tokensel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One metrics registry for the whole run (as the server has one).
  static auto* metrics = new tokensel::core::ServiceMetrics("fuzz", "cpu");
  FuzzedDataProvider fdp(data, size);
  tokensel::fuzz::Run run(metrics);
  for (int step = 0; step < tokensel::fuzz::kMaxSteps && fdp.remaining_bytes() > 0; ++step) {
    run.Step(fdp);
  }
  run.Finish();
  return 0;
}
