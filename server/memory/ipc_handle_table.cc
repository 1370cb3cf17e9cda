// IpcHandleTable (contract: ipc_handle_table.h).
#include "server/memory/ipc_handle_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tokensel::memory {

namespace {

// A copy with a representation of its own: an entry's verdict is returned to
// Acquires on other threads and the entry may end on any thread meanwhile;
// no absl::Status representation is shared between them (Debian's abseil is
// not built for ThreadSanitizer, whose view of its reference count is partial).
absl::Status OwnCopy(const absl::Status& status) {
  return status.ok() ? absl::OkStatus() : absl::Status(status.code(), status.message());
}

}  // namespace

absl::Status CheckOpened(const IpcHandleOps::Opened& opened, int device, const std::string& uuid) {
  // The device first: memory of another GPU is refused whatever its extent
  // (the server never uses a peer mapping of a client's memory: the op
  // would run on one GPU over another's memory, and the registration would
  // claim a device the memory is not on).
  if (opened.device < 0) {
    return absl::InternalError(
        "cuda_ipc: cannot tell which device the opened allocation lives on (the driver's "
        "pointer query failed); refused");
  }
  if (opened.device != device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda_ipc.device_uuid is ", uuid, " (device ", device,
        ") but the allocation behind cuda_ipc.handle lives on device ", opened.device));
  }
  if (!opened.extent_known) {
    // Without the allocation's extent no offset + size can be bounded:
    // fail closed (never "trust up to the device memory").
    return absl::InternalError(
        "cuda_ipc: cannot bound the opened allocation (cuMemGetAddressRange failed); refused");
  }
  return absl::OkStatus();
}

IpcHandleTable::Ref::Ref(Ref&& other) noexcept
    : table_(std::move(other.table_)),
      handle_(std::move(other.handle_)),
      data_(other.data_),
      held_(std::exchange(other.held_, false)) {}

IpcHandleTable::Ref& IpcHandleTable::Ref::operator=(Ref&& other) noexcept {
  if (this != &other) {
    Ref old(std::move(*this));  // released at the end of this scope
    table_ = std::move(other.table_);
    handle_ = std::move(other.handle_);
    data_ = other.data_;
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

IpcHandleTable::Ref::~Ref() {
  if (held_) table_->Release(handle_);
}

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
  return core::FreeGate::Deferred{&CloseLater, &e, 0, e.extent, e.owner};
}

absl::StatusOr<std::shared_ptr<IpcHandleTable::Entry>> IpcHandleTable::OpenLocked(
    std::unique_lock<std::mutex>& lock, const std::string& handle, int device,
    const std::string& uuid, const std::string& owner) {
  core::FreeGate& gate = gate_for_(device);
  // In the opener's share (the header): its closes refuse only that peer.
  absl::StatusOr<uint64_t> room = gate.ReserveFor("cuda_ipc: opening a handle", owner);
  if (!room.ok()) return room.status();
  const uint64_t owner_id = *room;
  // The entry first (it may throw), then the open.
  std::shared_ptr<Entry> e;
  try {
    e = std::make_shared<Entry>();
    e->table = this;
    e->handle = handle;
    e->device = device;
    e->gate = &gate;
    e->owner = owner_id;
    opened_.emplace(handle, e);
  } catch (...) {
    gate.Unreserve(owner_id);
    throw;
  }
  // Without the lock: other handles' Maps go on; this handle's wait on
  // `changed_` for the result.
  lock.unlock();
  absl::StatusOr<IpcHandleOps::Opened> opened = absl::InternalError("cuda_ipc: open threw");
  try {
    opened = ops_->Open(handle, device);
  } catch (...) {
    lock.lock();
    e->state = State::kGone;
    e->refused = OwnCopy(opened.status());
    opened_.erase(handle);
    gate.Unreserve(owner_id);
    changed_.notify_all();
    throw;
  }
  absl::Status verdict = opened.ok() ? CheckOpened(*opened, device, uuid) : opened.status();
  lock.lock();
  changed_.notify_all();
  if (!opened.ok()) {  // nothing is open: nothing left behind
    e->state = State::kGone;
    e->refused = OwnCopy(verdict);
    opened_.erase(handle);
    gate.Unreserve(owner_id);
    return verdict;
  }
  e->base = opened->base;
  e->extent = opened->extent_known ? opened->extent : 0;
  e->state = State::kOpen;
  // Open but refused: closed like any refused registration (through the
  // gate, by the caller, with no reference); Acquires of it meanwhile get
  // the same answer.
  e->refused = OwnCopy(verdict);
  return e;
}

absl::Status IpcHandleTable::AwaitRefusedClose(std::unique_lock<std::mutex>& lock,
                                               const std::shared_ptr<Entry>& found, int device,
                                               const std::string& uuid) {
  // `found` was opened on another device by an earlier registration naming
  // that device, and refused (memory of another device, extent or device
  // unknown): no reference, its close queued on that device's gate. The
  // seventh review's item 3: answering "already open on device X" made the
  // handle unusable on its right device until that close ran, which a stuck
  // client wait on device X defers for as long as the wait stays stuck.
  // CUDA documents that handles "may only be opened by one context per
  // device per other process" (and a second open in the SAME context
  // returns the same pointer with a reference count): an open in our
  // device's primary context while X's context still has it open is within
  // that rule, but the table keeps one entry per handle and a concurrent
  // open of one allocation in two contexts is not verified on a device
  // (none here). So the table waits for the refused close, like a closing
  // entry, then opens afresh on `device`, never for ever: the gate's state
  // is asked outside the table's lock (a running free holds the gate and
  // then takes this lock: gate, then table), and a closed gate, or a close
  // that did not start within kRefusedCloseWait (many frees queued ahead of
  // it), is UNAVAILABLE naming the reason and saying retry. The close needs
  // no client action: the answer is transient.
  const int other = found->device;
  core::FreeGate* const gate = found->gate;
  lock.unlock();
  const bool gate_open = gate->open();
  lock.lock();
  const auto retry = [&](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("cuda_ipc.handle was opened on device ", other,
                     " by an earlier registration naming that device and refused (",
                     found->refused.message(), "); it cannot be opened on ", uuid, " (device ",
                     device, ") until that open is closed, and ", why, "; retry the registration"));
  };
  if (found->state != State::kOpen) return absl::OkStatus();  // closing or gone meanwhile
  if (!gate_open) {
    return retry(absl::StrCat("its close waits for device ", other,
                              "'s frees to be allowed (a stream there waits on a client's event)"));
  }
  if (!changed_.wait_for(lock, kRefusedCloseWait, [&] { return found->state != State::kOpen; })) {
    return retry(absl::StrCat("its close did not start within ", kRefusedCloseWait.count(),
                              " ms (frees queued ahead of it on that device)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<IpcHandleTable::Ref> IpcHandleTable::Acquire(const std::string& handle, int device,
                                                            const std::string& uuid,
                                                            uint64_t offset, uint64_t size,
                                                            const std::string& owner) {
  // Everything that may throw before the reference is taken.
  Ref ref;
  ref.table_ = shared_from_this();
  ref.handle_ = handle;
  core::FreeGate::Deferred close;
  core::FreeGate* gate = nullptr;
  absl::Status refused;
  {
    std::unique_lock<std::mutex> lock(mu_);
    std::shared_ptr<Entry> e;
    while (e == nullptr) {
      auto it = opened_.find(handle);
      if (it == opened_.end()) {
        absl::StatusOr<std::shared_ptr<Entry>> fresh =
            OpenLocked(lock, handle, device, uuid, owner);
        if (!fresh.ok()) return fresh.status();
        e = *std::move(fresh);
        break;
      }
      std::shared_ptr<Entry> found = it->second;
      switch (found->state) {
        case State::kOpening:  // the first Map's result is shared
          changed_.wait(lock, [&] { return found->state != State::kOpening; });
          // Another device's open is judged once it has a result (below,
          // looked up again): its failure or refusal must not be answered
          // as "already open" (the seventh review's item 3).
          if (found->device != device) break;
          if (found->state == State::kOpen) {
            e = std::move(found);
          } else if (found->state == State::kGone && !found->refused.ok()) {
            return OwnCopy(found->refused);  // the open failed, or was refused and closed since
          }
          break;               // otherwise (closing, or closed since): looked up again
        case State::kClosing:  // its close runs (the gate held open): then it is opened afresh
          changed_.wait(lock, [&] { return found->state != State::kClosing; });
          break;
        case State::kOpen:
          if (found->device == device) {
            e = std::move(found);
          } else if (found->refused.ok()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "cuda_ipc.handle is already open on device ", found->device, ", not on ", uuid));
          } else if (absl::Status passed = AwaitRefusedClose(lock, found, device, uuid);
                     !passed.ok()) {
            return passed;
          }
          break;            // the refused entry of another device is closing or gone: again
        case State::kGone:  // never in the table
          return absl::InternalError("cuda_ipc: a closed handle is still in the table");
      }
    }
    if (!e->refused.ok()) {
      refused = OwnCopy(e->refused);
    } else if (offset + size <= e->extent) {  // no overflow: the caller checked
      ++e->refs;
      ref.data_ = static_cast<char*>(e->base) + offset;
      ref.held_ = true;
      return ref;
    } else {
      refused = absl::OutOfRangeError(absl::StrCat(
          "cuda_ipc.offset ", offset, " + cuda_ipc.size ", size, " = ", offset + size,
          " exceeds the ", e->extent, " bytes of the allocation behind cuda_ipc.handle"));
    }
    // Opened just now for this spec (or closing already): with no
    // reference it goes the way of a last Release.
    if (e->refs == 0) close = QueueCloseLocked(*e);
    gate = e->gate;
  }
  if (close.run != nullptr) gate->FreeOrDefer(close);  // outside the lock
  return refused;
}

void IpcHandleTable::Release(const std::string& handle) noexcept {
  core::FreeGate::Deferred close;
  core::FreeGate* gate = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opened_.find(handle);
    if (it == opened_.end() || it->second->refs == 0) return;
    if (--it->second->refs > 0) return;
    close = QueueCloseLocked(*it->second);
    gate = it->second->gate;
  }
  // Outside the lock: queued for the gate's drainer (the close may
  // synchronize the device; neither other Maps nor this thread wait for it).
  if (close.run != nullptr) gate->FreeOrDefer(close);
}

bool IpcHandleTable::CloseLater(void* e, intptr_t /*unused*/) {
  auto* entry = static_cast<Entry*>(e);
  IpcHandleTable* const table = entry->table;  // kept alive by entry->keep
  std::shared_ptr<IpcHandleTable> keep;        // released last, after the lock
  std::shared_ptr<Entry> hold;                 // the entry, until it is gone
  {
    std::lock_guard<std::mutex> lock(table->mu_);
    keep = std::move(entry->keep);
    entry->close_queued = false;
    // Reused while its close waited: stays open, and keeps its room.
    if (entry->refs > 0) return false;
    // Stays in the table while the driver closes it: an Acquire of the
    // handle meanwhile waits, then opens afresh (never a new open racing
    // this close of the same allocation).
    entry->state = State::kClosing;
    auto it = table->opened_.find(entry->handle);
    if (it != table->opened_.end() && it->second.get() == entry) hold = it->second;
    table->changed_.notify_all();  // AwaitRefusedClose waits for the close to start
  }
  table->ops_->Close(entry->base, entry->device);  // `hold` (the table's) keeps it
  {
    std::lock_guard<std::mutex> lock(table->mu_);
    entry->state = State::kGone;
    auto it = table->opened_.find(entry->handle);
    if (it != table->opened_.end() && it->second.get() == entry) table->opened_.erase(it);
    table->changed_.notify_all();
  }
  return true;
}

size_t IpcHandleTable::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opened_.size();
}

size_t IpcHandleTable::closing_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [handle, e] : opened_) {
    n += (e->close_queued || e->state == State::kClosing) ? 1 : 0;
  }
  return n;
}

}  // namespace tokensel::memory
