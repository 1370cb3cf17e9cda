// FakeCudaVmmDriver: a CudaVmmDriver with no GPU for the mapper tests. It
// counts every acquire and release (handles, reservations, mappings),
// refuses what the real driver refuses (a map past the allocation, not
// whole granules or not granule-aligned in its reservation, overlapping
// maps, set-access over a range not mapped throughout, freeing a range with
// a mapping inside, releasing twice), and can fail the n-th call of any
// step. Fake allocations are keyed by the descriptor's number. Thread-safe
// for the driver calls and its helpers (one lock).
// AwaitVmmTeardowns: the mapper's teardowns run on the FreeGates' drainers,
// never on the thread that drops a region: tests wait for them before they
// look at the driver (or let it go).
#ifndef TOKENSEL_TESTS_SERVER_MEMORY_FAKE_CUDA_VMM_DRIVER_H_
#define TOKENSEL_TESTS_SERVER_MEMORY_FAKE_CUDA_VMM_DRIVER_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "server/core/free_gate.h"
#include "server/memory/cuda_vmm_driver.h"
#include "server/memory/cuda_vmm_mapper.h"

namespace tokensel::memory {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGranularity = 2 * kMiB;
inline constexpr uint64_t kMinGranule = 4096;  // what Reserve takes (the smallest granule)
inline constexpr char kGpu0[] = "GPU-00000000-0000-0000-0000-00000000000a";
inline constexpr char kGpu1[] = "GPU-00000000-0000-0000-0000-00000000000b";
inline constexpr char kGpu2[] = "GPU-00000000-0000-0000-0000-00000000000c";  // not the backend's

// Waits (at most 10 s each) until devices 0 and 1 have no teardown queued
// or running (server/core/free_gate.h).
inline void AwaitVmmTeardowns() {
  for (int d : {0, 1}) (void)core::FreeGate::ForDevice(d).AwaitDrained(absl::Seconds(10));
}

// Mapper options for the fake: serves kGpu0 and kGpu1, takes /dev/null's
// major as NVIDIA's (the fake's descriptors are /dev/null), mapped bytes
// capped at `cap` per device.
inline CudaVmmMapperOptions FakeMapperOptions(uint64_t cap = UINT64_MAX) {
  CudaVmmMapperOptions options;
  options.device_uuids = {kGpu0, kGpu1};
  struct stat st {};
  if (stat("/dev/null", &st) == 0) options.nvidia_major = major(st.st_rdev);
  options.max_mapped_bytes_per_device = cap;
  return options;
}

class FakeCudaVmmDriver final : public CudaVmmDriver {
 public:
  struct Allocation {
    uint64_t size = 0;
    VmmLocation location;
    uint64_t granularity = 0;  // its own granule; 0: the driver's `granularity`
  };
  enum Step { kNone, kImport, kLocation, kGetGranularity, kReserve, kMap, kSetAccess };

  absl::Status Available() override { return available; }
  absl::StatusOr<std::vector<VmmDevice>> Devices() override {
    return std::vector<VmmDevice>{
        {0, kGpu0, 16 * 1024 * kMiB}, {1, kGpu1, 16 * 1024 * kMiB}, {2, kGpu2, 16 * 1024 * kMiB}};
  }
  Result Import(int device, int fd, Handle* handle) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("import");
    if (Fail(kImport)) return fail_result;
    auto it = allocations.find(fd);
    if (it == allocations.end()) return kInvalidValue;
    *handle = next_handle++;
    handles[*handle] = it->second;
    handle_device[*handle] = device;
    return kSuccess;
  }
  Result Location(int, Handle handle, VmmLocation* location) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("location");
    if (Fail(kLocation)) return fail_result;
    if (handles.count(handle) == 0) return kInvalidHandle;
    *location = handles[handle].location;
    return kSuccess;
  }
  Result Granularity(int, Handle handle, uint64_t* bytes) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("granularity");
    if (Fail(kGetGranularity)) return fail_result;
    auto h = handles.find(handle);  // from the allocation's own properties
    if (h == handles.end()) return kInvalidHandle;
    *bytes = Granule(h->second);
    return kSuccess;
  }
  uint64_t Granule(const Allocation& a) const {
    return a.granularity != 0 ? a.granularity : granularity;
  }
  Result Reserve(int, uint64_t size, uint64_t alignment, uint64_t* va) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("reserve");
    if (Fail(kReserve)) return fail_result;
    if (size == 0 || size % kMinGranule != 0 || alignment % kMinGranule != 0) return kInvalidValue;
    *va = next_va;
    next_va += size + granularity;  // a gap, so ranges never touch
    reserved[*va] = size;
    return kSuccess;
  }
  Result Map(int device, uint64_t va, uint64_t size, Handle handle) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("map");
    if (Fail(kMap)) return fail_result;
    auto r = Reservation(va, size);
    auto h = handles.find(handle);
    if (r == reserved.end() || h == handles.end()) return kInvalidValue;
    // The driver's rules: whole granules at a granule-aligned place of the
    // reservation, inside the allocation, offset 0, no overlap.
    if (size % Granule(h->second) != 0 || size > h->second.size) return kInvalidValue;
    if ((va - r->first) % Granule(h->second) != 0) return kInvalidValue;
    // Some drivers refuse a partial map of an imported allocation.
    if (refuse_partial && size != h->second.size) return kInvalidValue;
    for (const auto& [at, m] : mapped) {
      if (at < va + size && va < at + m.first) return kInvalidValue;
    }
    mapped[va] = {size, device};
    mapped_handle[va] = handle;
    return kSuccess;
  }
  Result SetAccess(int device, uint64_t va, uint64_t size) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("access");
    if (Fail(kSetAccess)) return fail_result;
    // The range must be mapped throughout (by one or more mappings).
    for (uint64_t at = va; at < va + size;) {
      auto m = mapped.find(at);
      if (m == mapped.end() || at + m->second.first > va + size) return kInvalidValue;
      at += m->second.first;
    }
    access_device[va] = device;
    access_ranges.emplace_back(va, size);
    return kSuccess;
  }
  Result Unmap(int, uint64_t va, uint64_t size) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("unmap");
    auto m = mapped.find(va);
    if (m == mapped.end() || m->second.first != size) return ++bad_calls, kInvalidValue;
    mapped.erase(m);
    mapped_handle.erase(va);
    access_device.erase(va);
    unmapped.push_back(va);
    return kSuccess;
  }
  Result Free(int, uint64_t va, uint64_t size) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("free");
    auto r = reserved.find(va);
    if (r == reserved.end() || r->second != size) return ++bad_calls, kInvalidValue;
    for (const auto& [at, m] : mapped) {  // still mapped inside
      if (at >= va && at < va + size) return ++bad_calls, kInvalidValue;
    }
    reserved.erase(r);
    return kSuccess;
  }
  Result Release(int, Handle handle) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    calls.push_back("release");
    if (handles.erase(handle) == 0) return ++bad_calls, kInvalidHandle;
    released.push_back(handle);
    return kSuccess;
  }
  std::string ErrorName(Result r) override { return absl::StrCat("FAKE_ERROR_", r); }

  // Fails every call of step fail_at, or with FailAt(step, skip) only the
  // (skip + 1)-th since.
  bool Fail(Step step) {
    if (fail_at != step) return false;
    return fail_skip < 0 || seen[step]++ == fail_skip;
  }
  void FailAt(Step step, int skip = 0, Result result = 999) {
    fail_at = step;
    fail_skip = skip;
    fail_result = result;
    seen.clear();
  }
  // The reservation holding [va, va + size), or reserved.end().
  std::map<uint64_t, uint64_t>::iterator Reservation(uint64_t va, uint64_t size) {
    for (auto r = reserved.begin(); r != reserved.end(); ++r) {
      if (va >= r->first && size <= r->second && va - r->first <= r->second - size) return r;
    }
    return reserved.end();
  }
  int Count(const std::string& call) const {
    std::lock_guard<std::recursive_mutex> lock(mu);
    return static_cast<int>(std::count(calls.begin(), calls.end(), call));
  }
  // Nothing acquired is still held.
  bool Clean() const {
    std::lock_guard<std::recursive_mutex> lock(mu);
    return handles.empty() && reserved.empty() && mapped.empty();
  }

  absl::Status available;
  uint64_t granularity = kGranularity;
  bool refuse_partial = false;
  std::map<int, Allocation> allocations;  // by descriptor number
  // A "VMM descriptor" (/dev/null, which the tests tell the mapper is
  // NVIDIA's) standing for an allocation of `size` bytes on device
  // `ordinal` (< 0: host memory).
  std::shared_ptr<const UniqueFd> AddAllocation(uint64_t size, int ordinal) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    const int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    Allocation a;
    a.size = size;
    a.location.on_device = ordinal >= 0;
    a.location.type = ordinal >= 0 ? 1 : 2;
    a.location.ordinal = ordinal;
    if (fd >= 0) allocations[fd] = a;
    return std::make_shared<const UniqueFd>(fd);
  }
  Step fail_at = kNone;
  int fail_skip = -1;  // < 0: every call
  std::map<Step, int> seen;
  Result fail_result = 999;
  Handle next_handle = 100;
  uint64_t next_va = uint64_t{1} << 40;
  std::map<Handle, Allocation> handles;  // live imported handles
  std::map<Handle, int> handle_device;
  std::map<uint64_t, uint64_t> reserved;                // va -> size
  std::map<uint64_t, std::pair<uint64_t, int>> mapped;  // va -> (size, device)
  std::map<uint64_t, int> access_device;
  std::map<uint64_t, Handle> mapped_handle;                  // va -> handle
  std::vector<std::pair<uint64_t, uint64_t>> access_ranges;  // SetAccess calls
  std::vector<uint64_t> unmapped;                            // in Unmap order
  std::vector<Handle> released;                              // in Release order
  std::vector<std::string> calls;
  int bad_calls = 0;
  // The driver calls: teardowns run on the gates' drainers while a test
  // thread maps (the real driver is thread-safe). Tests read the fields
  // above directly only once AwaitVmmTeardowns returned.
  mutable std::recursive_mutex mu;
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_TESTS_SERVER_MEMORY_FAKE_CUDA_VMM_DRIVER_H_
