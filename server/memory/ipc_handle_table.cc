// IpcHandleTable (contract: ipc_handle_table.h).
#include "server/memory/ipc_handle_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tokensel::memory {

std::shared_ptr<IpcHandleTable> IpcHandleTable::Create(IpcHandleOps* ops, GateFor gate_for) {
  if (gate_for == nullptr) {
    gate_for = [](int device) -> core::FreeGate& { return core::FreeGate::ForDevice(device); };
  }
  return std::shared_ptr<IpcHandleTable>(new IpcHandleTable(ops, std::move(gate_for)));
}

IpcHandleTable::IpcHandleTable(IpcHandleOps* ops, GateFor gate_for)
    : ops_(ops), gate_for_(std::move(gate_for)) {}

core::FreeGate::Deferred IpcHandleTable::QueueCloseLocked(Entry& e) {
  if (e.close_queued) return {};  // one close at a time per handle
  e.close_queued = true;
  e.keep = shared_from_this();  // the table outlives its deferred close
  // The bytes it gives back: the mapping's extent (the review's item 13).
  return core::FreeGate::Deferred{&CloseLater, &e, 0, e.extent};
}

absl::StatusOr<void*> IpcHandleTable::Acquire(const std::string& handle, int device,
                                              const std::string& uuid, uint64_t device_memory,
                                              uint64_t offset, uint64_t size) {
  core::FreeGate::Deferred close;
  core::FreeGate* gate = nullptr;
  uint64_t extent = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opened_.find(handle);
    if (it != opened_.end()) {
      // Open, or closing (its close deferred): reused either way.
      if (it->second.device != device) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cuda_ipc.handle is already open on device ", it->second.device, ", not on ", uuid));
      }
    } else {
      core::FreeGate& device_gate = gate_for_(device);
      if (absl::Status room = device_gate.Reserve("cuda_ipc: opening a handle"); !room.ok()) {
        return room;
      }
      // The entry first (it may throw), then the open.
      Entry fresh;
      fresh.table = this;
      fresh.handle = handle;
      fresh.device = device;
      fresh.gate = &device_gate;
      try {
        it = opened_.emplace(handle, std::move(fresh)).first;
      } catch (...) {
        device_gate.Unreserve();
        throw;
      }
      absl::StatusOr<IpcHandleOps::Opened> opened = ops_->Open(handle, device, device_memory);
      if (!opened.ok()) {
        opened_.erase(it);
        device_gate.Unreserve();
        return opened.status();
      }
      it->second.base = opened->base;
      it->second.extent = opened->extent;
    }
    Entry& e = it->second;
    // No overflow: the caller checked offset + size.
    if (offset + size <= e.extent) {
      ++e.refs;
      return static_cast<char*>(e.base) + offset;
    }
    extent = e.extent;
    // Opened just now for this spec (or closing already): with no
    // reference it goes the way of a last Release.
    if (e.refs == 0) close = QueueCloseLocked(e);
    gate = e.gate;
  }
  if (close.run != nullptr) gate->FreeOrDefer(close);  // outside the lock
  return absl::OutOfRangeError(absl::StrCat("cuda_ipc.offset ", offset, " + cuda_ipc.size ", size,
                                            " = ", offset + size, " exceeds the ", extent,
                                            " bytes of the allocation behind cuda_ipc.handle"));
}

void IpcHandleTable::Release(const std::string& handle) noexcept {
  core::FreeGate::Deferred close;
  core::FreeGate* gate = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opened_.find(handle);
    if (it == opened_.end() || it->second.refs == 0) return;
    if (--it->second.refs > 0) return;
    close = QueueCloseLocked(it->second);
    gate = it->second.gate;
  }
  // Outside the lock: run at once while the gate is open (the close may
  // synchronize the device; other Maps must not wait behind it).
  if (close.run != nullptr) gate->FreeOrDefer(close);
}

bool IpcHandleTable::CloseLater(void* e, intptr_t /*unused*/) {
  auto* entry = static_cast<Entry*>(e);
  IpcHandleTable* const table = entry->table;  // kept alive by entry->keep
  std::shared_ptr<IpcHandleTable> keep;        // released last, after the lock
  void* base = nullptr;
  int device = 0;
  {
    std::lock_guard<std::mutex> lock(table->mu_);
    keep = std::move(entry->keep);
    entry->close_queued = false;
    // Reused while its close waited: stays open, and keeps its room.
    if (entry->refs > 0) return false;
    base = entry->base;
    device = entry->device;
    auto it = table->opened_.find(entry->handle);
    if (it != table->opened_.end()) table->opened_.erase(it);  // `entry` is gone from here
  }
  table->ops_->Close(base, device);
  return true;
}

size_t IpcHandleTable::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opened_.size();
}

size_t IpcHandleTable::closing_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [handle, e] : opened_) n += e.close_queued ? 1 : 0;
  return n;
}

}  // namespace tokensel::memory
