#!/usr/bin/env bash
# The test command: install dependencies (Debian packages; the pinned PyPI
# tools that validate deploy/), build the `dev` preset (CUDA targets too when
# nvcc is available) and run every test with ctest.
#
#   ./scripts/test.sh              # everything
#   ./scripts/test.sh -L kernels   # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/install-tools.sh
cmake --preset dev
cmake --build --preset dev
ctest --preset dev "$@"
