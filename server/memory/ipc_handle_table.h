// IpcHandleTable: the open CUDA IPC memory handles of a CudaIpcMapper
// (cuda_ipc_mapper.h). Device-free: opening and closing go through
// IpcHandleOps, so the table's rules are unit-tested with a fake
// (tests/server/memory/ipc_handle_table_test.cc).
//
//  - Acquire(handle, device, ...): each distinct handle is opened once, on
//    `device` (Ops::Open under the table's lock, so a handle is never
//    opened twice), and referenced by every region over it. Opening first
//    takes room on the device's FreeGate for the eventual close
//    (free_gate.h: RESOURCE_EXHAUSTED naming the limit when the device has
//    too many handles open or waiting to be closed). offset + size beyond
//    the allocation is OUT_OF_RANGE, and a handle opened just for it goes
//    the way of a last Release (below).
//  - Release(handle): drops one reference. With the last one the close
//    (cudaIpcCloseMemHandle, which may synchronize the device) goes through
//    the device's FreeGate AFTER the table's lock is released (a close run
//    at once never stalls other Maps behind the device): run now while the
//    gate is open, else deferred. A handle whose close is deferred stays in
//    the table with no reference ("closing"), and the next Acquire of it
//    reuses it: no second open, and no second deferred close, so register /
//    unregister churn (or failing registrations) of one handle queue at most
//    one close. When the deferred close runs it closes the handle only if it
//    is still unreferenced, else the entry stays (with its room).
//  - A closing entry keeps the table alive (regions and the mapper own it
//    too), so a deferred close never runs on a destroyed table.
// Errors of Acquire: FAILED_PRECONDITION (open on another device),
// OUT_OF_RANGE (beyond the allocation), RESOURCE_EXHAUSTED (the gate's
// room), and Ops::Open's errors as they are.
// Thread-safe.
#ifndef TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_
#define TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/free_gate.h"

namespace tokensel::memory {

class IpcHandleOps {
 public:
  struct Opened {
    void* base = nullptr;
    uint64_t extent = 0;  // bytes usable from `base`
  };
  virtual ~IpcHandleOps() = default;
  // Opens `handle` on `device` and measures what it maps.
  virtual absl::StatusOr<Opened> Open(const std::string& handle, int device,
                                      uint64_t device_memory) = 0;
  // Closes what Open returned; logs its failures. Never throws.
  virtual void Close(void* base, int device) noexcept = 0;
};

class IpcHandleTable : public std::enable_shared_from_this<IpcHandleTable> {
 public:
  using GateFor = std::function<core::FreeGate&(int device)>;

  // `ops` outlives the table and every deferred close (the real ops are
  // never destroyed). `gate_for` (default: FreeGate::ForDevice) returns
  // gates that outlive them too.
  static std::shared_ptr<IpcHandleTable> Create(IpcHandleOps* ops, GateFor gate_for = nullptr);
  IpcHandleTable(const IpcHandleTable&) = delete;
  IpcHandleTable& operator=(const IpcHandleTable&) = delete;

  // A reference to `handle` opened on `device` (`uuid` names it in
  // messages); returns base + offset. See above.
  absl::StatusOr<void*> Acquire(const std::string& handle, int device, const std::string& uuid,
                                uint64_t device_memory, uint64_t offset, uint64_t size);
  // Drops a reference Acquire gave. Never throws.
  void Release(const std::string& handle) noexcept;

  // Handles in the table (open, or closing); of which closing.
  size_t open_count() const;
  size_t closing_count() const;

 private:
  struct Entry {
    IpcHandleTable* table = nullptr;
    std::string handle;
    void* base = nullptr;
    int device = 0;
    uint64_t extent = 0;
    core::FreeGate* gate = nullptr;  // holds one room for the close
    uint32_t refs = 0;
    bool close_queued = false;             // handed to the gate, not run yet
    std::shared_ptr<IpcHandleTable> keep;  // while close_queued
  };
  using Table = std::map<std::string, Entry>;  // key: the 64 handle bytes

  IpcHandleTable(IpcHandleOps* ops, GateFor gate_for);
  // Marks `e` (no reference left) closing; returns the close to hand to
  // its gate after the lock is released, or run == null (queued already).
  core::FreeGate::Deferred QueueCloseLocked(Entry& e);
  // A FreeGate::Deferred function: the close of the Entry at `e`.
  static bool CloseLater(void* e, intptr_t unused);

  IpcHandleOps* const ops_;
  const GateFor gate_for_;
  mutable std::mutex mu_;
  Table opened_;  // guarded by mu_
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_
