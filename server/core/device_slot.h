// DeviceSlot: the index of per-device state kept in a fixed array (no
// allocation on release paths): devices 0 .. kDeviceSlots - 2 each have
// their own slot, every ordinal beyond (or negative) shares the last one,
// as FreeGate::ForDevice's gates do (free_gate.h). Used by the MemoryBudget's
// per-device charge accounts (memory_budget.h) and the VMM mapper's
// per-device mapped bytes (server/memory/cuda_vmm_mapper.h), so that a
// device's deferred teardowns and its charges are counted under the same
// rule as its gate.
#ifndef TOKENSEL_SERVER_CORE_DEVICE_SLOT_H_
#define TOKENSEL_SERVER_CORE_DEVICE_SLOT_H_

#include <cstddef>

namespace tokensel::core {

inline constexpr int kMaxSlotDevices = 64;  // FreeGate::kMaxDevices
inline constexpr size_t kDeviceSlots = kMaxSlotDevices + 1;

inline constexpr size_t DeviceSlot(int ordinal) {
  return ordinal >= 0 && ordinal < kMaxSlotDevices ? static_cast<size_t>(ordinal)
                                                   : static_cast<size_t>(kMaxSlotDevices);
}

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_DEVICE_SLOT_H_
