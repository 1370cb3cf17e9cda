// IpcHandleTable: the open CUDA IPC memory handles of a CudaIpcMapper
// (cuda_ipc_mapper.h). Device-free: opening and closing go through
// IpcHandleOps, so the table's rules are unit-tested with a fake
// (tests/server/memory/ipc_handle_table_test.cc).
//
//  - Acquire(handle, device, ...): each distinct handle is opened once, on
//    `device`, and referenced by every region over it; it returns a Ref
//    (move-only) that drops the reference when destroyed, so a throw after
//    Acquire (the region's allocation) cannot leak one. Opening first takes
//    room on the device's FreeGate for the eventual close (free_gate.h:
//    RESOURCE_EXHAUSTED naming the limit when the device has too many
//    handles open or waiting to be closed).
//  - The driver's open runs WITHOUT the table's lock (a first open on a
//    device creates its context: seconds, and no other handle, on any
//    device, may wait behind it). The entry is "opening" meanwhile: a second
//    Acquire of the same handle waits for the first's result and shares it
//    (the reference, or the same error); Acquires of other handles go on. A
//    failed open leaves nothing behind (no entry, no room).
//  - After a successful open the result is judged (CheckOpened, below): the
//    memory must live on `device` and its extent must be known, else the
//    registration is refused and the handle closed through the gate like
//    any refused registration (the same error for Acquires of it until the
//    close ran). offset + size beyond the allocation is OUT_OF_RANGE, and a
//    handle opened just for it goes the way of a last Release (below).
//  - The room on the gate is reserved for the opening registration's peer
//    (Acquire's `owner`, FreeGate::ReserveFor): one peer's handles, live or
//    queued for their close behind its own stuck wait, count in its share
//    of the device's rooms and bytes (a close's bytes: the extent), so
//    they refuse that peer, never the others (review2 of the seventh
//    session, finding 1).
//  - Release (the last Ref gone): the close (cudaIpcCloseMemHandle, which
//    may synchronize the device) goes through the device's FreeGate AFTER
//    the table's lock is released: queued for the gate's drainer thread,
//    which runs it while the gate is open (never on the releasing thread,
//    which may be the completion thread). A handle whose close is pending stays in the table with
//    no reference, and the next Acquire of it reuses it: no second open, and no second pending
//    close. When the pending close runs it closes the handle only if it is still unreferenced.
//  - A close that runs keeps its entry ("closing") until the driver's close
//    returned: an Acquire of that handle meanwhile waits and then opens it
//    afresh, so a close never races a new open of the same handle.
//  - A closing entry keeps the table alive (regions and the mapper own it
//    too), so a deferred close never runs on a destroyed table.
//  - A handle opened on device X and refused there (its memory lives on
//    another device; no reference, its close queued on X's gate) does not
//    hold the handle to X: an Acquire naming another device waits for that
//    close (like a closing entry) and then opens afresh on its device, but
//    never blocks behind a closed gate of X: UNAVAILABLE (retry) when X's
//    gate is closed or the close did not start within kRefusedCloseWait
//    (the seventh review's item 3; why not a second open: the .cc).
//  - Aliased handles (other bytes naming an allocation already open): the
//    CUDA 13 documentation says a second open of an opened handle returns the
//    same pointer with the driver's reference count raised; entries are per
//    byte string, each opened and closed once, so such opens stay balanced.
//    A driver that refuses the second open instead answers an error that
//    Ops::Open maps to INVALID_ARGUMENT naming cuda_ipc.handle (nothing is
//    left behind, as for any failed open).
// Errors of Acquire: FAILED_PRECONDITION (open, not refused, on another
// device; memory on another device), UNAVAILABLE (refused on another device,
// its close not run yet: retry), OUT_OF_RANGE (beyond the allocation), RESOURCE_EXHAUSTED
// (the gate's room), INTERNAL (extent unknown), and Ops::Open's errors as
// they are. Thread-safe.
#ifndef TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_
#define TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_

#include <chrono>
#include <condition_variable>
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
    bool extent_known = false;  // the driver told the allocation's extent
    uint64_t extent = 0;        // bytes usable from `base`
    int device = -1;            // where the memory lives; -1: the query failed
  };
  virtual ~IpcHandleOps() = default;
  // Opens `handle` on `device` (no peer mapping) and asks, in the same
  // device scope, the allocation's extent and the pointer's device. An
  // error means nothing is open.
  virtual absl::StatusOr<Opened> Open(const std::string& handle, int device) = 0;
  // Closes what Open returned; logs its failures. Never throws.
  virtual void Close(void* base, int device) noexcept = 0;
};

// The decision after an open: OK when the memory lives on `device` and its
// extent is known. FAILED_PRECONDITION naming cuda_ipc.device_uuid (`uuid`)
// when it lives on another device (never used as a peer mapping); INTERNAL
// when the driver could not tell its device or extent (fail closed: no
// client offset + size can be bounded, no device checked).
absl::Status CheckOpened(const IpcHandleOps::Opened& opened, int device, const std::string& uuid);

class IpcHandleTable : public std::enable_shared_from_this<IpcHandleTable> {
 public:
  using GateFor = std::function<core::FreeGate&(int device)>;
  // How long an Acquire on one device waits for the close of the handle's
  // refused open on another device to start (its gate open).
  static constexpr std::chrono::milliseconds kRefusedCloseWait{2000};

  // One reference to an open handle; dropped by the destructor.
  class Ref {
   public:
    Ref() = default;
    Ref(Ref&& other) noexcept;
    Ref& operator=(Ref&& other) noexcept;
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref();
    void* data() const { return data_; }  // base + offset

   private:
    friend class IpcHandleTable;
    std::shared_ptr<IpcHandleTable> table_;
    std::string handle_;
    void* data_ = nullptr;
    bool held_ = false;
  };

  // `ops` outlives the table and every deferred close (the real ops are
  // never destroyed). `gate_for` (default: FreeGate::ForDevice) returns
  // gates that outlive them too.
  static std::shared_ptr<IpcHandleTable> Create(IpcHandleOps* ops, GateFor gate_for = nullptr);
  IpcHandleTable(const IpcHandleTable&) = delete;
  IpcHandleTable& operator=(const IpcHandleTable&) = delete;

  // A reference to `handle` opened on `device` (`uuid` names it in
  // messages); its data() is base + offset. See above. `owner`: the
  // registering peer's principal (empty: none); a handle this call opens
  // holds its gate room in that peer's share (FreeGate::ReserveFor) until
  // its close ran, whoever references it later.
  absl::StatusOr<Ref> Acquire(const std::string& handle, int device, const std::string& uuid,
                              uint64_t offset, uint64_t size, const std::string& owner = "");

  // Handles in the table (opening, open, or closing); of which closing
  // (queued or running).
  size_t open_count() const;
  size_t closing_count() const;

 private:
  enum class State : uint8_t { kOpening, kOpen, kClosing, kGone };
  struct Entry {
    IpcHandleTable* table = nullptr;
    std::string handle;
    State state = State::kOpening;
    void* base = nullptr;
    int device = 0;
    uint64_t extent = 0;
    core::FreeGate* gate = nullptr;  // holds one room for the close
    uint64_t owner = 0;              // the room's share (ReserveFor's id; 0: none)
    uint32_t refs = 0;
    absl::Status refused;                  // the open's verdict when not OK
    bool close_queued = false;             // handed to the gate, not run yet
    std::shared_ptr<IpcHandleTable> keep;  // while close_queued
  };
  using Table = std::map<std::string, std::shared_ptr<Entry>>;  // key: the 64 handle bytes

  IpcHandleTable(IpcHandleOps* ops, GateFor gate_for);
  // Opens `handle` (no entry for it); returns with `lock` held and the
  // entry open (or gone, its error returned).
  absl::StatusOr<std::shared_ptr<Entry>> OpenLocked(std::unique_lock<std::mutex>& lock,
                                                    const std::string& handle, int device,
                                                    const std::string& uuid,
                                                    const std::string& owner);
  // `found` (open on another device than `device`, refused, no reference,
  // its close queued): returns OK once its close started or ran (`lock`
  // held again; the caller looks the handle up again), else UNAVAILABLE
  // (X's gate closed, or not started within kRefusedCloseWait).
  absl::Status AwaitRefusedClose(std::unique_lock<std::mutex>& lock,
                                 const std::shared_ptr<Entry>& found, int device,
                                 const std::string& uuid);
  // Marks `e` (no reference left) closing; returns the close to hand to
  // its gate after the lock is released, or run == null (queued already).
  core::FreeGate::Deferred QueueCloseLocked(Entry& e);
  // Drops one reference (Ref's destructor). Never throws.
  void Release(const std::string& handle) noexcept;
  // A FreeGate::Deferred function: the close of the Entry at `e`.
  static bool CloseLater(void* e, intptr_t unused);

  IpcHandleOps* const ops_;
  const GateFor gate_for_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // an entry left kOpening or kClosing
  Table opened_;                     // guarded by mu_
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_IPC_HANDLE_TABLE_H_
