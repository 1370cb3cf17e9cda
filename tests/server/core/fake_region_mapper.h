// FakeRegionMapper: a RegionMapper over heap "objects" keyed by name, for
// registry and executor tests. Host objects are named by descriptors, as the
// server receives them: Spec(name, offset, size) gives an FdRegionSpec whose
// descriptor is (a copy of) an empty memfd standing for the object, and Map
// finds the object by that memfd's inode; a CudaIpcSpec names its object by
// the handle, and its regions report the spec's device_uuid ("GPU-fake" when
// empty). Counts live mappings, so tests can see exactly when a region
// is unmapped, and can run a hook inside Map() to stage races; fault(name)
// makes the object's regions report faulted() (lost memory).
#ifndef TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_
#define TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "common/unique_fd.h"
#include "server/core/region.h"

namespace tokensel::testing {

class FakeRegionMapper : public core::RegionMapper {
 public:
  explicit FakeRegionMapper(core::MemoryKind kind = core::MemoryKind::kHost) : kind_(kind) {}

  // Creates (or replaces) object `name` of `size` zero bytes; returns its memory.
  uint8_t* AddObject(const std::string& name, uint64_t size) {
    auto object = std::make_shared<Object>();
    object->bytes.resize(size);
    object->identity = UniqueFd(memfd_create(name.c_str(), MFD_CLOEXEC));
    absl::MutexLock lock(&mu_);
    objects_[name] = object;
    return object->bytes.data();
  }

  // A host spec naming object `name` by descriptor (an unknown descriptor if
  // there is no such object: Map answers NOT_FOUND).
  core::FdRegionSpec Spec(const std::string& name, uint64_t offset, uint64_t size) {
    int fd = -1;
    {
      absl::MutexLock lock(&mu_);
      auto it = objects_.find(name);
      if (it != objects_.end()) fd = fcntl(it->second->identity.get(), F_DUPFD_CLOEXEC, 0);
    }
    if (fd < 0) fd = memfd_create("missing", MFD_CLOEXEC);
    return core::FdRegionSpec{std::make_shared<const UniqueFd>(fd), core::FdKind::kHostMemory,
                              offset, size};
  }

  // From now on the object's regions (existing and new) report faulted().
  void Fault(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(name);
    if (it != objects_.end()) it->second->faulted->store(true);
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
    std::string handle;
    std::string device_uuid;
    ino_t inode = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    if (const auto* fd = std::get_if<core::FdRegionSpec>(&spec)) {
      struct stat st;
      if (fd->fd == nullptr || fstat(fd->fd->get(), &st) != 0) {
        return absl::InvalidArgumentError("fd: not a descriptor");
      }
      inode = st.st_ino;
      offset = fd->offset;
      size = fd->size;
    } else {
      const auto& ipc = std::get<core::CudaIpcSpec>(spec);
      handle = ipc.handle;
      device_uuid = ipc.device_uuid;
      offset = ipc.offset;
      size = ipc.size;
    }
    std::shared_ptr<Object> object;
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, candidate] : objects_) {
        struct stat st;
        const bool match = inode != 0
                               ? fstat(candidate->identity.get(), &st) == 0 && st.st_ino == inode
                               : name == handle;
        if (match) object = candidate;
      }
      if (object == nullptr) return absl::NotFoundError("no such object");
      hook = hook_;
    }
    if (size > std::numeric_limits<uint64_t>::max() - offset ||
        offset + size > object->bytes.size()) {
      return absl::OutOfRangeError(absl::StrCat("offset ", offset, " + size ", size,
                                                " exceeds object size ", object->bytes.size()));
    }
    if (hook) hook();
    return std::unique_ptr<core::MappedRegion>(
        new Region(std::move(object), offset, size, kind_, live_, std::move(device_uuid)));
  }

 private:
  struct Object {
    std::vector<uint8_t> bytes;
    UniqueFd identity;  // an empty memfd: its inode names the object
    std::shared_ptr<std::atomic<bool>> faulted = std::make_shared<std::atomic<bool>>(false);
  };

  class Region : public core::MappedRegion {
   public:
    Region(std::shared_ptr<Object> object, uint64_t offset, uint64_t size, core::MemoryKind kind,
           std::shared_ptr<std::atomic<int>> live, std::string device_uuid)
        : object_(std::move(object)),
          offset_(offset),
          size_(size),
          kind_(kind),
          live_(live),
          device_uuid_(std::move(device_uuid)) {
      ++*live_;
    }
    ~Region() override { --*live_; }
    void* data() const override { return object_->bytes.data() + offset_; }
    uint64_t size() const override { return size_; }
    core::MemoryKind memory_kind() const override { return kind_; }
    std::string device_uuid() const override {
      if (kind_ != core::MemoryKind::kCudaDevice) return "";
      return device_uuid_.empty() ? "GPU-fake" : device_uuid_;
    }
    bool faulted() const override { return object_->faulted->load(); }

   private:
    std::shared_ptr<Object> object_;
    uint64_t offset_;
    uint64_t size_;
    core::MemoryKind kind_;
    std::shared_ptr<std::atomic<int>> live_;
    std::string device_uuid_;
  };

  const core::MemoryKind kind_;
  std::shared_ptr<std::atomic<int>> live_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> map_calls_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Object>> objects_ ABSL_GUARDED_BY(mu_);
  std::function<void()> hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_CORE_FAKE_REGION_MAPPER_H_
