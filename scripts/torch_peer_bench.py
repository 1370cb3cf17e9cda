#!/usr/bin/python3
"""The peer a user would pick instead of tokensel: PyTorch's CPU ops on the
shapes, dtypes and thread counts of tests/bench/tokensel_kernels_bench,
under the same case names, so scripts/bench_table.py can put a "vs torch"
column next to "vs memcpy" (scripts/bench.sh runs both in one go).

Each peer is the fastest plain-PyTorch formulation we know, with its
outputs preallocated (out= / in-place) and index arithmetic that does not
depend on the data done once outside the timed loop, so the comparison
favours the peer:
  gather   index_select(x viewed as rows, 0, rows, out=)
  scatter  out_rows.index_copy_(0, rows, layer_rows)   (in place)
  merge    out.copy_(x); out_rows.index_copy_(0, rows, layer_rows)
  split    index_select(g, 0, rows, out=lg); rest.copy_(g); rest.index_fill_(0, rows, 0)
  bert_mask per layer: index_select of the R rows, then gather of the R columns (out=)
  sort     torch.sort(ids, dim=-1, out=)
  topk     topk(R, sorted=False).indices, then sort ascending
  sample   rand(L*B, S).topk(R, sorted=False).indices, then sort ascending
  packed   per sequence: rand(n_i).topk(r_i) + sort + cu[i]; cat; index_select(act, 0, ids, out=)
Times are medians of --repetitions runs of the per-call mean over
--min-time seconds (after one warm-up call). Output: JSON
{"case": {"median_us": ..., "peer": "..."}} on stdout or --out.

  /usr/bin/python3 scripts/torch_peer_bench.py --out peer.json [--filter REGEX] [--scale 0.1]
      [--cases-from kernels.json]   # only the cases tokensel_kernels_bench ran
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch

B, S, C, R = 16, 2048, 1024, 1536
MASK_L, MASK_B, MASK_H, MASK_S, MASK_R = 12, 8, 1, 512, 256
SORT_L = 12
PACKED_T, PACKED_N = 131072, 64
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16,
          "f32": torch.float32}


def sorted_rows(gen, rows, r, s):
    return torch.stack([torch.randperm(s, generator=gen)[:r].sort().values for _ in range(rows)])


def token_case(op, dtype, batch_first, scale):
    b, s, c, r = B, max(2, int(S * scale)), C, max(1, int(R * scale))
    gen = torch.Generator().manual_seed(2024)
    idx = sorted_rows(gen, b, r, s)  # [B,R]
    x = torch.ones((b, s, c) if batch_first else (s, b, c), dtype=dtype)
    layer = torch.full((b, r, c) if batch_first else (r, b, c), 2, dtype=dtype)
    if batch_first:  # x[b, s] is row b*S + s; the part's order (b, r)
        rows = (torch.arange(b).unsqueeze(1) * s + idx).reshape(-1)
    else:  # x[s, b] is row s*B + b; order (r, b)
        rows = (idx.t() * b + torch.arange(b)).reshape(-1)
    xr, lr = x.view(-1, c), layer.view(-1, c)
    out = torch.empty_like(x)
    outr = out.view(-1, c)
    part = torch.empty_like(lr)
    if op == "gather":
        return lambda: torch.index_select(xr, 0, rows, out=part)
    if op == "scatter":
        return lambda: xr.index_copy_(0, rows, lr)
    if op == "merge":
        return lambda: (out.copy_(x), outr.index_copy_(0, rows, lr))
    return lambda: (torch.index_select(xr, 0, rows, out=part), out.copy_(x),
                    outr.index_fill_(0, rows, 0))


def bert_mask_case(scale):
    s, r = max(2, int(MASK_S * scale)), max(1, int(MASK_R * scale))
    gen = torch.Generator().manual_seed(7)
    mask = torch.ones(MASK_B, MASK_H, s, s, dtype=torch.float16)
    ids = torch.stack([sorted_rows(gen, MASK_B, r, s) for _ in range(MASK_L)])  # [L,B,R]
    # Rows by index_select on mask viewed as [B*H*S, S] (row (b*H + h)*S + s),
    # then columns by gather: 3x faster than two gathers or per-row index_selects.
    bh = torch.arange(MASK_B * MASK_H).view(MASK_B, MASK_H, 1)
    flat_rows = [(bh * s + i[:, None, :]).reshape(-1) for i in ids]
    col_idx = [i[:, None, None, :].expand(MASK_B, MASK_H, r, r) for i in ids]
    mask_rows = mask.view(-1, s)
    rows = torch.empty(MASK_B * MASK_H * r, s, dtype=torch.float16)
    out = torch.empty(MASK_L, MASK_B, MASK_H, r, r, dtype=torch.float16)

    def run():
        for l in range(MASK_L):
            torch.index_select(mask_rows, 0, flat_rows[l], out=rows)
            torch.gather(rows.view(MASK_B, MASK_H, r, s), 3, col_idx[l], out=out[l])
    return run


def sort_case(scale):
    s, r = max(2, int(S * scale)), max(1, int(R * scale))
    gen = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randperm(s, generator=gen)[:r] for _ in range(SORT_L * B)])
    ids = ids.to(torch.int32).view(SORT_L, B, r)
    vals, order = torch.empty_like(ids), torch.empty(ids.shape, dtype=torch.int64)
    return lambda: torch.sort(ids, dim=-1, out=(vals, order))


def topk_case(dtype, scale):
    s, r = max(2, int(S * scale)), max(1, int(R * scale))
    scores = torch.randn(SORT_L, B, s, generator=torch.Generator().manual_seed(5)).to(dtype)
    return lambda: torch.topk(scores, r, dim=-1, sorted=False).indices.sort(dim=-1)


def sample_case(scale):
    s, r = max(2, int(S * scale)), max(1, int(R * scale))
    return lambda: torch.rand(SORT_L * B, s).topk(r, dim=-1, sorted=False).indices.sort(dim=-1)


def packed_case(total, scale):
    total = max(PACKED_N, int(total * scale))
    gen = torch.Generator().manual_seed(20261126)
    w = torch.rand(PACKED_N, generator=gen, dtype=torch.float64) * 0.95 + 0.05
    cu = [0] + [int(v) for v in (w.cumsum(0) / w.sum() * total).floor()]
    cu[PACKED_N] = total
    for i in range(1, PACKED_N):  # every sequence at least one token
        cu[i] = max(cu[i], cu[i - 1] + 1)
    lengths = [cu[i + 1] - cu[i] for i in range(PACKED_N)]
    keep = [min(n, (n + 1) // 2) for n in lengths]
    act = torch.ones(total, C, dtype=torch.bfloat16)
    out = torch.empty(sum(keep), C, dtype=torch.bfloat16)

    def run():
        ids = torch.cat([torch.rand(n).topk(k, sorted=False).indices.sort().values + first
                         for n, k, first in zip(lengths, keep, cu)])
        torch.index_select(act, 0, ids, out=out)
    return run


def cases(scale):
    """(case name, threads, peer name, factory)."""
    for op in ("gather", "scatter", "merge", "split"):
        for dname in ("bf16", "fp32"):
            for layout in ("batch_first", "seq_first"):
                for t in (1, 2):
                    yield (f"{op}.{dname}.{layout}.t{t}", t, op + " (index ops)",
                           lambda op=op, d=DTYPES[dname], bf=layout == "batch_first":
                           token_case(op, d, bf, scale))
    for t in (1, 2):
        yield (f"bert_mask.fp16.t{t}", t, "index_select rows, gather cols",
               lambda: bert_mask_case(scale))
        yield (f"sort.i32.12x16x1536.s2048.t{t}", t, "torch.sort", lambda: sort_case(scale))
        for dname in ("bf16", "f32"):
            yield (f"topk.{dname}.12x16x2048.r1536.t{t}", t, "topk + sort",
                   lambda d=DTYPES[dname]: topk_case(d, scale))
        yield (f"sample.L12.B16.S2048.R1536.t{t}", t, "rand + topk + sort",
               lambda: sample_case(scale))
        yield (f"packed.T128k.N64.C1024.bf16.t{t}", t, "per-sequence topk + index_select",
               lambda: packed_case(PACKED_T, scale))
    for k in (8, 16, 32, 64, 128):
        yield (f"packed.scale.T{k}k.N64.C1024.bf16.t1", 1, "per-sequence topk + index_select",
               lambda k=k: packed_case(k * 1024, scale))


def measure(fn, min_time, repetitions):
    fn()  # warm-up: first-touch of outputs, lazy init
    runs = []
    for _ in range(repetitions):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        runs.append(elapsed / n * 1e6)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the JSON here (default stdout)")
    ap.add_argument("--filter", default="", help="only cases matching this regex")
    ap.add_argument("--cases-from", metavar="JSON",
                    help="only the cases in this tokensel_kernels_bench --benchmark_out file")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per repetition")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink S/R/T (smoke tests)")
    opts = ap.parse_args()
    wanted = None
    if opts.cases_from:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_table import load_benchmarks
        wanted = set(load_benchmarks(opts.cases_from)[0])
    result = {}
    for name, threads, peer, factory in cases(opts.scale):
        if (opts.filter and not re.search(opts.filter, name)) or (wanted is not None
                                                                  and name not in wanted):
            continue
        torch.set_num_threads(threads)
        us = measure(factory(), opts.min_time, opts.repetitions)
        if not math.isfinite(us):
            sys.exit(f"{name}: no time measured")
        result[name] = {"median_us": us, "peer": peer, "threads": threads}
        print(f"torch peer {name:<44} {us:12.1f} us  ({peer})", file=sys.stderr, flush=True)
    text = json.dumps({"torch": torch.__version__, "cases": result}, indent=1)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
