// Unguessable identifiers (session ids, fd tickets) from the kernel's CSPRNG
// (getrandom(2)); absl::BitGen is documented as unfit for security.
#ifndef TOKENSEL_SERVER_CORE_SECURE_RANDOM_H_
#define TOKENSEL_SERVER_CORE_SECURE_RANDOM_H_

#include <string>

namespace tokensel::core {

// 128 random bits as 32 lower-case hex characters. Blocks only until the
// kernel's entropy pool is first initialized (early boot); aborts if the
// kernel refuses (no sane fallback exists for a security token).
std::string SecureRandomHex128();

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_SECURE_RANDOM_H_
