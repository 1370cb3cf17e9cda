#!/usr/bin/env bash
# Builds the Python client's sdist and wheel with `python -m build` and
# installs that wheel at both ends of the dependency range the package
# declares, for the ctest entries client_python_pytest_{newest,oldest}
# (label pyclient-ends):
#
#   .venv-client-newest/  /usr/bin/python3, no system site packages: the
#       newest grpcio, protobuf, numpy and pytest on PyPI, installed first and
#       without regard to tokensel's requirements; no torch, no cuda-bindings.
#       Also holds `build` and the built dist/ (sdist + wheel).
#   .venv-client-oldest/  /usr/bin/python3 with --system-site-packages
#       (Debian 12's numpy and torch, as a Debian user has them) and the
#       lowest grpcio and protobuf that pyproject.toml allows, read from it.
#
# The wheel goes in with --no-index: every requirement must already be met by
# what is installed, so a requirement that excludes either end (an upper pin,
# a raised lower bound) fails here rather than being resolved around.
# /usr/bin/python3 rather than a pyenv one: it is what a clean Debian 12 CI
# machine has. Idempotent: when both venvs were built from the same client
# sources, proto and this script, it changes nothing and needs no network.
#
#   scripts/install-pyclient-ends.sh
set -euo pipefail
cd "$(dirname "$0")/.."

python=/usr/bin/python3
newest=.venv-client-newest
oldest=.venv-client-oldest
stamp_of() { echo "$1/.sources.sha256"; }
want="$( (find client/python proto/tokensel -type f \
            \( -name '*.py' -o -name '*.toml' -o -name '*.proto' -o -name '*.md' \) \
            -not -path '*/build/*' -not -path '*.egg-info/*' -not -path '*/__pycache__/*' \
            -print0 | sort -z | xargs -0 sha256sum; sha256sum scripts/install-pyclient-ends.sh; echo "$python") \
         | sha256sum | cut -d' ' -f1)"

up_to_date() {
  [ -f "$(stamp_of "$1")" ] && [ "$(cat "$(stamp_of "$1")")" = "$want" ] && [ -x "$1/bin/python" ]
}
if up_to_date "$newest" && up_to_date "$oldest"; then
  echo "install-pyclient-ends: $newest and $oldest up to date"
  exit 0
fi
start=$SECONDS

# The lowest pins, from pyproject.toml's own lower bounds (grpcio>=X -> ==X).
oldest_pins="$("$python" - <<'EOF'
import re, tomllib
deps = tomllib.load(open("client/python/pyproject.toml", "rb"))["project"]["dependencies"]
for name in ("grpcio", "protobuf"):
    lows = [m.group(1) for d in deps if re.split(r"[\s<>=!~;\[]", d, 1)[0] == name
            for m in [re.search(r">=\s*([\w.]+)", d)] if m]
    if len(lows) != 1:
        raise SystemExit("install-pyclient-ends: no single %s>=X in %s" % (name, deps))
    print("%s==%s" % (name, lows[0]))
EOF
)"

fresh_venv() {  # fresh_venv DIR [venv flags...]
  rm -rf "$1"
  "$python" -m venv "${@:2}" "$1"
}
pip() { "$1/bin/python" -m pip --disable-pip-version-check --quiet "${@:2}"; }
check_tokensel() {  # pip check, for tokensel's requirements (Debian's own
  # system packages are not all consistent: pygobject without pycairo)
  local broken
  broken="$("$1/bin/python" -m pip --disable-pip-version-check check | grep '^tokensel ' || true)"
  if [ -n "$broken" ]; then echo "install-pyclient-ends: $1: $broken" >&2; exit 1; fi
}

# Newest end: current releases first, then the wheel built here.
fresh_venv "$newest"
pip "$newest" install --upgrade grpcio protobuf numpy pytest build
"$newest/bin/python" -m build --outdir "$newest/dist" client/python >"$newest/build.log" 2>&1 ||
  { cat "$newest/build.log" >&2; exit 1; }
rm -rf client/python/build client/python/src/*.egg-info
wheel="$(ls "$newest"/dist/tokensel-*-py3-none-any.whl)"
before="$(pip "$newest" freeze)"
pip "$newest" install --no-index "$wheel[test]" ||
  { echo "install-pyclient-ends: $wheel excludes the newest releases (an upper pin?)" >&2; exit 1; }
check_tokensel "$newest"
if [ "$(pip "$newest" freeze --exclude tokensel)" != "$before" ]; then
  echo "install-pyclient-ends: installing tokensel changed $newest's packages:" >&2
  diff <(echo "$before") <(pip "$newest" freeze --exclude tokensel) >&2 || true
  exit 1
fi
"$newest/bin/python" -c "import importlib.util as u, tokensel
assert u.find_spec('torch') is None and u.find_spec('cuda') is None"

# Oldest end: the lowest pins, Debian's numpy and torch, the same wheel.
fresh_venv "$oldest" --system-site-packages
# shellcheck disable=SC2086  # one pin per word
pip "$oldest" install $oldest_pins pytest
pip "$oldest" install --no-index "$wheel[torch,test]" ||
  { echo "install-pyclient-ends: $wheel excludes $oldest_pins or Debian's numpy/torch" >&2; exit 1; }
check_tokensel "$oldest"

for venv in "$newest" "$oldest"; do
  "$venv/bin/python" -c "import grpc, google.protobuf as p, tokensel.v1.tokensel_pb2_grpc
print('install-pyclient-ends: $venv: grpcio', grpc.__version__, 'protobuf', p.__version__)"
  echo "$want" > "$(stamp_of "$venv")"
done
echo "install-pyclient-ends: built and installed in $((SECONDS - start)) s"
