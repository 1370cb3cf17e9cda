// TestShm: a real POSIX shared-memory object (shm_open + ftruncate + mmap) a
// test registers with a tokensel server, then reads and writes directly.
//
//   ASSIGN_OR_RETURN(TestShm shm, TestShm::Create(server->shm_prefix() + "acts", 1 << 20));
//   std::memcpy(shm.data(), ...);         // the server sees these bytes
//   // ~TestShm unmaps and unlinks the object.
//
// Create() refuses to reuse an existing name (O_EXCL). Move-only.
#ifndef TOKENSEL_TESTS_TESTING_SHM_REGION_H_
#define TOKENSEL_TESTS_TESTING_SHM_REGION_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tokensel::testing {

class TestShm {
 public:
  static absl::StatusOr<TestShm> Create(std::string name, uint64_t size) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
    }
    TestShm shm;
    shm.name_ = std::move(name);
    shm.size_ = size;
    shm.fd_ = fd;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      return absl::InternalError(absl::StrCat("ftruncate: ", std::strerror(errno)));
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap: ", std::strerror(errno)));
    shm.data_ = static_cast<uint8_t*>(p);
    return shm;
  }

  TestShm() = default;
  TestShm(TestShm&& other) noexcept { *this = std::move(other); }
  TestShm& operator=(TestShm&& other) noexcept {
    if (this != &other) {
      Reset();
      name_ = std::move(other.name_);
      size_ = std::exchange(other.size_, 0);
      fd_ = std::exchange(other.fd_, -1);
      data_ = std::exchange(other.data_, nullptr);
      other.name_.clear();
    }
    return *this;
  }
  TestShm(const TestShm&) = delete;
  TestShm& operator=(const TestShm&) = delete;
  ~TestShm() { Reset(); }

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  uint8_t* data() const { return data_; }
  // The object's descriptor (e.g. for fchown in ownership tests).
  int fd() const { return fd_; }

 private:
  void Reset() {
    if (data_ != nullptr) munmap(data_, size_);
    if (fd_ >= 0) close(fd_);
    if (!name_.empty()) shm_unlink(name_.c_str());
    data_ = nullptr;
    fd_ = -1;
    name_.clear();
  }

  std::string name_;
  uint64_t size_ = 0;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_SHM_REGION_H_
