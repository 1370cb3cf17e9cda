#!/usr/bin/env python3
"""Static quality checks of the CUDA kernels (ctest label `static-gpu`).

No GPU is needed. For every kernels/cuda/*.cu file of the build, the checks
read the build's own object (its compile_commands.json entry names it: the
same nvcc, the same -gencode list for sm_80 and sm_90, each with SASS and
PTX) with cuobjdump: `--dump-resource-usage` for 1, `-sass` and `-ptx` for 2.
Without cuobjdump (offline), with --source-map or --recompile, every file is
recompiled instead with EXACTLY the flags of the build plus
`-Xptxas -v --keep`, device code only (`--fatbin` for `-c`), into a scratch
directory, and 1 reads ptxas' report. Then:

 1. Resources: every entry function, for every target architecture
    (sm_80 and sm_90 both required), uses no local memory: from the objects,
    STACK:0 LOCAL:0 (a spill is a store to local memory and reserves a stack
    frame); when recompiling, ptxas reports 0 bytes stack frame, 0 bytes
    spill stores and 0 bytes spill loads and prints no "Local memory used" /
    "Registers are spilled" warning, and cuobjdump (when available) agrees.
 2. 128-bit accesses on the fast paths: the 16-byte instantiation of the row
    copy kernel in gather.cu and scatter.cu (and masks.cu, SliceGptMask)
    must contain 128-bit global loads AND stores, in the SASS of every
    architecture (`LDG.E.128*` / `STG.E.128*`, via cuobjdump -sass) and in
    the PTX (`ld.global*.v4.*` / `st.global*.v4.*`). cuobjdump/nvdisasm come
    from /usr/local/cuda, PATH, or PyPI (nvidia-cuda-cuobjdump,
    nvidia-cuda-nvdisasm) installed once into --cache-dir; without them
    (offline) the PTX check alone runs and the script says so.
 3. Negative controls (so a broken parser cannot pass silently): two small
    kernels are compiled with the same flags, one that spills to local memory
    and one whose "fast path" uses 8-byte accesses; the checks above (of the
    mode in use) must flag both, else this script fails.

Exit status 0 = all checks passed; 1 = a check failed (the reasons are
printed); 2 = usage / environment error.

  check_cuda_static.py --build-dir build/dev [--jobs 2] [--cache-dir DIR] [--recompile]
"""

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# (file name, mangled-name fragment of the kernel that must use 128-bit
# global loads and stores). CopyRowsKernel<16, Map> mangles to
# "CopyRowsKernelILi16E".
FAST_PATHS = [
    ("gather.cu", "CopyRowsKernelILi16E"),
    ("scatter.cu", "CopyRowsKernelILi16E"),
    ("masks.cu", "CopyRowsKernelILi16E"),
]
REQUIRED_ARCHS = ("sm_80", "sm_90")

NEGATIVE_CONTROL = r"""
#include <cstdint>
// Dynamically indexed local array: forces a local-memory stack frame.
__global__ void SpillingKernel(const int* in, int* out, int n) {
  int scratch[64];
  for (int i = 0; i < 64; ++i) scratch[i] = in[i * n + threadIdx.x];
  for (int i = 0; i < n; ++i) scratch[in[i] & 63] += scratch[in[i + n] & 63];
  out[threadIdx.x] = scratch[in[threadIdx.x] & 63];
}
// Named like a fast path but copies 8 bytes at a time.
template <int kVec>
__global__ void CopyRowsKernel(const uint2* in, uint2* out, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}
template __global__ void CopyRowsKernel<16>(const uint2*, uint2*, int64_t);
"""


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------ compile commands


def load_entries(build_dir):
    path = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} not found (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)")
    with open(path) as f:
        db = json.load(f)
    entries = []
    for e in db:
        src = os.path.normpath(os.path.join(e["directory"], e["file"]))
        parts = src.split(os.sep)
        if src.endswith(".cu") and len(parts) >= 3 and parts[-3:-1] == ["kernels", "cuda"]:
            args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
            entries.append({"file": src, "directory": e["directory"], "args": args})
    return entries


def object_path(entry):
    """The object file the build writes for `entry` (its -o), or None."""
    args = entry["args"]
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return os.path.normpath(os.path.join(entry["directory"], args[i + 1]))
    return None


def rewrite_args(args, obj, keep_dir, source_map):
    """The build's nvcc command with -o redirected, no depfile, -v added, and
    --fatbin for -c: the device code of every -gencode target exactly as the
    build compiles it (same flags, same ptxas), without the host compilation
    that an object needs and these checks do not (half the time of -c)."""
    out = []
    skip = 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-MT", "-MF", "-o"):
            skip = 1
            continue
        if a == "-MD":
            continue
        if a == "-c":
            a = "--fatbin"
        if source_map:
            a = a.replace(source_map[0], source_map[1])
        out.append(a)
    return out + ["-o", obj, "-Xptxas", "-v", "--keep", "--keep-dir", keep_dir]


# ------------------------------------------------------------ ptxas report

ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
PROPS_RE = re.compile(r"Function properties for (\S+)")
FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS_RE = re.compile(r"Used (\d+) registers")
WARN_RE = re.compile(r"ptxas warning : (Local memory used|Registers are spilled)[^']*'([^']+)'")


def parse_ptxas(stderr):
    """{(kernel, arch): {regs, stack, spill_st, spill_ld}} and lmem warnings."""
    kernels = {}
    current = None
    props_for = None
    for line in stderr.splitlines():
        m = ENTRY_RE.search(line)
        if m:
            current = (m.group(1), m.group(2))
            kernels[current] = {"regs": None, "stack": None, "spill_st": None, "spill_ld": None}
            props_for = None
            continue
        m = PROPS_RE.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = FRAME_RE.search(line)
        if m and current and props_for == current[0]:
            k = kernels[current]
            k["stack"], k["spill_st"], k["spill_ld"] = (int(g) for g in m.groups())
            continue
        m = REGS_RE.search(line)
        if m and current:
            kernels[current]["regs"] = int(m.group(1))
    warnings = [(m.group(1), m.group(2)) for m in WARN_RE.finditer(stderr)]
    return kernels, warnings


def short_name(pretty):
    """'void ns::K<16, ns::Map>(args)' -> 'K<16, Map>' for the report."""
    s = re.sub(r"tokensel::kernels::(cuda::)?|\(anonymous namespace\)::|^void ", "", pretty)
    depth = 0
    for i, ch in enumerate(s):  # drop the parameter list
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            return s[:i]
    return s


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout
    return {n: short_name(p) for n, p in zip(names, out.splitlines())}


# ------------------------------------------------------------ cuobjdump


def find_tools(cache_dir, allow_install):
    """(cuobjdump, env) with nvdisasm on PATH, or (None, reason)."""
    search = [os.environ.get("PATH", ""), "/usr/local/cuda/bin",
              os.path.join(cache_dir, "cuobjdump", "nvidia", "cu13", "bin"),
              os.path.join(cache_dir, "nvdisasm", "nvidia", "cu13", "bin")]
    for sub in ("cuobjdump", "nvdisasm"):  # other CUDA majors
        root = os.path.join(cache_dir, sub, "nvidia")
        if os.path.isdir(root):
            for d in sorted(os.listdir(root)):
                search.append(os.path.join(root, d, "bin"))
    path = os.pathsep.join(p for p in search if p)

    def have():
        return shutil.which("cuobjdump", path=path), shutil.which("nvdisasm", path=path)

    cuobjdump, nvdisasm = have()
    if (not cuobjdump or not nvdisasm) and allow_install:
        for pkg, sub, tool in (("nvidia-cuda-cuobjdump", "cuobjdump", cuobjdump),
                               ("nvidia-cuda-nvdisasm", "nvdisasm", nvdisasm)):
            if tool:
                continue
            log(f"installing {pkg} into {os.path.join(cache_dir, sub)} (once)")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                "--target", os.path.join(cache_dir, sub), pkg],
                               capture_output=True, text=True)
            if r.returncode != 0:
                log(f"  pip failed: {r.stderr.strip().splitlines()[-1:]}")
        return find_tools(cache_dir, allow_install=False)
    if not cuobjdump or not nvdisasm:
        return None, "cuobjdump/nvdisasm not available (offline?)"
    env = dict(os.environ, PATH=path)
    return cuobjdump, env


def sass_functions(cuobjdump, env, obj, arch):
    """{mangled name: SASS text} for one architecture of an object."""
    r = subprocess.run([cuobjdump, "-sass", "-arch", arch, obj], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {obj}: {r.stderr.strip()}")
    funcs, name, body = {}, None, []
    for line in r.stdout.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                funcs[name] = "\n".join(body)
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        funcs[name] = "\n".join(body)
    return funcs


def resource_usage(cuobjdump, env, obj):
    """[(arch, function, stack, local, regs)] from --dump-resource-usage."""
    r = subprocess.run([cuobjdump, "--dump-resource-usage", obj], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump --dump-resource-usage {obj}: {r.stderr.strip()}")
    rows, arch = [], None
    for line in r.stdout.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function (\S+):", line)
        func = m.group(1) if m else None
        m2 = re.search(r"STACK:(\d+).*LOCAL:(\d+)", line)
        m3 = re.search(r"REG:(\d+)", line)
        regs = int(m3.group(1)) if m3 else None
        if func is None and m2 and rows and rows[-1][2] is None:
            rows[-1] = (rows[-1][0], rows[-1][1], int(m2.group(1)), int(m2.group(2)), regs)
        elif func is not None:
            rows.append((arch, func, int(m2.group(1)) if m2 else None, int(m2.group(2)) if m2 else None,
                         regs))
    return rows


SASS_LD128 = re.compile(r"\bLDG\.E\.128\b")
SASS_ST128 = re.compile(r"\bSTG\.E\.128\b")
PTX_LD128 = re.compile(r"\bld\.global(\.\w+)*\.v4\.")
PTX_ST128 = re.compile(r"\bst\.global(\.\w+)*\.v4\.")


def ptx_entries(keep_dir):
    """{arch ('sm_80'): {mangled entry: PTX body}} from the kept .ptx files."""
    result = {}
    for fname in os.listdir(keep_dir):
        if not fname.endswith(".ptx"):
            continue
        with open(os.path.join(keep_dir, fname)) as f:
            add_ptx_entries(f.read(), fname, result)
    return result


def object_ptx_entries(cuobjdump, env, obj):
    """The same from the PTX embedded in an object (cuobjdump -ptx): one
    module per architecture, each starting at its .version line."""
    r = subprocess.run([cuobjdump, "-ptx", obj], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -ptx {obj}: {r.stderr.strip()}")
    result = {}
    modules = re.split(r"^(?=\.version\s)", r.stdout, flags=re.M)
    for text in modules[1:]:
        add_ptx_entries(text, obj, result)
    return result


def add_ptx_entries(text, origin, result):
    """Adds the .entry bodies of one PTX module to result[arch]."""
    m = re.search(r"^\.target\s+sm_(\d+)", text, re.M)
    arch = f"sm_{m.group(1)}" if m else origin
    entries = result.setdefault(arch, {})
    for em in re.finditer(r"\.entry\s+(\S+)\s*\(", text):
        brace = text.find("{", em.end())
        depth, i = 0, brace
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        entries[em.group(1)] = text[brace:i]


# ------------------------------------------------------------ the checks


def compile_one(entry, work, source_map):
    name = os.path.basename(entry["file"])
    keep = os.path.join(work, name + ".keep")
    os.makedirs(keep, exist_ok=True)
    obj = os.path.join(work, name + ".fatbin")
    args = rewrite_args(entry["args"], obj, keep, source_map)
    r = subprocess.run(args, cwd=entry["directory"], capture_output=True, text=True)
    return name, obj, keep, r


def missing_archs(name, archs_by_kernel, pretty):
    """A failure for every kernel not built for all of REQUIRED_ARCHS."""
    failures = []
    for kernel, archs in archs_by_kernel.items():
        missing = [a for a in REQUIRED_ARCHS if a not in archs]
        if missing:
            failures.append(f"{name}: {pretty.get(kernel, kernel)} not compiled for {', '.join(missing)}")
    return failures


def check_object(name, obj, keep, proc, tools, fast_paths, report):
    """Appends failures for one compiled file; returns them."""
    failures = []
    if proc.returncode != 0:
        return [f"{name}: compilation failed:\n{proc.stderr[-4000:]}"]
    kernels, warnings = parse_ptxas(proc.stderr)
    for kind, func in warnings:
        failures.append(f"{name}: ptxas warning '{kind}' for {func}")
    pretty = demangle(sorted({k for k, _ in kernels}))
    archs_by_kernel = {}
    for (kernel, arch), k in sorted(kernels.items()):
        archs_by_kernel.setdefault(kernel, set()).add(arch)
        report.append((name, arch, pretty.get(kernel, kernel), k))
        if k["stack"] is None:
            failures.append(f"{name}: no ptxas properties parsed for {kernel} ({arch})")
        elif k["stack"] or k["spill_st"] or k["spill_ld"]:
            failures.append(f"{name}: {pretty.get(kernel, kernel)} on {arch}: {k['stack']} bytes stack frame, "
                            f"{k['spill_st']} bytes spill stores, {k['spill_ld']} bytes spill loads")
    failures += missing_archs(name, archs_by_kernel, pretty)

    cuobjdump, env = tools
    failures += check_fast_paths(name, obj, ptx_entries(keep), tools, fast_paths, report)
    if cuobjdump:
        for arch, func, stack, local, _ in resource_usage(cuobjdump, env, obj):
            if stack or local:
                failures.append(f"{name}: cuobjdump resource usage {func} ({arch}): STACK:{stack} LOCAL:{local}")
    return failures


def check_fast_paths(name, obj, ptx, tools, fast_paths, report):
    """128-bit global loads and stores in the PTX (`ptx`: ptx_entries) and,
    with cuobjdump, the SASS of every architecture of the fast paths of
    `name`; returns the failures."""
    failures = []
    cuobjdump, env = tools
    wanted = [frag for f, frag in fast_paths if f == name]
    for frag in wanted:
        for arch in REQUIRED_ARCHS:
            bodies = [b for n, b in ptx.get(arch, {}).items() if frag in n]
            if not bodies:
                failures.append(f"{name}: no PTX entry matching {frag} for {arch}")
            for b in bodies:
                if not PTX_LD128.search(b) or not PTX_ST128.search(b):
                    failures.append(f"{name}: PTX of {frag} ({arch}) lacks ld.global*.v4 / st.global*.v4")
    if cuobjdump:
        for arch in REQUIRED_ARCHS:
            funcs = sass_functions(cuobjdump, env, obj, arch)
            for frag in wanted:
                hits = {n: b for n, b in funcs.items() if frag in n}
                if not hits:
                    failures.append(f"{name}: no SASS function matching {frag} for {arch}")
                for n, b in hits.items():
                    ld, st = len(SASS_LD128.findall(b)), len(SASS_ST128.findall(b))
                    report.append((name, arch, "SASS " + demangle([n])[n],
                                   {"LDG.E.128": ld, "STG.E.128": st}))
                    if not ld or not st:
                        failures.append(f"{name}: SASS of {frag} ({arch}) has {ld} LDG.E.128 and {st} STG.E.128")
    return failures


def check_built_object(name, obj, tools, fast_paths, report):
    """The same checks on the build's own object, without recompiling it
    (cuobjdump needed): the resource usage of every function for every
    architecture stands for the ptxas report (STACK and LOCAL must be 0: a
    spill is a store to local memory and reserves a stack frame), and the
    fast paths are checked in its embedded PTX and SASS. The objects carry
    both (code=[compute_XX,sm_XX] for sm_80 and sm_90)."""
    cuobjdump, env = tools
    rows = resource_usage(cuobjdump, env, obj)  # none for host-only files (device.cu)
    failures = []
    pretty = demangle(sorted({func for _, func, _, _, _ in rows}))
    archs_by_kernel = {}
    for arch, func, stack, local, regs in rows:
        archs_by_kernel.setdefault(func, set()).add(arch)
        report.append((name, arch, pretty.get(func, func),
                       {"regs": regs, "stack": stack, "spill_st": local, "spill_ld": local}))
        if stack is None:
            failures.append(f"{name}: no resource usage parsed for {func} ({arch})")
        elif stack or local:
            failures.append(f"{name}: {pretty.get(func, func)} on {arch}: {stack} bytes stack frame, "
                            f"{local} bytes local memory")
    failures += missing_archs(name, archs_by_kernel, pretty)
    failures += check_fast_paths(name, obj, object_ptx_entries(cuobjdump, env, obj), tools, fast_paths,
                                 report)
    return failures


def negative_control(template_entry, work, tools, built):
    """Compiles NEGATIVE_CONTROL with the build's flags; the checks must flag
    it (check_built_object's if `built`, else check_object's)."""
    src = os.path.join(work, "negative_control.cu")
    with open(src, "w") as f:
        f.write(NEGATIVE_CONTROL)
    entry = dict(template_entry)
    args = []
    for a in entry["args"]:
        args.append(src if os.path.normpath(os.path.join(entry["directory"], a)) == template_entry["file"] else a)
    entry = {"file": src, "directory": entry["directory"], "args": args}
    name, obj, keep, proc = compile_one(entry, work, None)
    control_paths = [(name, "CopyRowsKernelILi16E")]
    if built and proc.returncode == 0:
        failures = check_built_object(name, obj, tools, control_paths, [])
    else:
        failures = check_object(name, obj, keep, proc, tools, control_paths, [])
    spill = any("SpillingKernel" in f and ("stack frame" in f or "Local memory" in f) for f in failures)
    ptx128 = any("PTX of CopyRowsKernelILi16E" in f for f in failures)
    sass128 = any("SASS of CopyRowsKernelILi16E" in f for f in failures) or not tools[0]
    problems = []
    if proc.returncode != 0:
        problems.append("negative control did not compile:\n" + proc.stderr[-2000:])
    else:
        if not spill:
            problems.append("negative control: a spilling kernel was NOT flagged")
        if not ptx128:
            problems.append("negative control: an 8-byte fast path was NOT flagged in the PTX")
        if not sass128:
            problems.append("negative control: an 8-byte fast path was NOT flagged in the SASS")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True, help="CMake build dir with compile_commands.json")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--cache-dir", default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                        "tokensel-cuda-tools"))
    ap.add_argument("--no-install", action="store_true", help="never pip-install cuobjdump/nvdisasm")
    ap.add_argument("--source-map", metavar="OLD=NEW",
                    help="compile NEW/... instead of OLD/... (check a modified copy of the tree)")
    ap.add_argument("--only", action="append", default=[], help="check only these .cu file names")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--recompile", action="store_true",
                    help="recompile every file with -Xptxas -v even when the build's objects can be read")
    opts = ap.parse_args()

    source_map = tuple(opts.source_map.split("=", 1)) if opts.source_map else None
    entries = load_entries(opts.build_dir)
    if opts.only:
        entries = [e for e in entries if os.path.basename(e["file"]) in opts.only]
    if not entries:
        log("error: no kernels/cuda/*.cu entries in compile_commands.json")
        return 2
    tools = find_tools(opts.cache_dir, allow_install=not opts.no_install)
    if tools[0] is None:
        log(f"note: {tools[1]}: SASS and resource-usage checks skipped, PTX check only")
        tools = (None, None)

    # The build's own objects hold everything the checks read (SASS, PTX and
    # resource usage of both architectures): with cuobjdump they are read
    # directly, which costs nothing next to recompiling every file (about a
    # minute of CI). Recompiling remains for a modified tree (--source-map),
    # without cuobjdump (PTX and the ptxas report only), and on request.
    objects = [object_path(e) for e in entries]
    built = (tools[0] is not None and not source_map and not opts.recompile
             and all(o and os.path.exists(o) for o in objects))
    log("checking the build's objects (cuobjdump)" if built
        else "recompiling every file with -Xptxas -v")
    work = tempfile.mkdtemp(prefix="tokensel-cuda-static-")
    failures, report = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=opts.jobs) as pool:
            control = pool.submit(negative_control, entries[0], work, tools, built)
            if built:
                for e, obj in zip(entries, objects):
                    failures += check_built_object(os.path.basename(e["file"]), obj, tools, FAST_PATHS, report)
            else:
                futures = [pool.submit(compile_one, e, work, source_map) for e in entries]
                for fut in futures:
                    name, obj, keep, proc = fut.result()
                    failures += check_object(name, obj, keep, proc, tools, FAST_PATHS, report)
            control_problems = control.result()
    finally:
        if not opts.keep_work:
            shutil.rmtree(work, ignore_errors=True)

    # Spill columns: ptxas' spill stores/loads, or (from the build's objects)
    # the local memory bytes twice.
    log(f"{'file':<20} {'arch':<6} {'regs':>4} {'stack':>5} {'spill st/ld':>11}  kernel")
    for name, arch, kernel, k in report:
        if "regs" in k:
            log(f"{name:<20} {arch:<6} {k['regs'] or 0:>4} {k['stack']:>5} {k['spill_st']:>5}/{k['spill_ld']:<5}  {kernel[:150]}")
    for name, arch, kernel, k in report:
        if "LDG.E.128" in k:
            log(f"{name:<20} {arch:<6} LDG.E.128 x{k['LDG.E.128']} STG.E.128 x{k['STG.E.128']}  {kernel[5:155]}")
    checked = sorted({(n, a) for n, a, _, k in report if 'regs' in k})
    log(f"checked {len([r for r in report if 'regs' in r[3]])} kernel builds in {len(entries)} files; "
        f"SASS check {'on' if tools[0] else 'OFF (PTX only)'}; negative control "
        f"{'ok' if not control_problems else 'FAILED'}")
    failures += control_problems
    if failures:
        log("\nFAILED:")
        for f in failures:
            log("  " + f)
        return 1
    log("all static GPU checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
