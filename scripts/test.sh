#!/usr/bin/env bash
# The test command: install dependencies (Debian packages; the pinned PyPI
# tools that validate deploy/; the Python client's venvs: the main one and
# its wheel at both ends of its dependency range), build the `dev` preset (CUDA targets too when
# nvcc is available) and run every test with ctest; then the hardening runs:
# the whole suite again under ASan + UBSan (`asan`), the concurrency suites
# under ThreadSanitizer (`tsan`), and a bounded libFuzzer run per fuzz target
# (`fuzz`, TOKENSEL_FUZZ_SECONDS each, default 45).
#
#   ./scripts/test.sh              # everything
#   ./scripts/test.sh -L kernels   # extra arguments go to ctest (dev preset only)
#   TOKENSEL_TEST_SANITIZERS=0 ./scripts/test.sh   # only the dev preset
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/install-tools.sh
scripts/install-pyclient.sh
scripts/install-pyclient-ends.sh
cmake --preset dev
cmake --build --preset dev
ctest --preset dev "$@"

if [ "${TOKENSEL_TEST_SANITIZERS:-1}" != 0 ]; then
  for preset in asan tsan; do
    start=$SECONDS
    cmake --preset "$preset"
    cmake --build --preset "$preset"
    ctest --preset "$preset"
    echo "test.sh: $preset preset built and tested in $((SECONDS - start)) s"
  done
  start=$SECONDS
  cmake --preset fuzz -DTOKENSEL_FUZZ_SECONDS="${TOKENSEL_FUZZ_SECONDS:-45}"
  cmake --build --preset fuzz
  ctest --preset fuzz
  echo "test.sh: fuzz preset built and run in $((SECONDS - start)) s"
fi
