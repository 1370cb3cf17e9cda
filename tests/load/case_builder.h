// CaseBuilder: builds tokensel requests whose every effect the load worker
// can predict with the CPU oracle (kernels/cpu), for one client thread.
//
// Memory model. A thread owns one POSIX shm region registered with the
// server (buffer name `buffer`), a `mirror` of the same size that holds what
// the region must contain once every request sent so far has run, and a
// `local` scratch area for inline tensors. Tensors are placed by bump
// allocation (64-byte aligned, random stride padding and misalignment) and
// live either in the region (Home::kShm: sent by reference) or in local
// memory (Home::kLocal: sent inline).
//
//   CaseBuilder b(mem, &rng);                 // empty arenas
//   Slot acts = b.Place(Home::kShm, DType::kFloat32, {B, S, C});
//   b.FillBytes(acts);                         // random, written to mirror AND region
//   ... oracle: kernels::cpu::GatherTokens({b.View(acts), ...}) on the mirror
//   req.mutable_activations() = b.Input(acts);
//   req.mutable_out() = b.Output(out, "out");  // inline: recorded as expected
//
// Inputs are filled in the mirror (or local memory) and copied to the region,
// outputs are never filled: the oracle writes them in the mirror (or local),
// the server writes them in the region (or returns them inline). After the
// RPC the whole region must equal the mirror byte for byte and every
// expected inline output must equal its oracle slot. Build ops in the order
// the server runs them (Execute, Stream): the oracle then sees the same
// sequence of states.
//
// Placement never overlaps earlier tensors; running out of room is a bug in
// the caller's size budget and aborts the process with a message (see
// remaining()). Not thread-safe: one builder per thread and request.
#ifndef TOKENSEL_TESTS_LOAD_CASE_BUILDER_H_
#define TOKENSEL_TESTS_LOAD_CASE_BUILDER_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/tensor_view.h"
#include "tests/server/integration/client_util.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::load {

namespace v1 = ::tokensel::v1;
using itest::Placed;
using kernels::DType;

// The memory one builder works on; all three areas have `size` bytes.
struct CaseMemory {
  uint8_t* shm = nullptr;     // the registered region (the server writes it)
  uint8_t* mirror = nullptr;  // what the region must hold
  uint8_t* local = nullptr;   // inline tensors and their oracle outputs
  uint64_t size = 0;
  std::string buffer;  // the region's registered name
};

enum class Home { kShm, kLocal };

struct Slot {
  Placed placed;
  Home home = Home::kShm;
};

// An inline output the server must return: op `op_index` (0-based within
// the request), output `name`, equal to the oracle's `slot` (always local).
struct ExpectedOutput {
  int op_index = 0;
  std::string name;
  Slot slot;
};

class CaseBuilder {
 public:
  CaseBuilder(CaseMemory memory, std::mt19937_64* rng);

  // A tensor of `shape`; `strided` allows random stride padding and a
  // misaligned offset (never more than doubling its extent).
  Slot Place(Home home, DType dtype, std::vector<int64_t> shape, bool strided = true);
  // kShm with probability `p_shm`, else kLocal.
  Home RandomHome(double p_shm = 0.5);

  // The view the oracle uses: into the mirror (kShm) or local memory.
  kernels::TensorView View(const Slot& slot) const;

  // Input fills (random bytes / indices in [0, range) / packed segment ids);
  // kShm slots are then copied to the region.
  void FillBytes(const Slot& slot);
  void FillIndices(const Slot& slot, int64_t range, bool unique);
  void FillSegments(const Slot& slot, int64_t max_segments);
  // Copies a kShm slot's bytes from the mirror to the region (after the
  // caller changed them in both, or in the mirror only).
  void Commit(const Slot& slot);

  // Request tensors: a BufferSlice reference, or inline data packed from
  // local memory.
  v1::Tensor Input(const Slot& slot);
  // An output: a reference (kShm), or "inline" (kLocal), recorded under
  // `name` for the current op.
  v1::Tensor Output(const Slot& slot, const std::string& name);
  // Records that `slot` (kLocal) comes back inline as `name` without an
  // output field (absent outputs that default to inline, in-place inline ops).
  void ExpectInline(const Slot& slot, const std::string& name);

  // Ops of a multi-op request: call after finishing each op.
  void NextOp() { ++op_index_; }
  int op_count() const { return op_index_; }
  const std::vector<ExpectedOutput>& expected() const { return expected_; }
  // Inline tensors so far (inputs sent inline plus outputs expected inline).
  int inline_tensors() const { return inline_tensors_; }

  // Bytes still free in the fuller of the two arenas (region, local).
  uint64_t remaining() const;
  // Bytes allocated so far in one arena.
  uint64_t used(Home home) const { return next_[home == Home::kShm ? 0 : 1]; }
  std::mt19937_64& rng() { return *rng_; }
  const CaseMemory& memory() const { return memory_; }

 private:
  uint8_t* Base(Home home) const { return home == Home::kShm ? memory_.mirror : memory_.local; }

  CaseMemory memory_;
  std::mt19937_64* rng_;
  uint64_t next_[2] = {0, 0};  // bump pointers: [kShm], [kLocal]
  int op_index_ = 0;
  int inline_tensors_ = 0;
  std::vector<ExpectedOutput> expected_;
};

// Random bytes, 8 at a time.
void RandomBytes(uint8_t* data, uint64_t size, std::mt19937_64& rng);

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_CASE_BUILDER_H_
