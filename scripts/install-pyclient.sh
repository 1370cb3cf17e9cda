#!/usr/bin/env bash
# Installs the Python client (client/python) with its test extra into a venv
# at .venv-client/, made from Debian's /usr/bin/python3 with
# --system-site-packages so it sees Debian's python3-torch and python3-numpy
# (scripts/install-deps.sh installs them). pip fetches grpcio, protobuf,
# pytest and, to build the stubs, grpcio-tools. Idempotent: when the venv was
# built from the same client sources and proto it changes nothing and needs
# no network.
#
#   scripts/install-pyclient.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-client
python=/usr/bin/python3
stamp="$venv/.sources.sha256"
want="$( (find client/python proto/tokensel -type f \
            \( -name '*.py' -o -name '*.toml' -o -name '*.proto' -o -name '*.md' \) \
            -not -path '*/build/*' -not -path '*.egg-info/*' -not -path '*/__pycache__/*' \
            -print0 | sort -z | xargs -0 sha256sum; echo "$python") | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "install-pyclient: $venv up to date"
  exit 0
fi

for mod in venv numpy torch; do
  if ! "$python" -c "import $mod" 2>/dev/null; then
    echo "install-pyclient: $python cannot import $mod; run scripts/install-deps.sh" >&2
    exit 1
  fi
done
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# pip rebuilds and reinstalls a local directory every time (fresh stubs).
"${pip[@]}" install --quiet "./client/python[test]"
rm -rf client/python/build client/python/src/*.egg-info
"$venv/bin/python" -c "import tokensel, tokensel.v1.tokensel_pb2_grpc; print('install-pyclient: tokensel', tokensel.__version__, 'in $venv')"
echo "$want" > "$stamp"
