// CudaVmmMapping: what one CUDA VMM region holds (one reserved range, one
// or more imported allocations mapped back to back in it) and its one
// teardown, Undo(), which every error path of CudaVmmMapper::Map and the
// region's destructor run through the device's FreeGate
// (cuda_vmm_mapper.cc, UndoThroughGate: the unmap may synchronize the
// device). Device-free: every call goes through CudaVmmDriver.
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPING_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "server/memory/cuda_vmm_driver.h"

namespace tokensel::memory {

// One allocation of a mapping: its imported handle and where it is mapped
// in the reservation.
struct VmmMappedSegment {
  CudaVmmDriver::Handle handle = 0;
  bool imported = false;
  uint64_t at = 0;      // offset in the reservation
  uint64_t length = 0;  // bytes mapped there, from the allocation's start
  bool mapped = false;
};

// The acquired parts of one mapping (one reservation, one or more
// allocations mapped back to back in it), released by Undo(): the one
// teardown of every error path and of the region's destructor. A gate that
// must run before memory is unmapped (synchronizing frees) hooks here.
struct VmmMapping {
  CudaVmmDriver* driver = nullptr;
  int device = 0;
  std::vector<VmmMappedSegment> segments;
  uint64_t va = 0;
  uint64_t length = 0;  // the reservation's
  bool reserved = false;
  std::shared_ptr<std::atomic<uint64_t>> counted;  // holds `counted_bytes` of the cap
  uint64_t counted_bytes = 0;
  // The registering peer's id in the device gate's per-owner shares
  // (FreeGate::ReserveFor; 0: none): its room and deferred bytes count there.
  uint64_t gate_owner = 0;

  // Whether anything of the device was acquired (an import, the
  // reservation, a mapped segment): only then may Undo call the driver
  // (and synchronize the device). Without, Undo only gives the counted
  // bytes back.
  bool HoldsDeviceResources() const {
    if (reserved) return true;
    for (const VmmMappedSegment& seg : segments) {
      if (seg.imported || seg.mapped) return true;
    }
    return false;
  }

  // Reverse order of acquisition: every mapped segment unmapped (last
  // first), the reservation freed, every imported handle released (last
  // first). Exactly what was acquired, nothing else.
  void Undo();
};

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPING_H_
