// The fd channel's logic: a caller on the same host hands the server a file
// descriptor for one of its sessions, and gets a single-use ticket that
// RegisterBuffer (RegionSpec FdRegionSpec) redeems. The front end
// (server/grpc) owns the SOCK_SEQPACKET socket, reads the request and the
// SCM_RIGHTS descriptor, identifies the caller with SO_PEERCRED and calls
// Receive; nothing here knows about sockets.
//
// Why descriptors: the server then maps exactly what the caller could open
// itself (a name would be opened with the server's rights).
#ifndef TOKENSEL_SERVER_CORE_FD_CHANNEL_H_
#define TOKENSEL_SERVER_CORE_FD_CHANNEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "server/core/peer.h"

namespace tokensel::core {

// What the descriptor is (FdKind in the proto).
enum class FdKind : uint8_t {
  kHostMemory,  // memfd / POSIX shm object / tmpfs file, mapped MAP_SHARED
  kCudaVmm,     // a CUDA VMM shareable handle (cuMemExportToShareableHandle)
};

struct FdReceipt {
  std::string ticket;        // redeem with RegisterBuffer(fd {ticket, offset, size})
  uint64_t object_size = 0;  // the object's size when received
  bool sealed = false;       // host memory: F_SEAL_SHRINK is set
};

class FdReceiver {
 public:
  virtual ~FdReceiver() = default;
  // Takes ownership of `fd` (closed on every error path). `peer` is the
  // caller as the kernel reports it (Peer::Kind::kUnix). Errors:
  // NOT_FOUND (unknown or expired session), PERMISSION_DENIED (the session
  // belongs to another uid), INVALID_ARGUMENT (a descriptor of the wrong
  // type: not a read-write regular file on tmpfs/hugetlbfs for host memory,
  // not an NVIDIA device descriptor for CUDA VMM), RESOURCE_EXHAUSTED (too
  // many tickets waiting), FAILED_PRECONDITION (a kind this server cannot
  // map: no CUDA, driver or device for CUDA VMM). Thread-safe.
  virtual absl::StatusOr<FdReceipt> Receive(const Peer& peer, const std::string& session_id,
                                            FdKind kind, UniqueFd fd) = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_FD_CHANNEL_H_
