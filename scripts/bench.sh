#!/usr/bin/env bash
# Benchmarks (release build), each against a baseline measured in the same run:
#  1. CPU operators vs memcpy of the same bytes / std::sort / nth_element / ...
#     (ratio table at the end; medians of 3 repetitions);
#  2. RPC latency of a real tokensel-server: null RPC vs a small GatherTokens
#     on a registered shm buffer, unix socket and loopback TCP, 1 and 8 clients.
#
#   ./scripts/bench.sh                               # both
#   ./scripts/bench.sh --benchmark_filter='gather'   # extra flags for step 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target tokensel_kernels_bench tokensel_rpc_bench tokensel-server
build/release/tests/bench/tokensel_kernels_bench \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true "$@"
build/release/tests/bench/tokensel_rpc_bench --requests=5000
