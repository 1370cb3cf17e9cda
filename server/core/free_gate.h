// FreeGate: whether memory (and other device resources) of ONE device may be
// freed now.
//
// On CUDA, cudaFree, cudaFreeHost, cudaIpcCloseMemHandle and cuMemUnmap /
// cuMemRelease may synchronize the context they run in (the device's
// primary context: every call sets its device first). While a stream of
// that device waits on a client's IPC event (server/backends/
// stream_chain.h), which the client may never record, such a call can
// block its thread for ever. So a stream Enter()s its device's gate before
// its wait on a client event is queued and Leave()s it once it is back in
// its pool; meanwhile nothing of that device is freed:
//  - BlockPools (server/backends/block_pool.h) do not trim: their idle
//    blocks stay (beyond the cap, charged to the MemoryBudget: block_pool.h);
//  - every other synchronizing free or teardown goes through FreeOrDefer:
//    queued for the gate's drainer, which runs it while the gate is open
//    (holding it, so that no wait is queued while it runs).
// cudaStreamDestroy does not pass the gate: it returns at once with work
// pending (the runtime releases the stream when its work completes).
//
// One gate per device (ForDevice(ordinal): made on first use, never
// destroyed, so a deferred free never runs after its gate is gone): a stuck
// client wait on device k closes k's gate only; device frees on device j go
// on.
//
// Pinned host memory is not per device: with unified addressing (every
// 64-bit platform CUDA supports) cudaHostAlloc memory is portable, mapped
// into every context, and cudaFreeHost may synchronize any of them (the
// runtime documents no bound). So pinned frees pass the HOST gate
// (ForHost()), which every ForDevice gate enters and leaves with itself: it
// is closed while any device gate is closed, and its deferred entries (and
// the pinned pool's trims, block_pool.h) run only when every device's gate
// is open. A stuck wait on one device thus holds every device's pinned
// frees (their pools keep the blocks, charged to the MemoryBudget beyond
// their caps): the price of not guessing what cudaFreeHost synchronizes.
// Tests make their own gates (no host gate above them).
//
// Who runs a free: always the gate's drainer thread (started by the first
// Reserve), woken when an entry is queued or the gate opens (Leave). Never
// the caller of FreeOrDefer, even while the gate is open: that caller may
// be a request thread, a thread holding a mapper's lock, or the completion
// thread (the last ~IpcRegion / ~VmmRegion is dropped by
// CompletionQueue::Release), whose other items must not wait behind a
// close that queues behind the device's kernels. Nor the thread that
// Leaves. A caller that needs its free done before it goes on must say so
// and wait (AwaitDrained); none does. DrainIfOpen drains on the calling
// thread (a backend's shutdown, tests). A free runs only while the gate is
// open (each holding it), so it waits for bounded device work; a wait
// entered meanwhile stops the drain.
//
// Exit: StopAll() (Server's destruction, after the backend and the mappers
// are gone) lets the drainers run what can run within a bound, then stops
// and joins every drainer, so that none is inside a close while cudart
// tears down. A FreeOrDefer after that (or an entry left behind a gate
// that never opened: stuck work leaked at shutdown) is leaked on purpose:
// kept in the gate's list (reachable), counted in leaked(); the OS takes
// the memory back. A later Reserve (a new server in the same process:
// tests) starts the drainer again.
//
// Opened hooks (AddOpenedHook): functions the drainer calls each time the
// gate opens, after the deferred frees, e.g. a BlockPool trimming the idle
// blocks it kept (and charged) while the gate was closed, which would
// otherwise wait for that pool's next Release; and when asked
// (RunOpenedHooksSoon: a pool's Release over its cap, whose trim must not
// run on the releasing thread). Never run by the thread that Leaves; a
// hook checks the gate itself (BeginFree) before it frees.
//
// Bounded by construction: whoever makes a resource whose teardown may be
// deferred first Reserve()s room for its deferral (a mapping opened, a
// staging allocated: paths that may fail), RESOURCE_EXHAUSTED naming
// kMaxPending beyond it; the room is given back once its teardown ran (its
// Deferred returns true) or with Unreserve (the resource went another way).
// Live resources and deferred teardowns are counted together, so churn while
// the gate is closed (register, unregister, register ...) ends in that
// error, never in a dropped entry that leaks for good. The list's capacity
// follows the reservations (grown in Reserve), so FreeOrDefer allocates
// nothing and never throws: it is called on release paths (destructors).
// A FreeOrDefer without room (a caller bug) is dropped (counted, logged),
// never run now, which could block for ever.
// Bytes, too: teardowns queued behind a stuck wait keep memory alive (IPC
// mappings, VMM mappings and staging keep other tenants' allocations
// mapped). Past max_deferred_bytes() of queued teardowns (counted when
// queued: Deferred::bytes; each owner's only up to its share, below)
// Reserve refuses new resources on this gate's
// device with RESOURCE_EXHAUSTED naming the limit and the device.
// Per owner (ReserveFor; the seventh review's item 2b): one tenant whose own
// wait keeps the gate closed could otherwise fill the room and the bytes
// with failing or churned registrations and refuse every other tenant's.
// A resource reserved for an owner (a peer's principal: the VMM mapper's
// registrations, and the IPC handles a peer's registration opened) counts
// in that owner's share too: at most kMaxPendingPerOwner rooms (live and
// queued) and max_deferred_bytes() / kOwnerShareDivisor bytes queued; past
// its share only that owner is refused.
//  - Bytes arrive when a teardown is queued (FreeOrDefer), not when it is
//    reserved: a peer holding several live mappings drops them at once, or
//    drops one mapping larger than the room, and queues more than its
//    share without any check. So the gate's own limit counts each owner's
//    queued bytes only up to its share (review2 of the seventh session,
//    finding 1): counted = unowned + sum over owners of min(bytes_o,
//    share). A peer past its share never makes the others refused; its own
//    check refuses it. deferred_bytes() is still the true total. The bound
//    on what waits is therefore max_deferred_bytes() plus the excess of
//    the owners past their shares (each owner's excess is bounded by what
//    it can have live when it drops it: the per-device mapped-bytes cap of
//    the VMM mapper; IPC handles by the exporters' allocations).
//  - Rooms: a half of kMaxPending, which is SigbusGuard::kCapacity, the
//    largest --max_buffers_total (server.cc asserts it): rooms count LIVE
//    registrations too, and one peer may legitimately hold every buffer
//    the registry allows with nothing stuck (review2's NIT 4: a quarter
//    refused the 32769th live registration of a server configured for
//    65536). One peer at its share still leaves the others kMaxPending / 2
//    rooms, as many as the registry lets all peers hold live.
// The shares bound what ONE peer takes; many colluding principals are the
// registry's and the session quotas' matter.
// Thread-safe.
#ifndef TOKENSEL_SERVER_CORE_FREE_GATE_H_
#define TOKENSEL_SERVER_CORE_FREE_GATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace tokensel::core {

class FreeGate {
 public:
  // A free to run once the gate is open: run(data, arg). It returns true
  // when the resource is gone (its room goes back to the gate), false when
  // its owner keeps it (a closing IPC handle reused meanwhile: the owner
  // defers again later, into the same room). `bytes`: the memory it
  // returns (statistics).
  struct Deferred {
    bool (*run)(void* data, intptr_t arg) = nullptr;
    void* data = nullptr;
    intptr_t arg = 0;
    uint64_t bytes = 0;
    uint64_t owner = 0;  // ReserveFor's id: the owner's share counts it; 0: none
  };
  // Reservations per gate: live resources that may defer plus deferred
  // teardowns. Twice the registry's largest buffer limit (65536 buffers,
  // SigbusGuard::kCapacity), so live registrations alone never reach it.
  static constexpr size_t kMaxPending = size_t{1} << 17;
  // ForDevice keeps one gate per ordinal below this; the others share one.
  static constexpr int kMaxDevices = 64;
  // Default of max_deferred_bytes (per gate, so per device).
  static constexpr uint64_t kDefaultMaxDeferredBytes = uint64_t{8} << 30;
  // Each owner's share (ReserveFor, see above): 1 / kOwnerShareDivisor of
  // max_deferred_bytes, and a half of kMaxPending (>= the registry's
  // largest buffer limit: live registrations count in it).
  static constexpr size_t kOwnerShareDivisor = 4;
  static constexpr size_t kMaxPendingPerOwner = kMaxPending / 2;
  // StopAll's bound for the drainers to run what can run.
  static constexpr absl::Duration kStopBound = absl::Seconds(2);

  FreeGate() = default;
  ~FreeGate();  // stops the drainer; deferred frees not run are dropped
  FreeGate(const FreeGate&) = delete;
  FreeGate& operator=(const FreeGate&) = delete;
  // The gate of device `ordinal` (made on first use, never destroyed; may
  // throw std::bad_alloc when made). Entering it enters ForHost() too.
  static FreeGate& ForDevice(int ordinal);
  // The gate of pinned host memory: closed while any ForDevice gate is.
  static FreeGate& ForHost();
  // Exit (see above): waits at most `bound` while some made gate is open
  // with entries queued or running, then stops and joins every made gate's
  // drainer. Returns how many entries are left (leaked). Gates a test made
  // itself are not touched.
  static size_t StopAll(absl::Duration bound = kStopBound);

  // A stream of the device is about to wait on a client's event.
  void Enter();
  // That stream is back in its pool. If the gate opens, the drainer is
  // woken (nothing runs on this thread).
  void Leave();
  // True (holding the gate until EndFree) when no wait is registered: then
  // the caller may free; a wait is queued only after EndFree.
  bool BeginFree() ABSL_SHARED_TRYLOCK_FUNCTION(true, mu_);
  void EndFree() ABSL_UNLOCK_FUNCTION(mu_);
  bool open() const;

  // Room for one deferred teardown (see above); `what` names the resource
  // in the RESOURCE_EXHAUSTED beyond kMaxPending. Starts the drainer on
  // first use.
  absl::Status Reserve(absl::string_view what);
  // Reserve, counted in `owner`'s share too (a peer's principal, named in
  // the error; see above): RESOURCE_EXHAUSTED naming the owner, its count
  // and the limit once it holds kMaxPendingPerOwner rooms or more than
  // max_deferred_bytes() / kOwnerShareDivisor of queued teardowns, while
  // other owners still reserve. Returns the id that the resource's
  // Deferred::owner and Unreserve name; 0 for an empty owner (then as
  // Reserve). May allocate (the owner's entry).
  absl::StatusOr<uint64_t> ReserveFor(absl::string_view what, absl::string_view owner);
  // Gives back room whose resource went without a FreeOrDefer (`owner`:
  // ReserveFor's id, 0 for Reserve's).
  void Unreserve(uint64_t owner = 0) noexcept;
  // Queues `free` into the caller's reserved room for the drainer, which
  // runs it once the gate is open (see above); never runs it here.
  void FreeOrDefer(Deferred free) noexcept;
  // Runs the deferred frees while the gate is open, on this thread
  // (shutdown); returns how many are left (the gate closed meanwhile, or
  // never opened).
  size_t DrainIfOpen() noexcept;
  // Tests: waits at most `timeout` until no deferred free is waiting or
  // running and, while a drainer runs, no opened hook is due or running;
  // returns how many deferred frees wait.
  size_t AwaitDrained(absl::Duration timeout);

  // Registers `hook` (see above; starts the drainer); the id is for
  // RemoveOpenedHook, which its owner calls before it ends. May throw
  // (std::bad_alloc, std::system_error).
  uint64_t AddOpenedHook(std::function<void()> hook);
  // Unregisters; waits for a call of it in progress. Never on the drainer.
  void RemoveOpenedHook(uint64_t id) noexcept;
  // Asks the drainer to run the opened hooks soon, as if the gate had just
  // opened (a BlockPool over its cap after a Release: the trim runs on the
  // drainer, not on the releasing thread). Never runs anything here;
  // allocates nothing, never throws.
  void RunOpenedHooksSoon() noexcept;

  // Statistics: deferred frees waiting and the bytes they will free; room
  // reserved; frees dropped (no room: a caller bug); deferred frees run.
  size_t deferred() const;
  uint64_t deferred_bytes() const;
  size_t reserved() const;
  int64_t dropped() const;
  int64_t ran_deferred() const;
  // Entries left to the process's exit (after StopAll, see above).
  int64_t leaked() const;
  uint64_t max_deferred_bytes() const;
  void set_max_deferred_bytes(uint64_t bytes);
  // `owner`'s share now: rooms held and bytes queued (0 when it holds none).
  size_t reserved_by(absl::string_view owner) const;
  uint64_t deferred_bytes_by(absl::string_view owner) const;

 private:
  FreeGate(FreeGate* host, std::string name);
  // Stops and joins the drainer (StopAll, the destructor); `leak`: later
  // entries are kept and counted, not run.
  size_t Stop(bool leak);
  // Whether entries are queued or running while the gate is open (StopAll
  // waits for those).
  bool Draining() const;
  size_t Drain(bool drainer) noexcept;
  void DrainLoop();
  // Runs `free`; gives its room back if it says so.
  void Run(const Deferred& free) noexcept;
  bool DrainerHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  void Wake() noexcept;

  // tokensel::Mutex, not absl::Mutex: ThreadSanitizer sees its ordering
  // (common/mutex.h); the gate is shared by the server's threads.
  FreeGate* const host_ = nullptr;        // ForDevice gates: ForHost()
  const std::string name_ = "this gate";  // in messages: "device 3"
  mutable tokensel::Mutex mu_;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
  mutable tokensel::Mutex list_mu_;  // after mu_ (a free runs holding neither)
  std::vector<Deferred> deferred_ ABSL_GUARDED_BY(list_mu_);  // capacity >= reserved_
  uint64_t deferred_bytes_ ABSL_GUARDED_BY(list_mu_) = 0;     // the true total
  // What the byte limit compares (see above): queued bytes of no owner,
  // and the sum over owners of min(bytes queued, their share).
  uint64_t unowned_bytes_ ABSL_GUARDED_BY(list_mu_) = 0;
  uint64_t owned_counted_bytes_ ABSL_GUARDED_BY(list_mu_) = 0;
  size_t reserved_ ABSL_GUARDED_BY(list_mu_) = 0;
  int running_ ABSL_GUARDED_BY(list_mu_) = 0;  // popped, not finished
  int64_t dropped_ ABSL_GUARDED_BY(list_mu_) = 0;
  int64_t ran_ ABSL_GUARDED_BY(list_mu_) = 0;
  int64_t leaked_ ABSL_GUARDED_BY(list_mu_) = 0;
  uint64_t max_deferred_bytes_ ABSL_GUARDED_BY(list_mu_) = kDefaultMaxDeferredBytes;
  bool wake_ ABSL_GUARDED_BY(list_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(list_mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(list_mu_) = false;  // StopAll: leak, don't queue
  std::thread drainer_ ABSL_GUARDED_BY(list_mu_);
  // Opened hooks: held while they run (before mu_ and list_mu_).
  bool opened_ ABSL_GUARDED_BY(list_mu_) = false;  // opened since the hooks last ran
  bool hooks_running_ ABSL_GUARDED_BY(list_mu_) = false;
  // Per-owner shares (ReserveFor), by id and by name; an owner's entry goes
  // when it holds nothing (erasing allocates nothing).
  struct Share {
    std::string owner;
    size_t rooms = 0;
    uint64_t deferred_bytes = 0;
  };
  std::map<uint64_t, Share> shares_ ABSL_GUARDED_BY(list_mu_);
  std::map<std::string, uint64_t, std::less<>> share_ids_ ABSL_GUARDED_BY(list_mu_);
  uint64_t next_share_ ABSL_GUARDED_BY(list_mu_) = 1;
  // Counts `bytes` more (Add) or `rooms` and `bytes` fewer (Drop) for
  // owner `id` (0 or no share: the unowned bytes), keeping the counted
  // bytes; a share holding nothing goes.
  void AddShareBytesLocked(uint64_t id, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  void DropShareLocked(uint64_t id, size_t rooms, uint64_t bytes) noexcept
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  // share.deferred_bytes = bytes, keeping owned_counted_bytes_.
  void SetShareBytesLocked(Share& share, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  uint64_t ByteShareLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  absl::Status CheckRoomLocked(absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  mutable tokensel::Mutex hooks_mu_;
  std::vector<std::pair<uint64_t, std::function<void()>>> hooks_ ABSL_GUARDED_BY(hooks_mu_);
  uint64_t next_hook_ ABSL_GUARDED_BY(hooks_mu_) = 0;
  void RunOpenedHooks() noexcept;
  // Starts the drainer if none runs (may throw std::system_error).
  void StartDrainerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_FREE_GATE_H_
