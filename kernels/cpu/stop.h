// The stop token of the CPU operators: kernels/stop.h, named in this
// namespace for the kernels and the thread pool.
#ifndef TOKENSEL_KERNELS_CPU_STOP_H_
#define TOKENSEL_KERNELS_CPU_STOP_H_

#include "kernels/stop.h"

namespace tokensel::kernels::cpu {

using ::tokensel::kernels::CheckStop;
using ::tokensel::kernels::ScopedStopToken;
using ::tokensel::kernels::StopToken;

namespace internal {
using ::tokensel::kernels::stop_internal::CheckStopIn;
using ::tokensel::kernels::stop_internal::CurrentStopScope;
using ::tokensel::kernels::stop_internal::LatchStop;
using ::tokensel::kernels::stop_internal::StopScope;
using ::tokensel::kernels::stop_internal::SwapStopScope;
}  // namespace internal

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_STOP_H_
