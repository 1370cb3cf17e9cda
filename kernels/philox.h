// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC'11), with the constants of the
// reference Random123 implementation. Stateless: the output is a pure function
// of a 128-bit counter and a 64-bit key, so any thread (CPU or GPU) can draw
// the numbers of any counter directly.
//
// Everything here is constexpr and TOKENSEL_HD: the host compiler and nvcc
// compile the same code. The 32x32->64 multiply goes through uint64_t (no
// intrinsics), which both compilers turn into one widening multiply.
#ifndef TOKENSEL_KERNELS_PHILOX_H_
#define TOKENSEL_KERNELS_PHILOX_H_

#include <cstdint>

#include "kernels/hd.h"

namespace tokensel::kernels {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplier of lanes 0/1
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplier of lanes 2/3
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key schedule (golden ratio)
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // key schedule (sqrt(3) - 1)
inline constexpr int kPhiloxRounds = 10;

struct Philox4x32Counter {
  uint32_t v[4];
};
struct Philox4x32Key {
  uint32_t v[2];
};

// One Philox round: two widening multiplies, the lanes permuted and mixed
// with the round key.
TOKENSEL_HD constexpr Philox4x32Counter PhiloxRound(const Philox4x32Counter& c,
                                                    const Philox4x32Key& k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c.v[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c.v[2];
  return Philox4x32Counter{
      {static_cast<uint32_t>(p1 >> 32) ^ c.v[1] ^ k.v[0], static_cast<uint32_t>(p1),
       static_cast<uint32_t>(p0 >> 32) ^ c.v[3] ^ k.v[1], static_cast<uint32_t>(p0)}};
}

// Philox4x32-10: ten rounds, the key bumped by (W0, W1) between rounds.
// NOLINTNEXTLINE(readability-identifier-naming): the algorithm's own name.
TOKENSEL_HD constexpr Philox4x32Counter Philox4x32_10(Philox4x32Counter c, Philox4x32Key k) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k.v[0] += kPhiloxW0;
      k.v[1] += kPhiloxW1;
    }
    c = PhiloxRound(c, k);
  }
  return c;
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_PHILOX_H_
