#!/usr/bin/env bash
# The main job, on the embedded default (CPU backend, POSIX shared memory):
# install dependencies, build the `release` preset, then
#  1. run the CPU operator benchmarks, which print each operator's speed
#     against a baseline measured in the same run (memcpy of the same bytes,
#     std::sort, std::nth_element, ...);
#  2. start a real tokensel-server and measure RPC latency over its unix
#     socket and loopback TCP: a null RPC vs a small GatherTokens on a
#     registered shared-memory buffer, 1 and 8 clients.
# (The `tokensel demo` training-worker replay replaces this when the clients
# issue lands.)
#
#   ./scripts/run.sh                                   # everything
#   ./scripts/run.sh --benchmark_filter='gather'       # extra flags for step 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target tokensel_kernels_bench tokensel_rpc_bench tokensel-server
build/release/tests/bench/tokensel_kernels_bench \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true "$@"
build/release/tests/bench/tokensel_rpc_bench --requests=5000
