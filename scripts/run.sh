#!/usr/bin/env bash
# The main job, on the embedded default (CPU backend + POSIX shared memory
# when there is no GPU): install dependencies, build the `release` preset and
# run `tokensel demo`, which starts a real tokensel-server and plays a
# training worker against it — 12-layer BERT-style and GPT-style Random-LTD
# steps (B=8, S=512, C=768 fp16 in shared memory, 100% -> 50% retention) plus
# SegmentSeqlens on a packed THD batch — checks every result against the CPU
# oracle, and prints a per-op latency table. Exits non-zero if a check fails.
#
#   ./scripts/run.sh                 # the demo
#   ./scripts/run.sh --steps=1       # extra flags go to `tokensel demo`
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target tokensel_cli tokensel-server
exec build/release/client/cli/tokensel demo "$@"
