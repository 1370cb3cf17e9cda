// FUZZ_CHECK: the invariant checks of the fuzz targets. A failed check prints
// the condition and aborts, which libFuzzer reports as a crash and saves the
// input as crash-<sha1>.
#ifndef TOKENSEL_TESTS_FUZZ_FUZZ_CHECK_H_
#define TOKENSEL_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (false)

#endif  // TOKENSEL_TESTS_FUZZ_FUZZ_CHECK_H_
