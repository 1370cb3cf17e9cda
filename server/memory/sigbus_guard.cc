#include "server/memory/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/errno_string.h"

namespace tokensel::memory {
namespace {

// One registered region. `seq` is a seqlock, odd while the slot is being
// written. The handler skips a slot it cannot read consistently: a slot
// being written is never the one a fault lies in (see the header).
struct Entry {
  std::atomic<uint32_t> seq{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uint32_t> faulted{0};
};

// Set once by Install, read by the handler.
std::atomic<Entry*> g_table{nullptr};
std::atomic<size_t> g_capacity{0};
// 1 + the highest slot index ever handed out: the handler scans no further.
std::atomic<size_t> g_scan_limit{0};
struct sigaction g_previous;

// Guards slot allocation (never taken by the handler).
std::mutex& Mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::vector<int>& FreeSlots() {  // guarded by Mu()
  static std::vector<int>* free_slots = new std::vector<int>;
  return *free_slots;
}

void WriteEntry(Entry& e, uintptr_t begin, uintptr_t end) {
  const uint32_t s = e.seq.load(std::memory_order_relaxed);
  e.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.begin.store(begin, std::memory_order_relaxed);
  e.end.store(end, std::memory_order_relaxed);
  e.faulted.store(0, std::memory_order_relaxed);
  e.seq.store(s + 2, std::memory_order_release);
}

void Handler(int, siginfo_t* info, void*) {
  const int saved_errno = errno;
  // Sent by a process (kill/sigqueue), not raised by a fault: nothing to
  // repair and nothing to retry. Ignored rather than killing the server.
  if (info->si_code <= 0) {
    errno = saved_errno;
    return;
  }
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  Entry* table = g_table.load(std::memory_order_acquire);
  const size_t limit = g_scan_limit.load(std::memory_order_acquire);
  for (size_t i = 0; table != nullptr && i < limit; ++i) {
    Entry& e = table[i];
    const uint32_t s1 = e.seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0) continue;
    const uintptr_t begin = e.begin.load(std::memory_order_relaxed);
    const uintptr_t end = e.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(std::memory_order_relaxed) != s1) continue;
    if (begin == 0 || addr < begin || addr >= end) continue;
    // The owner truncated the object: swap the whole window for zero pages
    // (the retried access then succeeds) and tell the executor.
    // The window is published as integers (lock-free atomics, read in a signal
    // handler); it was a mapping's address to begin with.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    void* p = mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) break;
    e.faulted.store(1, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  // Not a registered region: a real bug. Fault again with the disposition
  // the process had before (by default: terminate with a core dump).
  sigaction(SIGBUS, &g_previous, nullptr);
  errno = saved_errno;
}

}  // namespace

absl::Status SigbusGuard::Install() {
  std::lock_guard<std::mutex> lock(Mu());
  if (g_table.load() != nullptr) return absl::OkStatus();
  auto* table = new Entry[kCapacity];  // lives as long as the process (the handler reads it)
  FreeSlots().reserve(kCapacity);
  for (size_t i = kCapacity; i > 0; --i) FreeSlots().push_back(static_cast<int>(i - 1));
  g_capacity.store(kCapacity, std::memory_order_release);
  g_table.store(table, std::memory_order_release);
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = Handler;
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGBUS, &action, &g_previous) != 0) {
    return absl::InternalError(absl::StrCat("sigaction(SIGBUS): ", ErrnoString(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<SigbusGuard::Slot> SigbusGuard::Register(void* base, size_t length) {
  std::lock_guard<std::mutex> lock(Mu());
  Entry* table = g_table.load();
  if (table == nullptr) {
    return absl::FailedPreconditionError("SIGBUS guard: not installed");
  }
  if (FreeSlots().empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", g_capacity.load(), " guarded host mappings are in use; unregister buffers"));
  }
  const int index = FreeSlots().back();
  FreeSlots().pop_back();
  const auto begin = reinterpret_cast<uintptr_t>(base);
  WriteEntry(table[index], begin, begin + length);
  if (static_cast<size_t>(index) >= g_scan_limit.load(std::memory_order_relaxed)) {
    g_scan_limit.store(static_cast<size_t>(index) + 1, std::memory_order_release);
  }
  return Slot(index);
}

size_t SigbusGuard::registered() {
  std::lock_guard<std::mutex> lock(Mu());
  return g_table.load() == nullptr ? 0 : g_capacity.load() - FreeSlots().size();
}

SigbusGuard::Slot::Slot(Slot&& other) noexcept : index_(other.index_) { other.index_ = -1; }

SigbusGuard::Slot& SigbusGuard::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    this->~Slot();
    index_ = other.index_;
    other.index_ = -1;
  }
  return *this;
}

SigbusGuard::Slot::~Slot() {
  if (index_ < 0) return;
  std::lock_guard<std::mutex> lock(Mu());
  WriteEntry(g_table.load()[index_], 0, 0);
  FreeSlots().push_back(index_);
  index_ = -1;
}

bool SigbusGuard::Slot::faulted() const {
  return index_ >= 0 && g_table.load()[index_].faulted.load(std::memory_order_acquire) != 0;
}

}  // namespace tokensel::memory
