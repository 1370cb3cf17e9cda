#!/usr/bin/env python3
"""Cross-checks of the deploy files that no schema catches (run by
scripts/validate-deploy.sh, from the .venv-tools python: needs only PyYAML).

  check_deploy.py refs    RENDERED.yaml...         Service/ServiceMonitor/NetworkPolicy wiring
  check_deploy.py flags   --server BIN | --help-file F   [--dockerfile F] RENDERED.yaml...
  check_deploy.py metrics --server BIN | --metrics-file F  RULES.yaml DASHBOARD.json

flags:   every flag a tokensel container (or the Dockerfile CMD) passes exists in
         `tokensel-server --help`; every containerPort / EXPOSE is a port the
         server is told to listen on and every TCP address has a declared port;
         TCP listeners have TLS + token flags or --insecure_tcp=true;
         gRPC probes hit a gRPC TCP listener; unix sockets are on a mounted
         volume and clients' unix:// addresses name the server's socket.
metrics: every tokensel_* metric (and label) the alert rules and the dashboard
         use exists in the /metrics of a real server started on loopback.
Exit status 1 with one line per problem.
"""
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

PROBLEMS = []
GRPC_CODES = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED"}


def problem(msg):
    PROBLEMS.append(msg)
    print(f"FAIL {msg}")


def load_objects(paths):
    objs = []
    for path in paths:
        with open(path) as f:
            objs += [(path, o) for o in yaml.safe_load_all(f) if o]
    return objs


def pod_specs(objs):
    """(where, pod labels, pod spec) for every workload."""
    for path, o in objs:
        kind, spec = o["kind"], o.get("spec", {})
        where = f"{path}: {kind}/{o['metadata']['name']}"
        if kind == "Pod":
            yield where, o["metadata"].get("labels", {}), spec
        elif kind in ("DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"):
            t = spec["template"]
            yield where, t["metadata"].get("labels", {}), t["spec"]
        elif kind == "CronJob":
            t = spec["jobTemplate"]["spec"]["template"]
            yield where, t["metadata"].get("labels", {}), t["spec"]


def containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def is_server(c):
    """A container that runs tokensel-server (its image, entrypoint kept)."""
    return "tokensel-server" in c.get("image", "") and "command" not in c


def parse_args(args):
    flags = []
    for a in args:
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", a)
        if not m:
            problem(f"argument {a!r} is not --flag=value")
            continue
        flags.append((m.group(1), m.group(2)))
    return flags


def tcp_port(address):
    m = re.fullmatch(r"(?:\[[^\]]*\]|[^:/]*):(\d+)", address)
    return int(m.group(1)) if m else None


def help_flags(server, help_file):
    if help_file:
        text = open(help_file).read()
    else:  # absl exits 1 after --help; the text is what matters
        r = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=30)
        text = r.stdout + r.stderr
    flags = set(re.findall(r"^\s+--([A-Za-z0-9_]+) ", text, re.M))
    if "listen" not in flags:
        problem(f"no --listen in --help output; not tokensel-server? first lines: {text[:200]!r}")
    return flags


def check_server_args(where, args, known):
    """Returns (tcp grpc ports, metrics port, unix socket paths)."""
    grpc_ports, unix_paths, metrics_port = set(), set(), 9464  # server default
    parsed = parse_args(args)
    for name, value in parsed:
        if name not in known:
            problem(f"{where}: --{name} is not a tokensel-server flag (--help)")
            continue
        if name == "listen":
            for addr in (value or "").split(","):
                if addr.startswith("unix:"):
                    unix_paths.add(re.sub(r"^unix:(//)?", "", addr))
                elif tcp_port(addr) is None:
                    problem(f"{where}: --listen={addr} has no numeric port")
                else:
                    grpc_ports.add(tcp_port(addr))
        elif name == "metrics_address":
            metrics_port = tcp_port(value) if value else None
            if value and metrics_port is None:
                problem(f"{where}: --metrics_address={value} has no numeric port")
    if not any(n == "listen" for n, _ in parsed):
        unix_paths.add("/run/tokensel/tokensel.sock")  # the server's default
    # The server refuses a TCP listener without TLS + token unless --insecure_tcp.
    given = {n: v for n, v in parsed}
    secure = all(given.get(f) for f in ("tls_cert", "tls_key", "auth_token_file"))
    insecure = "insecure_tcp" in given and given["insecure_tcp"] in (None, "true", "1")
    if grpc_ports and not secure and not insecure:
        problem(f"{where}: TCP --listen without --tls_cert, --tls_key and --auth_token_file "
                f"needs --insecure_tcp=true (tokensel-server refuses to start otherwise)")
    return grpc_ports, metrics_port, unix_paths


def check_flags(objs, known, dockerfile):
    servers = 0
    for where, _, spec in pod_specs(objs):
        volumes_by_container = {}
        sockets = set()
        for c in containers(spec):
            volumes_by_container[c["name"]] = [m["mountPath"] for m in c.get("volumeMounts", [])]
        for c in containers(spec):
            if not is_server(c):
                continue
            servers += 1
            cw = f"{where} container {c['name']}"
            grpc_ports, metrics_port, unix_paths = check_server_args(cw, c.get("args", []), known)
            sockets |= unix_paths
            listened = grpc_ports | ({metrics_port} if metrics_port else set())
            declared = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            for port in declared:
                if port not in listened:
                    problem(f"{cw}: containerPort {port} is not a port the server listens on {sorted(listened)}")
            for port in listened:
                if port not in declared:
                    problem(f"{cw}: the server listens on {port} but no containerPort declares it")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(probe)
                if p is None:
                    problem(f"{cw}: no {probe}")
                    continue
                if "grpc" not in p:
                    problem(f"{cw}: {probe} is not a native gRPC probe")
                    continue
                if p["grpc"]["port"] not in grpc_ports:
                    problem(f"{cw}: {probe} port {p['grpc']['port']} is not a gRPC TCP --listen port {sorted(grpc_ports)}")
                svc = p["grpc"].get("service", "")
                if svc not in ("", "tokensel.v1.TokenSelect"):
                    problem(f"{cw}: {probe} asks health of unknown service {svc!r}")
            for path in unix_paths:
                if not any(path.startswith(m.rstrip("/") + "/") for m in volumes_by_container[c["name"]]):
                    problem(f"{cw}: socket {path} is not on a mounted volume")
        # Clients in the same pod must name one of the server's sockets.
        for c in containers(spec):
            for e in c.get("env", []):
                v = str(e.get("value", ""))
                if v.startswith("unix:") and sockets and re.sub(r"^unix:(//)?", "", v) not in sockets:
                    problem(f"{where} container {c['name']}: {e['name']}={v} is not a server socket {sorted(sockets)}")
                if v.startswith("unix:"):
                    path = re.sub(r"^unix:(//)?", "", v)
                    if not any(path.startswith(m.rstrip("/") + "/") for m in volumes_by_container[c["name"]]):
                        problem(f"{where} container {c['name']}: socket {path} is not on a mounted volume")
    if servers == 0:
        problem("no tokensel-server container found in the rendered manifests")
    if dockerfile:
        text = open(dockerfile).read()
        cmd = re.search(r"^CMD\s+(\[.*\])\s*$", text, re.M)
        exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.*)$", text, re.M) for p in line.split()}
        if not cmd:
            problem(f"{dockerfile}: no exec-form CMD")
        else:
            grpc_ports, metrics_port, _ = check_server_args(dockerfile, json.loads(cmd.group(1)), known)
            listened = grpc_ports | ({metrics_port} if metrics_port else set())
            if exposed != listened:
                problem(f"{dockerfile}: EXPOSE {sorted(exposed)} != ports the CMD listens on {sorted(listened)}")
    return servers


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_refs(objs):
    pods = list(pod_specs(objs))
    services = [o for _, o in objs if o["kind"] == "Service"]
    for svc in services:
        name = svc["metadata"]["name"]
        chosen = [(w, spec) for w, labels, spec in pods if selects(svc["spec"].get("selector"), labels)]
        if not chosen:
            problem(f"Service/{name}: selector {svc['spec'].get('selector')} matches no pod template")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for w, spec in chosen:
                ports = [p for c in containers(spec) for p in c.get("ports", [])]
                if not any(target in (p.get("name"), p["containerPort"]) for p in ports):
                    problem(f"Service/{name} port {port['name']}: targetPort {target} not declared by {w}")
    for _, o in objs:
        if o["kind"] in ("ServiceMonitor", "PodMonitor"):
            if o["apiVersion"] != "monitoring.coreos.com/v1":
                problem(f"{o['kind']}/{o['metadata']['name']}: apiVersion {o['apiVersion']}")
            sel = o["spec"].get("selector", {}).get("matchLabels", {})
            if o["kind"] == "ServiceMonitor":
                targets = [s for s in services if selects(sel, s["metadata"].get("labels", {}))]
                names = {p.get("name") for s in targets for p in s["spec"]["ports"]}
                endpoints = o["spec"].get("endpoints", [])
            else:
                targets = [w for w, labels, _ in pods if selects(sel, labels)]
                names = {p.get("name") for _, labels, spec in pods if selects(sel, labels)
                         for c in containers(spec) for p in c.get("ports", [])}
                endpoints = o["spec"].get("podMetricsEndpoints", [])
            if not targets:
                problem(f"{o['kind']}/{o['metadata']['name']}: selector {sel} matches nothing")
            if not endpoints:
                problem(f"{o['kind']}/{o['metadata']['name']}: no endpoints")
            for ep in endpoints:
                allowed = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}
                if set(ep) - allowed:
                    problem(f"{o['kind']}/{o['metadata']['name']}: unchecked endpoint keys {set(ep) - allowed}")
                if ep.get("port") not in names:
                    problem(f"{o['kind']}/{o['metadata']['name']}: port {ep.get('port')!r} not in {sorted(names)}")
                if ep.get("path", "/metrics") != "/metrics":
                    problem(f"{o['kind']}/{o['metadata']['name']}: path {ep['path']} is not /metrics")
        if o["kind"] == "NetworkPolicy":
            chosen = [spec for _, labels, spec in pods
                      if selects(o["spec"]["podSelector"].get("matchLabels", {}), labels)]
            if not chosen:
                problem(f"NetworkPolicy/{o['metadata']['name']}: podSelector matches no pod template")
            names = {p.get("name") for spec in chosen for c in containers(spec) for p in c.get("ports", [])}
            for rule in o["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    if isinstance(p["port"], str) and p["port"] not in names:
                        problem(f"NetworkPolicy/{o['metadata']['name']}: port {p['port']} not declared")


def scrape(server):
    """Starts the server on a temp unix socket + loopback metrics; returns /metrics text."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [server, f"--listen=unix://{tmp}/tokensel.sock", "--metrics_address=127.0.0.1:0",
             "--backend=cpu", "--threads=1", "--log_level=warning"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            url = None
            while time.time() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                m = re.search(r"metrics on (http://\S+/metrics)", line)
                if m:
                    url = m.group(1)
                    break
            if not url:
                proc.kill()
                raise SystemExit(f"FAIL server printed no metrics address; stderr: {proc.stderr.read()[-2000:]}")
            poke(f"unix://{tmp}/tokensel.sock")
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode()
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def poke(address):
    """Two RPCs with empty (valid proto3) messages, so that the per-RPC series
    exist: prometheus-cpp prints a labelled family only once it has a series.
    GetServerInfo answers OK; SortTokens without tensors INVALID_ARGUMENT."""
    import grpc  # pinned in deploy/tools/requirements.txt

    with grpc.insecure_channel(address) as channel:
        for method, want in (("GetServerInfo", grpc.StatusCode.OK),
                             ("SortTokens", grpc.StatusCode.INVALID_ARGUMENT)):
            call = channel.unary_unary(f"/tokensel.v1.TokenSelect/{method}",
                                       request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=10)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            print(f"metrics: {method}({{}}) -> {code.name}")
            if code != want:
                problem(f"{method} with an empty request returned {code.name}, expected {want.name}")


def parse_metrics(text):
    types, labels = {}, {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? ", line)
        if m:
            labels.setdefault(m.group(1), set()).update(re.findall(r'([A-Za-z_]\w*)="', m.group(2) or ""))
    return types, labels


def check_expr(where, expr, types, labels):
    """tokensel_* names in a PromQL expression exist; so do their labels."""
    used = 0
    for m in re.finditer(r"\b(tokensel_[a-z0-9_]+)(\{[^}]*\})?", expr):
        name, matchers = m.group(1), m.group(2) or ""
        used += 1
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in types:
            family = name
        elif base in types and types[base] in ("histogram", "summary") and base != name:
            family = base
        else:
            problem(f"{where}: metric {name} is not exported by tokensel-server (/metrics)")
            continue
        known = set()
        for series, names in labels.items():
            if series == family or re.fullmatch(re.escape(family) + r"_(bucket|sum|count)", series):
                known |= names
        if family not in labels and not any(s.startswith(family + "_") for s in labels):
            continue  # declared but no series yet (e.g. RPC metrics before any RPC): names only
        for value in re.findall(r'code\s*(?:=~|!~|!=|=)\s*"([^"]*)"', matchers):
            for code in value.split("|"):
                if code not in GRPC_CODES:
                    problem(f"{where}: code {code!r} is not a gRPC status code name")
        for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers):
            if label not in known | {"job", "instance"}:
                problem(f"{where}: {name} has no label {label!r} (has {sorted(known)})")
    for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr):
        for label in [x.strip() for x in m.group(1).split(",") if x.strip()]:
            everywhere = set().union(*labels.values()) | {"job", "instance", "le", "namespace", "pod"}
            if label not in everywhere:
                problem(f"{where}: grouping label {label!r} exists on no tokensel series")
    return used


def check_metrics(text, rules_path, dashboard_path):
    types, labels = parse_metrics(text)
    tokensel = sorted(n for n in types if n.startswith("tokensel_"))
    print(f"metrics: the server exports {len(tokensel)} tokensel families: {', '.join(tokensel)}")
    rules = yaml.safe_load(open(rules_path))
    used = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            where = f"{rules_path}: {rule.get('alert') or rule.get('record')}"
            if not re.fullmatch(r"(\d+[smhdwy])+", str(rule.get("for", "0s"))):
                problem(f"{where}: bad 'for' duration {rule.get('for')!r}")
            if "alert" in rule:
                if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
                    problem(f"{where}: labels.severity must be critical|warning|info")
                if not rule.get("annotations", {}).get("summary"):
                    problem(f"{where}: no annotations.summary")
            expr = rule["expr"]
            if expr.count("(") != expr.count(")"):
                problem(f"{where}: unbalanced parentheses")
            for name in set(re.findall(r"\b([a-z_:][a-z0-9_:]*)\s*\{", expr)):
                if not name.startswith("tokensel_") and name != "up":
                    problem(f"{where}: metric {name} is neither tokensel's nor Prometheus' up")
            used += check_expr(where, expr, types, labels)
    dash = json.load(open(dashboard_path))
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            used += check_expr(f"{dashboard_path}: panel {panel['title']!r}", target["expr"], types, labels)
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            used += check_expr(f"{dashboard_path}: variable {var['name']}", var["definition"], types, labels)
    print(f"metrics: checked {used} metric references in {rules_path} and {dashboard_path}")


def main(argv):
    cmd, rest = argv[1], argv[2:]
    opts = {}
    while rest and rest[0].startswith("--"):
        opts[rest[0][2:]] = rest[1]
        rest = rest[2:]
    if cmd == "refs":
        check_refs(load_objects(rest))
    elif cmd == "flags":
        known = help_flags(opts.get("server"), opts.get("help-file"))
        n = check_flags(load_objects(rest), known, opts.get("dockerfile"))
        print(f"flags: {n} tokensel-server containers checked against {len(known)} flags in --help")
    elif cmd == "metrics":
        text = open(opts["metrics-file"]).read() if "metrics-file" in opts else scrape(opts["server"])
        check_metrics(text, rest[0], rest[1])
    else:
        raise SystemExit(__doc__)
    if PROBLEMS:
        print(f"{cmd}: {len(PROBLEMS)} problem(s)")
        return 1
    print(f"{cmd}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
