#!/usr/bin/env python3
"""The benchmark table of scripts/bench.sh: every case of
tokensel_kernels_bench's JSON output (medians when it ran repetitions),
its "op" variant against each of the case's baselines measured in the same
run, one row per baseline ("vs baseline" = baseline time / op time), and
against the PyTorch peer of scripts/torch_peer_bench.py measured in the same
session ("vs torch" = torch time / op time). Both ratios > 1 mean tokensel is
faster.

  scripts/bench_table.py kernels.json [peer.json] [--markdown]

Exit status 0; 2 on unreadable input.
"""
import argparse
import json
import sys

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def load_benchmarks(path):
    """{case: {variant: median_us}} (medians if present, else single runs)."""
    with open(path) as f:
        data = json.load(f)
    runs, medians = {}, {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name") or b["name"]
        if name.endswith("/real_time"):  # UseRealTime() appends it
            name = name[:-len("/real_time")]
        if "/" not in name or b.get("error_occurred"):
            continue
        case, variant = name.rsplit("/", 1)
        us = b["real_time"] * UNIT_US[b.get("time_unit", "ns")]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians.setdefault(case, {})[variant] = us
        else:
            runs.setdefault(case, {}).setdefault(variant, []).append(us)
    table = {}
    for case, variants in runs.items():
        for variant, values in variants.items():
            values.sort()
            table.setdefault(case, {})[variant] = values[len(values) // 2]
    for case, variants in medians.items():
        table.setdefault(case, {}).update(variants)
    return table, data.get("context", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernels_json")
    ap.add_argument("peer_json", nargs="?")
    ap.add_argument("--markdown", action="store_true")
    opts = ap.parse_args()
    try:
        table, context = load_benchmarks(opts.kernels_json)
        peer = {}
        torch_version = None
        if opts.peer_json:
            with open(opts.peer_json) as f:
                p = json.load(f)
            peer, torch_version = p["cases"], p.get("torch")
    except (OSError, ValueError, KeyError) as e:
        print(f"bench_table: {e}", file=sys.stderr)
        return 2
    header = ("case", "op us", "baseline", "base us", "vs baseline", "torch us", "vs torch")
    rows = []
    for case in sorted(table):
        variants = table[case]
        op = variants.get("op")
        if op is None:
            continue
        torch_us = peer.get(case, {}).get("median_us")
        # One row per baseline: "baseline_memcpy" first, then the others
        # (e.g. "baseline_memcpy_t2", the same bytes copied by as many threads).
        bases = sorted((v for v in variants if v.startswith("baseline")),
                       key=lambda v: (v != "baseline_memcpy", v)) or [None]
        for base_name in bases:
            base = variants.get(base_name) if base_name else None
            rows.append((case, f"{op:.1f}", (base_name or "-").replace("baseline_", ""),
                         f"{base:.1f}" if base else "-", f"{base / op:.2f}x" if base else "-",
                         f"{torch_us:.1f}" if torch_us else "-",
                         f"{torch_us / op:.2f}x" if torch_us else "-"))
    print(f"\ntokensel_kernels_bench vs its baselines and PyTorch {torch_version or '(not run)'}"
          f" ({context.get('num_cpus', '?')} CPUs, {context.get('date', '')});"
          " ratios > 1: tokensel faster")
    if opts.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
