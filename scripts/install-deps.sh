#!/usr/bin/env bash
# Installs the Debian 12 packages tokensel builds and tests with. Idempotent:
# when every package is already installed it changes nothing and needs no
# network. Nothing is downloaded outside apt; nothing is vendored.
#
#   scripts/install-deps.sh            # build + test dependencies
#   TOKENSEL_DEPS_DRY_RUN=1 scripts/install-deps.sh   # only list what is missing
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  openssl  # the TLS tests make their certificates with it (they fail without it)
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  prometheus-cpp-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  python3-torch python3-numpy python3-venv python3-pip
  python3-matplotlib  # examples/random_ltd_gpt plots its loss curves
  clang libclang-rt-14-dev
  clang-format clang-tidy  # the style gate (scripts/check-style.sh, ctest -L style)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
if [ "${TOKENSEL_DEPS_DRY_RUN:-0}" = 1 ]; then exit 0; fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
    echo "install-deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
