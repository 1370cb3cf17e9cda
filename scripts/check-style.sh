#!/usr/bin/env bash
# The style gate: what `ctest -L style` runs (tests/CMakeLists.txt), one check
# per argument, each failing on any finding.
#
#   scripts/check-style.sh format          # clang-format --dry-run over every C++/CUDA file
#   scripts/check-style.sh layers          # the include rules of DESIGN.md's layers
#   scripts/check-style.sh tidy BUILD_DIR  # clang-tidy (.clang-tidy's curated checks)
#   scripts/check-style.sh fix             # clang-format -i over the same files
#
# `tidy` covers the translation units of the transport-free layers (common/,
# kernels/, server/core, server/memory, server/backends) from BUILD_DIR's
# compile_commands.json; clang-tidy on the gRPC-facing code (server/grpc,
# server/app, client/) costs ~25-60 s a file here, so run it there by hand
# when you change it:  scripts/check-style.sh tidy build/dev server/grpc/foo.cc
# (from a build configured with -DTOKENSEL_UNITY=OFF, whose
# compile_commands.json names those files rather than their unity batches).
set -euo pipefail
cd "$(dirname "$0")/.."

cxx_files() { git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh'; }

check_format() {
  local bad
  bad=$(cxx_files | xargs clang-format --dry-run 2>&1 | grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' |
        cut -d: -f1 | sort -u || true)
  if [ -n "$bad" ]; then
    echo "check-style: not clang-formatted (run scripts/check-style.sh fix):"
    echo "$bad" | sed 's/^/  /'
    return 1
  fi
  echo "check-style: $(cxx_files | wc -l) files clang-formatted"
}

# forbid DIR REGEX WHY: no file under DIR includes a header matching REGEX.
forbid() {
  local dir=$1 regex=$2 why=$3 hits
  hits=$(git grep -nE "^#include [<\"]($regex)" -- "$dir" || true)
  if [ -n "$hits" ]; then
    echo "check-style: $dir: $why"
    echo "$hits" | sed 's/^/  /'
    return 1
  fi
}

check_layers() {
  local rc=0
  forbid common 'kernels/|server/|client/|grpc|google/protobuf|prometheus/|tokensel/v1/' \
    'common/ is the base of every layer and includes none of them' || rc=1
  forbid kernels 'server/|client/|grpc|google/protobuf|prometheus/|tokensel/v1/' \
    'kernels/ never sees gRPC, protobuf, prometheus or the server' || rc=1
  # Of common/, kernels/ uses only the header-only part (tokensel::common_headers).
  local common_hits
  common_hits=$(git grep -nE '^#include [<"]common/' -- kernels |
                grep -vE '"common/(status_macros|gpu_uuid)\.h"' || true)
  if [ -n "$common_hits" ]; then
    echo "check-style: kernels: of common/, only the header-only status_macros.h and gpu_uuid.h"
    echo "$common_hits" | sed 's/^/  /'
    rc=1
  fi
  forbid server/core 'grpc|google/protobuf|tokensel/v1/|server/(grpc|app|memory|backends)/' \
    'server/core is transport-free and knows no implementation of its seams' || rc=1
  forbid server/memory 'grpc|google/protobuf|tokensel/v1/|prometheus/|server/(grpc|app|backends)/' \
    'server/memory sees the core and the kernels only' || rc=1
  forbid server/backends 'grpc|google/protobuf|tokensel/v1/|prometheus/|server/(grpc|app|memory)/' \
    'server/backends sees the core and the kernels only' || rc=1
  forbid server/grpc 'server/(app|memory|backends)/|prometheus/' \
    'server/grpc is a front end: the composition root (server/app) wires the rest' || rc=1
  forbid client 'server/' 'clients never include the server' || rc=1
  [ $rc = 0 ] && echo "check-style: layers hold"
  return $rc
}

check_tidy() {
  local build=$1
  shift
  [ -f "$build/compile_commands.json" ] || {
    echo "check-style: $build/compile_commands.json missing (configure a preset first)"
    return 1
  }
  local files=("$@")
  if [ ${#files[@]} = 0 ]; then
    mapfile -t files < <(git ls-files -- 'common/*.cc' 'kernels/*.cc' 'server/core/*.cc' \
                           'server/memory/*.cc' 'server/backends/*.cc' |
                         while read -r f; do grep -q "\"file\": \"[^\"]*/$f\"" \
                           "$build/compile_commands.json" && echo "$f"; done)
  fi
  local out
  out=$(mktemp)
  # -j2: the machines this runs on have two cores.
  if ! printf '%s\n' "${files[@]}" |
       xargs -P "${TOKENSEL_TIDY_JOBS:-2}" -n 1 clang-tidy -p "$build" --quiet \
         --warnings-as-errors='*' >"$out" 2>&1; then
    grep -E '(warning|error):' "$out" | sort -u
    echo "check-style: clang-tidy found the above in ${#files[@]} files"
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
  echo "check-style: clang-tidy clean on ${#files[@]} files"
}

case "${1:-}" in
  format) check_format ;;
  layers) check_layers ;;
  tidy) shift; check_tidy "${1:?tidy needs the build directory}" "${@:2}" ;;
  fix) cxx_files | xargs clang-format -i ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
