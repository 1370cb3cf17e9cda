// SharedRegion: a POSIX shared-memory object mapped into this process, to
// register with a tokensel server as a host_shm buffer.
//
//   ASSIGN_OR_RETURN(v1::ServerInfo info, client.GetServerInfo());
//   ASSIGN_OR_RETURN(SharedRegion region,
//       SharedRegion::Create(SharedRegion::UniqueName(info.shm_prefix(), "acts"), 1 << 20,
//                            {.required_prefix = info.shm_prefix()}));
//   std::memcpy(region.data(), ...);                       // the server sees it
//   session->RegisterBuffer(region.RegisterRequest("acts"));
//
// Create() makes a new object (O_CREAT|O_EXCL, mode 0600, ftruncate) and by
// default unlinks it on destruction; Open() maps an existing object whole and
// never unlinks it. Move-only; the mapping lives until destruction.
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

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  uint8_t* data() const { return data_; }

  // host_shm of [offset, offset + size); size 0 = to the end. No checks here
  // (the server checks bounds: OUT_OF_RANGE).
  v1::HostShm HostShm(uint64_t offset = 0, uint64_t size = 0) const;
  v1::RegisterBufferRequest RegisterRequest(std::string buffer_name, uint64_t offset = 0,
                                            uint64_t size = 0) const;

 private:
  SharedRegion() = default;
  void Reset();

  std::string name_;
  uint64_t size_ = 0;
  uint8_t* data_ = nullptr;
  bool unlink_ = false;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_SHARED_REGION_H_
