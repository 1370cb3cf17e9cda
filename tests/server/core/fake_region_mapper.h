// FakeRegionMapper: a RegionMapper over heap "objects" keyed by name (the
// HostShmSpec shm_name, or the CudaIpcSpec handle), for registry and executor
// tests. Counts live mappings, so tests can see exactly when a region is
// unmapped, and can run a hook inside Map() to stage races.
#ifndef TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_
#define TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/core/region.h"

namespace tokensel::testing {

class FakeRegionMapper : public core::RegionMapper {
 public:
  explicit FakeRegionMapper(core::MemoryKind kind = core::MemoryKind::kHost) : kind_(kind) {}

  // Creates (or replaces) object `name` of `size` zero bytes; returns its memory.
  uint8_t* AddObject(const std::string& name, uint64_t size) {
    auto object = std::make_shared<std::vector<uint8_t>>(size);
    absl::MutexLock lock(&mu_);
    objects_[name] = object;
    return object->data();
  }
  // Runs inside every Map() call, after the spec was accepted.
  void set_map_hook(std::function<void()> hook) {
    absl::MutexLock lock(&mu_);
    hook_ = std::move(hook);
  }

  int live_mappings() const { return live_->load(); }
  int map_calls() const { return map_calls_.load(); }

  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override {
    ++map_calls_;
    std::string name;
    uint64_t offset = 0;
    uint64_t size = 0;
    if (const auto* shm = std::get_if<core::HostShmSpec>(&spec)) {
      name = shm->shm_name;
      offset = shm->offset;
      size = shm->size;
    } else {
      const auto& ipc = std::get<core::CudaIpcSpec>(spec);
      name = ipc.handle;
      offset = ipc.offset;
      size = ipc.size;
    }
    std::shared_ptr<std::vector<uint8_t>> object;
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      auto it = objects_.find(name);
      if (it == objects_.end()) {
        return absl::NotFoundError(absl::StrCat("no object '", name, "'"));
      }
      object = it->second;
      hook = hook_;
    }
    if (size > std::numeric_limits<uint64_t>::max() - offset || offset + size > object->size()) {
      return absl::OutOfRangeError(absl::StrCat("offset ", offset, " + size ", size,
                                                " exceeds object size ", object->size()));
    }
    if (hook) hook();
    return std::unique_ptr<core::MappedRegion>(
        new Region(std::move(object), offset, size, kind_, live_));
  }

 private:
  class Region : public core::MappedRegion {
   public:
    Region(std::shared_ptr<std::vector<uint8_t>> object, uint64_t offset, uint64_t size,
           core::MemoryKind kind, std::shared_ptr<std::atomic<int>> live)
        : object_(std::move(object)), offset_(offset), size_(size), kind_(kind), live_(live) {
      ++*live_;
    }
    ~Region() override { --*live_; }
    void* data() const override { return object_->data() + offset_; }
    uint64_t size() const override { return size_; }
    core::MemoryKind memory_kind() const override { return kind_; }
    std::string device_uuid() const override {
      return kind_ == core::MemoryKind::kCudaDevice ? "GPU-fake" : "";
    }

   private:
    std::shared_ptr<std::vector<uint8_t>> object_;
    uint64_t offset_;
    uint64_t size_;
    core::MemoryKind kind_;
    std::shared_ptr<std::atomic<int>> live_;
  };

  const core::MemoryKind kind_;
  std::shared_ptr<std::atomic<int>> live_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> map_calls_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<std::vector<uint8_t>>> objects_ ABSL_GUARDED_BY(mu_);
  std::function<void()> hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_
