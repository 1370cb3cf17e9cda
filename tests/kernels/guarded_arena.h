// GuardedArena: tensors in mmap'ed memory the way the server sees a client's
// shared memory, with every stray access made loud.
//
// Each block is a memfd mapped twice: the kernel's mapping (read-only for
// inputs, read-write for outputs) sits between two PROT_NONE guard pages, and
// a separate read-write alias is what a "client" thread writes through while
// the kernel runs. The block's bytes end exactly at the trailing guard page,
// so reading or writing one element past the end faults; the slack between
// the leading guard page and the first byte holds a pattern that
// GuardsIntact() checks. Any access outside the blocks' own bytes either
// faults (SIGSEGV kills the test) or is reported by GuardsIntact().
//
//   GuardedArena arena;
//   GuardedArena::Block idx = arena.Add(bytes, GuardedArena::kReadOnly);
//   // kernel: idx.data (read-only); racing client: idx.alias (read-write)
#ifndef TOKENSEL_TESTS_KERNELS_GUARDED_ARENA_H_
#define TOKENSEL_TESTS_KERNELS_GUARDED_ARENA_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tokensel::testing {

class GuardedArena {
 public:
  enum Access { kReadOnly, kReadWrite };
  static constexpr uint8_t kGuardByte = 0xA5;

  struct Block {
    char* data = nullptr;   // the kernel's view of the bytes
    char* alias = nullptr;  // read-write alias of the same bytes (the racing client)
    size_t bytes = 0;
  };

  GuardedArena() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}
  ~GuardedArena() {
    for (const Mapping& m : mappings_) {
      munmap(m.reserved, m.reserved_bytes);
      munmap(m.alias, m.pages_bytes);
    }
  }
  GuardedArena(const GuardedArena&) = delete;
  GuardedArena& operator=(const GuardedArena&) = delete;

  // A block of `bytes` (>= 1) zero bytes. Aborts on a system error (a test
  // that cannot set up its memory must not pass).
  Block Add(size_t bytes, Access access) {
    const size_t pages_bytes = (bytes + page_ - 1) / page_ * page_;
    const int fd = memfd_create("tokensel-guarded-arena", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(pages_bytes)) != 0) abort();
    const size_t reserved_bytes = pages_bytes + 2 * page_;
    char* reserved = static_cast<char*>(
        mmap(nullptr, reserved_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (reserved == MAP_FAILED) abort();
    const int prot = access == kReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
    if (mmap(reserved + page_, pages_bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      abort();
    }
    char* alias =
        static_cast<char*>(mmap(nullptr, pages_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (alias == MAP_FAILED) abort();
    close(fd);
    const size_t slack = pages_bytes - bytes;
    std::memset(alias, kGuardByte, slack);
    mappings_.push_back({reserved, reserved_bytes, alias, pages_bytes, slack});
    return Block{reserved + page_ + slack, alias + slack, bytes};
  }

  // True when the slack in front of every block still holds the pattern.
  bool GuardsIntact() const {
    for (const Mapping& m : mappings_) {
      for (size_t i = 0; i < m.slack; ++i) {
        if (static_cast<uint8_t>(m.alias[i]) != kGuardByte) return false;
      }
    }
    return true;
  }

 private:
  struct Mapping {
    char* reserved;
    size_t reserved_bytes;
    char* alias;
    size_t pages_bytes;
    size_t slack;
  };
  size_t page_;
  std::vector<Mapping> mappings_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_GUARDED_ARENA_H_
