#pragma once
// kSanitizerStride: 1 in the Release test run (make ctest), 4 under the
// sanitizers (make sanitize: clang ASan + UBSan, where the grammar tests'
// exhaustive probes run 10-16x slower). The longest exhaustive and
// randomized tests take every kSanitizerStride-th case there: the same
// code paths under the sanitizers, fewer repetitions; the Release run
// takes every case. It keeps CI (both runs on 2 cores) inside its time.
namespace rill::testing {

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define RILL_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define RILL_TEST_SANITIZED 1
#endif

#ifdef RILL_TEST_SANITIZED
inline constexpr int kSanitizerStride = 4;
#else
inline constexpr int kSanitizerStride = 1;
#endif

}  // namespace rill::testing
