# Project-wide options, language level and warning flags.
include_guard(GLOBAL)

option(TOKENSEL_BUILD_SERVER "Build the gRPC server (needs gRPC, protobuf, prometheus-cpp)" ON)
option(TOKENSEL_BUILD_TESTS "Build the GoogleTest suites" ON)
option(TOKENSEL_BUILD_BENCHMARKS "Build the Google Benchmark programs" ON)
set(TOKENSEL_CUDA "AUTO" CACHE STRING "Build the CUDA targets: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE TOKENSEL_CUDA PROPERTY STRINGS AUTO ON OFF)
option(TOKENSEL_WERROR "Treat compiler warnings as errors" OFF)
option(TOKENSEL_UNITY "Compile the test suites, server/grpc and the CLI in unity batches" ON)
option(TOKENSEL_FUZZ "Build the libFuzzer targets in tests/fuzz (clang; the `fuzz` preset)" OFF)

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

# Warnings for every tokensel C++ target (not for CUDA device code, see TokenselCuda).
add_library(tokensel_warnings INTERFACE)
target_compile_options(tokensel_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wimplicit-fallthrough -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${TOKENSEL_WERROR}>>:-Werror>)

# Sanitizer builds: `asan` sets TOKENSEL_SANITIZE=address,undefined, `tsan` thread,
# `fuzz` fuzzer-no-link,address,undefined (fuzz targets add -fsanitize=fuzzer).
set(TOKENSEL_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list (empty = none)")
if(TOKENSEL_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${TOKENSEL_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${TOKENSEL_SANITIZE})
  # clang's UBSan vptr check (part of `undefined`) probes vtable memory
  # through a pipe it creates (sanitizer_common's IsAccessibleMemoryRange):
  # once the process is out of descriptors, which the accept loop's tests
  # cause on purpose, every virtual call (the log stream's) is reported as
  # "invalid vptr". ASan still catches calls on freed objects.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND TOKENSEL_SANITIZE MATCHES "undefined")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize=vptr>)
  endif()
endif()
