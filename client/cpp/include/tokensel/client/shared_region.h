// SharedRegion: shared memory mapped into this process, to register with a
// tokensel server (which maps the same pages: zero-copy, in place).
//
//   ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::CreateSealed("acts", 1 << 20));
//   std::memcpy(region.data(), ...);                       // the server sees it
//   session->RegisterBuffer(region.RegisterRequest("acts"));
//
// CreateSealed() makes an anonymous memfd (the recommended kind): its size is
// sealed (F_SEAL_SHRINK | F_SEAL_GROW), so it cannot be truncated under the
// server, and nobody else can open it. Create() makes a named POSIX shm
// object (O_CREAT|O_EXCL, mode 0600) that other processes of this uid can
// Open(); by default it is unlinked on destruction. Open() maps an existing
// object whole and never unlinks it. Both allocate their pages up front
// (fallocate), so the memory is charged to this process, not to the server.
// Every region keeps its descriptor open: RegisterRequest() names it (a
// "fd:<n>" ticket, fd_channel.h), and Client::RegisterBuffer hands it to the
// server over the fd channel, also again when a Session re-opens.
// Move-only; the mapping and the descriptor live until destruction.
#ifndef TOKENSEL_CLIENT_SHARED_REGION_H_
#define TOKENSEL_CLIENT_SHARED_REGION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::client {

namespace v1 = ::tokensel::v1;

struct SharedRegionOptions {
  // The name must start with this (the server's shm_prefix); empty = any.
  std::string required_prefix;
  // Create() only: shm_unlink when destroyed.
  bool unlink_on_destroy = true;
};

class SharedRegion {
 public:
  // `name` is "/..." with no further '/', at most 255 chars, starting with
  // options.required_prefix; size > 0. Errors: INVALID_ARGUMENT (name, size),
  // ALREADY_EXISTS (the object exists), PERMISSION_DENIED, INTERNAL (other
  // errno), each naming the call and the object.
  static absl::StatusOr<SharedRegion> Create(std::string name, uint64_t size,
                                             SharedRegionOptions options = {});
  // An anonymous sealed memfd of `size` > 0 bytes; `label` shows in
  // /proc/<pid>/fd (at most 200 characters). INVALID_ARGUMENT (size, label),
  // RESOURCE_EXHAUSTED (out of memory), INTERNAL (other errno).
  static absl::StatusOr<SharedRegion> CreateSealed(absl::string_view label, uint64_t size);
  // Maps an existing object (read-write) whole. NOT_FOUND if it does not
  // exist; FAILED_PRECONDITION if it is empty.
  static absl::StatusOr<SharedRegion> Open(std::string name, SharedRegionOptions options = {});

  // prefix + tag + "-<pid>-<counter>": unique within this host's live
  // processes. `tag` may be empty.
  static std::string UniqueName(absl::string_view prefix, absl::string_view tag);

  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  // The shm name; for CreateSealed regions, "memfd:<label>".
  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  uint8_t* data() const { return data_; }
  int fd() const { return fd_; }

  // A registration of [offset, offset + size) by this region's descriptor
  // (ticket LocalFdTicket(fd())); size 0 = to the end. No checks here (the
  // server checks bounds: OUT_OF_RANGE).
  v1::RegisterBufferRequest RegisterRequest(std::string buffer_name, uint64_t offset = 0,
                                            uint64_t size = 0) const;

 private:
  SharedRegion() = default;
  void Reset();

  std::string name_;
  uint64_t size_ = 0;
  uint8_t* data_ = nullptr;
  int fd_ = -1;
  bool unlink_ = false;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_SHARED_REGION_H_
