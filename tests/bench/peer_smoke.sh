#!/bin/sh
# Smoke test of scripts/bench.sh's comparison step (ctest bench_peer_smoke):
# a tiny run of tokensel_kernels_bench to JSON, the PyTorch peer of the same
# cases at a small scale, and the table, which must give every case both a
# "vs baseline" and a "vs torch" ratio. Numbers are not checked (noise).
#   peer_smoke.sh <tokensel_kernels_bench> <source dir> <work dir>
set -eu
bench=$1 src=$2 work=$3
mkdir -p "$work"
"$bench" --benchmark_filter='^(bert_mask[.]fp16[.]t1|gather[.]bf16[.]seq_first[.]t1|packed[.]scale[.]T8k.*)/' \
  --benchmark_min_time=0.01 --benchmark_out="$work/kernels.json" --benchmark_out_format=json >/dev/null
/usr/bin/python3 "$src/scripts/torch_peer_bench.py" --cases-from "$work/kernels.json" \
  --scale 0.05 --min-time 0.01 --repetitions 1 --out "$work/torch_peer.json" 2>/dev/null
python3 "$src/scripts/bench_table.py" "$work/kernels.json" "$work/torch_peer.json" | tee "$work/table.txt"
for case in bert_mask.fp16.t1 gather.bf16.seq_first.t1 packed.scale.T8k.N64.C1024.bf16.t1; do
  grep -Eq "^$case +[0-9.]+ +[a-z_]+ +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+x$" "$work/table.txt" || {
    echo "peer_smoke: no complete row for $case" >&2
    exit 1
  }
done
