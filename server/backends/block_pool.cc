// BlockPool (contract: block_pool.h).
#include "server/backends/block_pool.h"

#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tokensel::backends {

BlockPool::BlockPool(std::string name, size_t granule, size_t max_cached_bytes, AllocateFn allocate,
                     FreeFn free, FreeGate* gate)
    : name_(std::move(name)),
      granule_(granule == 0 ? 1 : granule),
      max_cached_bytes_(max_cached_bytes),
      allocate_(std::move(allocate)),
      free_(std::move(free)),
      gate_(gate) {}

BlockPool::~BlockPool() {
  absl::MutexLock lock(&mu_);
  for (const auto& [bytes, data] : idle_) free_(data);
  idle_.clear();
}

size_t BlockPool::AllocationBytes(size_t bytes) const {
  if (bytes == 0) return granule_;
  if (bytes > SIZE_MAX - (granule_ - 1)) return SIZE_MAX;
  return (bytes + granule_ - 1) / granule_ * granule_;
}

absl::StatusOr<BlockPool::Block> BlockPool::Acquire(size_t bytes) {
  const size_t rounded = AllocationBytes(bytes);
  if (rounded == SIZE_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat(name_, " of ", bytes, " bytes"));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.lower_bound(rounded);
    if (it != idle_.end() && it->first / 2 <= rounded) {
      Block block{it->second, it->first};
      idle_bytes_ -= it->first;
      idle_.erase(it);
      ++in_use_;
      return block;
    }
  }
  absl::StatusOr<void*> data = allocate_(rounded);
  if (!data.ok()) return data.status();
  absl::MutexLock lock(&mu_);
  ++allocations_;
  ++in_use_;
  return Block{*data, rounded};
}

void BlockPool::Release(Block block) {
  if (block.data == nullptr) return;
  std::vector<void*> to_free;
  // Trimming only while the gate is open, and the gate held until the
  // frees are done (FreeGate).
  const bool may_free = gate_ == nullptr || gate_->BeginFree();
  struct GateHold {  // released on every path (a std::bad_alloc included)
    FreeGate* gate;
    ~GateHold() {
      if (gate != nullptr) gate->EndFree();
    }
  } const hold{gate_ != nullptr && may_free ? gate_ : nullptr};
  {
    absl::MutexLock lock(&mu_);
    --in_use_;
    const auto released = idle_.emplace(block.bytes, block.data);
    idle_bytes_ += block.bytes;
    // Idle memory stays bounded: without this, requests of ever larger sizes
    // (each within the budget) would each add a block the pool then kept for
    // good, until the device (or the host's pinned memory) ran out. The
    // largest go first. With hysteresis: once over the cap, down to half of
    // it. Trimming just under the cap freed one block per release while a
    // steady load hovered there (typically the large block that load uses,
    // while smaller stale ones stayed), and the next wave allocated it again:
    // a cudaFree/cudaFreeHost (each synchronizes the whole device) plus an
    // allocation on every reply's path. Freeing down to half leaves room for
    // the load to settle without trimming again. The block just released
    // goes last (only if it alone still exceeds the cap): it is the one the
    // current load uses, while the others sat idle longer; freeing it first
    // would leave a load block between half the cap and the cap to be
    // freed and allocated again on every wave.
    const size_t low_water = max_cached_bytes_ / 2;
    if (may_free && idle_bytes_ > max_cached_bytes_) {
      auto it = idle_.end();
      while (idle_bytes_ > low_water && it != idle_.begin()) {
        --it;
        if (it == released) continue;
        idle_bytes_ -= it->first;
        to_free.push_back(it->second);
        it = idle_.erase(it);
        ++frees_;
      }
      if (idle_bytes_ > max_cached_bytes_) {  // the released block alone
        idle_bytes_ -= released->first;
        to_free.push_back(released->second);
        idle_.erase(released);
        ++frees_;
      }
    }
  }
  for (void* data : to_free) free_(data);
}

int64_t BlockPool::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}
int64_t BlockPool::frees() const {
  absl::MutexLock lock(&mu_);
  return frees_;
}
size_t BlockPool::cached_blocks() const {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}
size_t BlockPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}
size_t BlockPool::blocks_in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

}  // namespace tokensel::backends
