#!/usr/bin/env bash
# Offline validation of everything under deploy/ and the Dockerfile, with the
# pinned tools of scripts/install-tools.sh (.venv-tools/). ctest runs each step
# as a test labelled "deploy" (deploy/CMakeLists.txt); no cluster, Docker
# engine or network is used.
#
#   scripts/validate-deploy.sh lint                  # yamllint + hadolint
#   scripts/validate-deploy.sh render                # kustomize each overlay, kubernetes-validate, wiring
#   scripts/validate-deploy.sh flags   SERVER_BIN    # manifest/Dockerfile flags and ports vs `SERVER_BIN --help`
#   scripts/validate-deploy.sh metrics SERVER_BIN    # alert/dashboard metric names vs a live server's /metrics
#   scripts/validate-deploy.sh all     [SERVER_BIN]  # all of the above (flags/metrics only with a binary)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# Kubernetes versions every rendered object must validate against: the oldest
# we support (native sidecar containers, gRPC probes) and the newest schema set.
k8s_versions=(1.29.0 1.37.0)
overlays=(daemonset sidecar)
# Kinds without a schema in kubernetes-validate (CRDs). They are not skipped
# silently: check_deploy.py refs checks their selectors, ports and paths.
crd_kinds_re='kind (ServiceMonitor|PodMonitor) with api version monitoring\.coreos\.com/v1'

tools="${TOKENSEL_TOOLS_VENV:-$root/.venv-tools}"
if [ ! -x "$tools/bin/kubectl" ] || [ ! -x "$tools/bin/kubernetes-validate" ]; then
  echo "validate-deploy: tools missing in $tools; run scripts/install-tools.sh" >&2
  exit 1
fi
py="$tools/bin/python"
check="$root/deploy/tools/check_deploy.py"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

lint() {
  echo "== yamllint (deploy/, .hadolint.yaml)"
  "$tools/bin/yamllint" --version
  "$tools/bin/yamllint" --strict -c deploy/yamllint.yaml deploy .hadolint.yaml
  echo "== hadolint Dockerfile"
  "$tools/bin/hadolint" --version
  "$tools/bin/hadolint" --config .hadolint.yaml Dockerfile
  echo "== JSON (deploy/grafana)"
  for f in deploy/grafana/*.json; do "$py" -m json.tool "$f" > /dev/null && echo "$f: valid JSON"; done
}

render() {
  "$tools/bin/kubectl" version --client
  for o in "${overlays[@]}"; do
    echo "== kubectl kustomize deploy/k8s/overlays/$o"
    "$tools/bin/kubectl" kustomize "deploy/k8s/overlays/$o" > "$out/$o.yaml"
    for v in "${k8s_versions[@]}"; do
      echo "-- kubernetes-validate --strict -k $v ($o)"
      "$tools/bin/kubernetes-validate" --strict -k "$v" "$out/$o.yaml" 2>&1 | tee "$out/$o-$v.log"
      # Any warning other than "no schema for our CRD kinds" fails the check.
      if grep -E '^(WARN|ERROR)' "$out/$o-$v.log" | grep -vE "$crd_kinds_re" | grep -q .; then
        echo "validate-deploy: $o does not validate against Kubernetes $v" >&2
        return 1
      fi
      grep -E "$crd_kinds_re" "$out/$o-$v.log" > /dev/null &&
        echo "   (ServiceMonitor: CRD, no schema in kubernetes-validate; wiring checked by check_deploy.py refs)"
    done
  done
  echo "== wiring: Service/ServiceMonitor/NetworkPolicy selectors and ports"
  for o in "${overlays[@]}"; do echo "-- $o"; "$py" "$check" refs "$out/$o.yaml"; done
}

rendered() { for o in "${overlays[@]}"; do echo "$out/$o.yaml"; done; }

flags() {
  local bin="$1"
  for o in "${overlays[@]}"; do "$tools/bin/kubectl" kustomize "deploy/k8s/overlays/$o" > "$out/$o.yaml"; done
  echo "== flags and ports vs $bin --help"
  # shellcheck disable=SC2046
  "$py" "$check" flags --server "$bin" --dockerfile Dockerfile $(rendered)
}

metrics() {
  local bin="$1"
  echo "== alert rules and dashboard vs /metrics of a live $bin (loopback)"
  "$py" "$check" metrics --server "$bin" deploy/prometheus/tokensel-rules.yaml deploy/grafana/tokensel-dashboard.json
}

step="${1:-all}"
case "$step" in
  lint) lint ;;
  render) render ;;
  flags) flags "${2:?usage: $0 flags SERVER_BIN}" ;;
  metrics) metrics "${2:?usage: $0 metrics SERVER_BIN}" ;;
  all)
    lint
    render
    if [ -n "${2:-}" ]; then flags "$2"; metrics "$2"; else
      echo "validate-deploy: no server binary given: flags and metrics checks not run"
    fi ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
