// SigbusGuard: keeps a client's truncation of its shared-memory object from
// killing the server.
//
// A MAP_SHARED mapping of a file faults with SIGBUS on every page past the
// file's end, and an unsealed object's owner may ftruncate it smaller at any
// time; by default that kills the whole server, for every client. Host
// regions are therefore registered here for as long as they are mapped. On a
// SIGBUS whose address lies in a registered region, the handler replaces the
// region's whole mapping with private zero pages (mmap MAP_FIXED |
// MAP_ANONYMOUS over it), marks the region faulted and returns: the faulting
// access is retried and succeeds on the zero pages, the op finishes on
// garbage, and the executor, seeing faulted(), fails the op and unregisters
// the buffer (the Wayland compositors' answer to the same problem with
// wl_shm pools). A SIGBUS anywhere else is a real bug: the handler restores
// the previous disposition and returns, so the access faults again and the
// process dies as it would have.
//
// The handler only reads the slot table (a seqlock per slot, no locks, no
// allocation) and calls mmap, a plain system call on Linux. A slot is
// released before its mapping is unmapped, so the handler never maps over
// memory that has been given back; a region whose lease is held (an op uses
// it) cannot be released, so the region a fault lies in is always found.
//
// Thread-safe. Install() once per process, before the first Register().
#ifndef TOKENSEL_SERVER_MEMORY_SIGBUS_GUARD_H_
#define TOKENSEL_SERVER_MEMORY_SIGBUS_GUARD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tokensel::memory {

class SigbusGuard {
 public:
  // A registered region. Release()d by its destructor.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();

    // Whether a fault in the region was absorbed since it was registered.
    bool faulted() const;
    bool valid() const { return index_ >= 0; }

   private:
    friend class SigbusGuard;
    explicit Slot(int index) : index_(index) {}
    int index_ = -1;
  };

  // Regions that can be registered at once: more than the kernel lets one
  // process map by default (vm.max_map_count 65530). 2 MiB of table.
  static constexpr size_t kCapacity = size_t{1} << 16;

  // Installs the SIGBUS handler; idempotent. INTERNAL if sigaction fails.
  static absl::Status Install();

  // Registers the mapping [base, base + length) (page-aligned, as mmap
  // returned it). RESOURCE_EXHAUSTED when every slot is taken;
  // FAILED_PRECONDITION before Install().
  static absl::StatusOr<Slot> Register(void* base, size_t length);

  // For tests: regions registered now.
  static size_t registered();
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_SIGBUS_GUARD_H_
