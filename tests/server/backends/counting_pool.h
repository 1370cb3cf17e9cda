// CountingPool: a BlockPool over malloc that counts allocations and frees
// (new blocks are filled with 0xAB, stale bytes as a reused block has) and
// can fail (thread-safe: a pool's opened hook trims on its gate's drainer,
// block_pool.h); LeasePools: the three pools of a StreamLease over it. Used with
// FakeStreamDevice (fake_stream_device.h).
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_COUNTING_POOL_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_COUNTING_POOL_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/block_pool.h"
#include "server/backends/stream_lease.h"

namespace tokensel::testing {

using backends::BlockPool;
using backends::StreamDevice;

// One recorded device call: what, and on which stream.
struct Call {
  std::string what;  // "h2d" "zero" "kernel" "d2h" "sync" "drain" "release"
  StreamDevice::Stream stream;
  bool operator==(const Call& o) const { return what == o.what && stream == o.stream; }
};
inline std::ostream& operator<<(std::ostream& os, const Call& c) {
  return os << c.what << "@" << reinterpret_cast<uintptr_t>(c.stream);
}

// A pool over malloc that counts, and can be told to fail. With `log` set,
// every block it frees is first poisoned (0xAB), kept (not returned to the
// heap) until the pool ends, and a "release" (stream null) is recorded there: with a cap of 0 every
// Release frees, so the log shows whether a block went back before the drain of work still using
// it, and such work would read or write the poison.
struct CountingPool {
  CountingPool(const char* name, size_t granule, size_t cap,
               std::vector<Call>* release_log = nullptr, backends::FreeGate* gate = nullptr)
      : log(release_log),
        pool(
            name, granule, cap,
            [this](size_t bytes) -> absl::StatusOr<void*> {
              if (fail || bytes > (size_t{1} << 30)) {
                return absl::ResourceExhaustedError("injected allocation failure");
              }
              ++mallocs;
              void* p = std::malloc(bytes);
              std::memset(p, 0xAB, bytes);  // stale bytes, as a reused block has
              std::lock_guard<std::mutex> lock(mu);
              sizes[p] = bytes;
              return p;
            },
            [this](void* p) {
              ++frees;
              std::lock_guard<std::mutex> lock(mu);
              if (log != nullptr) {
                log->push_back(Call{"release", nullptr});
                std::memset(p, 0xAB, sizes[p]);
                // Freed for the pool, but the memory is kept until the test
                // ends: work drained after the release (the bug the log
                // shows) then scribbles on poison, not on the heap.
                quarantine.emplace_back(p, &std::free);
              } else {
                std::free(p);
              }
              sizes.erase(p);
            },
            gate) {}
  std::atomic<int> mallocs{0};
  std::atomic<int> frees{0};
  std::atomic<bool> fail{false};
  std::vector<Call>* const log;
  std::mutex mu;  // guards sizes, quarantine and the log's pushes
  std::map<void*, size_t> sizes;
  std::vector<std::unique_ptr<void, decltype(&std::free)>> quarantine;
  BlockPool pool;  // last: destroyed first, while the above still exist
};

// The three pools of a lease over CountingPool: pinned and device staging
// (4 KiB granule, `staging_cap` idle each), workspaces (1 MiB granule,
// `workspace_cap` idle); all logging their frees into `log` when set. The
// pools sit on `gate` (their trims run on its drainer, block_pool.h),
// except the logged ones: those have no gate and free inside Release, so
// the log shows exactly when each block went back relative to the device
// calls (and no drainer writes to the log while the device does).
struct LeasePools {
  LeasePools(size_t staging_cap, size_t workspace_cap, std::vector<Call>* log = nullptr)
      : pinned("pinned", 4096, staging_cap, log, PoolGate(log)),
        staging("staging", 4096, staging_cap, log, PoolGate(log)),
        workspaces("workspaces", 1 << 20, workspace_cap, log, PoolGate(log)) {}
  backends::FreeGate* PoolGate(const std::vector<Call>* log) {
    return log == nullptr ? &gate : nullptr;
  }
  backends::StreamPools pools() {
    return backends::StreamPools{&pinned.pool, &staging.pool, &workspaces.pool, &gate};
  }
  backends::FreeGate gate;  // first: outlives the pools
  size_t InUse() const {
    return pinned.pool.blocks_in_use() + staging.pool.blocks_in_use() +
           workspaces.pool.blocks_in_use();
  }
  CountingPool pinned;
  CountingPool staging;
  CountingPool workspaces;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_COUNTING_POOL_H_
