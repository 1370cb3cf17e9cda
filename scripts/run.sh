#!/usr/bin/env bash
# The main job, on the embedded default (CPU backend): install dependencies,
# build the `release` preset and run the operator benchmarks, which print each
# operator's speed against a baseline measured in the same run (memcpy of the
# same bytes, std::sort, std::nth_element, ...).
#
# The gRPC server and the `tokensel demo` training-worker replay are not built
# yet (issues 4 and 5); when they land, this script runs the demo instead.
#
#   ./scripts/run.sh                                  # all benchmarks, medians of 3
#   ./scripts/run.sh --benchmark_filter='gather'      # extra Google Benchmark flags
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target tokensel_kernels_bench
exec build/release/tests/bench/tokensel_kernels_bench \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true "$@"
