// Which sanitizer this test binary is built with (the asan and tsan presets),
// for tests whose cost or whose measurements the sanitizer changes: GCC
// defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang answers
// __has_feature.
#ifndef TOKENSEL_TESTS_TESTING_SANITIZERS_H_
#define TOKENSEL_TESTS_TESTING_SANITIZERS_H_

namespace tokensel::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif
#else
inline constexpr bool kTsan = false;
#endif

inline constexpr bool kSanitized = kAsan || kTsan;

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_SANITIZERS_H_
