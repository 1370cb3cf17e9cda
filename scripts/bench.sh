#!/usr/bin/env bash
# Benchmarks (release build), each against a baseline measured in the same run:
#  1. CPU operators vs memcpy of the same bytes / std::sort / nth_element / ...
#     (ratio table at the end; medians of 3 repetitions), then the PyTorch peer
#     of every case (scripts/torch_peer_bench.py under Debian's python3-torch,
#     same shapes, dtypes and thread counts) and one table with both ratios
#     (scripts/bench_table.py: "vs baseline", "vs torch"; > 1 = tokensel faster);
#  2. RPC latency of a real tokensel-server: null RPC vs a small GatherTokens
#     on a registered shm buffer, unix socket and loopback TCP, 1 and 8 clients.
#
#   ./scripts/bench.sh                               # both
#   ./scripts/bench.sh --benchmark_filter='gather'   # extra flags for step 1
#   TOKENSEL_BENCH_PEER=0 ./scripts/bench.sh          # without the PyTorch peer
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target tokensel_kernels_bench tokensel_rpc_bench tokensel-server
out=build/release/bench
mkdir -p "$out"
build/release/tests/bench/tokensel_kernels_bench \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/kernels.json" --benchmark_out_format=json "$@"
peer=()
if [ "${TOKENSEL_BENCH_PEER:-1}" != 0 ]; then
  # The cases the filter selected (the peer knows them by name).
  /usr/bin/python3 scripts/torch_peer_bench.py --cases-from "$out/kernels.json" \
    --out "$out/torch_peer.json"
  peer=("$out/torch_peer.json")
fi
python3 scripts/bench_table.py "$out/kernels.json" "${peer[@]}"
build/release/tests/bench/tokensel_rpc_bench --requests=5000
