// Which sanitizer this test binary is built with (the asan and tsan presets),
// for tests whose cost or whose measurements the sanitizer changes: GCC
// defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang answers
// __has_feature.
#ifndef TOKENSEL_TESTS_TESTING_SANITIZERS_H_
#define TOKENSEL_TESTS_TESTING_SANITIZERS_H_

#if defined(__has_feature)
#define TOKENSEL_HAS_FEATURE(x) __has_feature(x)
#else
#define TOKENSEL_HAS_FEATURE(x) 0
#endif

namespace tokensel::testing {

#if defined(__SANITIZE_ADDRESS__) || TOKENSEL_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif

#if defined(__SANITIZE_THREAD__) || TOKENSEL_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif

inline constexpr bool kSanitized = kAsan || kTsan;

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_SANITIZERS_H_
