#!/usr/bin/env bash
# One bounded libFuzzer run (the `fuzz` ctest tests; docs/reliability.md):
#
#   run_fuzzer.sh <fuzzer> <corpus-dir> <seed-dir> <seconds> [libFuzzer flags...]
#
# New inputs go to <corpus-dir> (kept between runs); <seed-dir> is read only.
# The mutation sequence is fixed (-seed=1) so a CI run replays a prefix of the
# run that was checked before landing (how far it gets depends on the
# machine); pass -seed=N after the arguments to explore elsewhere.
# Crashes, leaks, sanitizer reports, timeouts (> 10 s per input) and OOMs
# (> 2 GiB) fail the run and leave crash-*/leak-*/timeout-*/oom-* files in
# <corpus-dir>/../artifacts. Prints the final exec count.
set -euo pipefail
fuzzer=$1 corpus=$2 seeds=$3 seconds=$4
shift 4
artifacts="$(dirname "$corpus")/artifacts"
mkdir -p "$corpus" "$artifacts"
exec "$fuzzer" -seed=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$corpus" "$seeds"
