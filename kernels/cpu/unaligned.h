// Loads and stores of trivially copyable values at any byte address (tensor
// views need not be aligned); each compiles to a single move when the
// address is aligned.
#ifndef TOKENSEL_KERNELS_CPU_UNALIGNED_H_
#define TOKENSEL_KERNELS_CPU_UNALIGNED_H_

#include <cstring>

namespace tokensel::kernels::cpu {

template <typename T>
T LoadAt(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreAt(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_UNALIGNED_H_
