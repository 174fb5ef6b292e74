#!/usr/bin/env python3
"""The tracing test's driver (e2e/tracing-test.sh runs it): a real OpenTelemetry Collector
(OTLP receiver, file exporter) on loopback, `tollgate run` exporting to it over each OTLP
protocol, requests through an AuthPolicy and a RateLimitPolicy, and assertions on the spans
the collector wrote:

- a request with a sampled parent: its server span's parent is the client's span, the
  client span is the server span's child and the upstream's `traceparent` parent; the
  attributes (method, path, status, route, body size); the policy decisions as events;
- a refused request (no key): a server span with the `unauthenticated` event, no client span;
- requests with an unsampled parent: passed on with flag 00, nothing exported;
- requests without a parent at --trace-sampling 0.5: exactly the traces the upstream saw
  sampled are exported, and their number is within the binomial bound (mean +- 4.5 standard
  deviations: a false failure about once in 150,000 runs);
- the access log line of a sampled request names its trace id.

Usage: tracing-check.py TOLLGATE_BIN OTELCOL_BIN WORK_DIR
"""

import json
import math
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TOLLGATE, OTELCOL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
RATIO = 0.5
N_ROOT = 400
N_PARENT = 10
KEY = "alice-trace-key"


def log(msg):
    print(f"[tracing {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


def fail(msg):
    log(f"FAIL: {msg}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            fail(f"{what} exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    fail(f"{what} not listening on {port} after {timeout}s")


MANIFESTS = """
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tollgate}}
spec: {{controllerName: tollgate.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: traced, namespace: default}}
spec:
  gatewayClassName: tollgate
  addresses: [{{type: IPAddress, value: 127.0.0.1}}]
  listeners: [{{name: http, protocol: HTTP, port: {gw}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: orders, namespace: default}}
spec:
  parentRefs: [{{name: traced}}]
  rules:
  - backendRefs: [{{name: echo, port: 80}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {backend}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-local
  namespace: default
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{{name: http, port: {backend}, protocol: TCP}}]
endpoints: [{{addresses: ["127.0.0.1"], conditions: {{ready: true}}}}]
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: keys, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: orders}}]
  rules:
    authentication:
      api:
        apiKey:
          selector: {{matchLabels: {{app: traced}}}}
        credentials: {{customHeader: {{name: X-API-Key}}}}
---
apiVersion: v1
kind: Secret
metadata:
  name: alice
  namespace: default
  labels: {{app: traced, tollgate.dev/credential: "true"}}
stringData: {{api_key: {key}}}
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{name: quota, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: orders}}]
  limits:
    per-key:
      rates: [{{limit: 100000, window: 1m}}]
      counters: [{{expression: "request.headers['x-api-key']"}}]
"""

COLLECTOR = """
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: "127.0.0.1:{grpc}"}}
      http: {{endpoint: "127.0.0.1:{http}"}}
exporters:
  file: {{path: "{path}", flush_interval: 100ms}}
service:
  telemetry:
    metrics: {{level: none}}
    logs: {{level: warn}}
  pipelines:
    traces: {{receivers: [otlp], exporters: [file]}}
"""


def get(port, path, headers):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def upstream_traceparent(body):
    tp = json.loads(body)["headers"].get("traceparent")
    if tp is None:
        fail(f"the upstream got no traceparent: {body[:300]!r}")
    version, trace, parent, flags = tp.split("-")
    if version != "00":
        fail(f"traceparent {tp}")
    return trace, parent, flags


def spans(path):
    """Every span in the file exporter's output (one OTLP JSON document per line)."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            doc = json.loads(line)
            for rs in doc.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    out.extend(ss.get("spans", []))
    return out


def attrs(kvs):
    out = {}
    for kv in kvs or []:
        v = kv.get("value", {})
        if "stringValue" in v:
            out[kv["key"]] = v["stringValue"]
        elif "intValue" in v:
            out[kv["key"]] = int(v["intValue"])
        else:
            out[kv["key"]] = v
    return out


SERVER, CLIENT = 2, 3


def run_protocol(protocol, collector_grpc, collector_http, path):
    gw, backend, admin = free_port(), free_port(), free_port()
    d = os.path.join(WORK, f"manifests-{protocol}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "all.yaml"), "w", encoding="utf-8") as f:
        f.write(MANIFESTS.format(gw=gw, backend=backend, key=KEY))
    endpoint = f"http://127.0.0.1:{collector_grpc if protocol == 'grpc' else collector_http}"
    access = open(os.path.join(WORK, f"access-{protocol}.log"), "w", encoding="utf-8")
    proc = subprocess.Popen(
        [TOLLGATE, "run", d, "--demo-backend", f"127.0.0.1:{backend}", "--admin", f"127.0.0.1:{admin}",
         "--otlp-endpoint", endpoint, "--otlp-protocol", protocol, "--trace-sampling", str(RATIO)],
        stdout=access, stderr=subprocess.DEVNULL)
    try:
        wait_port(gw, proc, "tollgate run")
        wait_port(backend, proc, "the demo backend")
        check(protocol, gw, path)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        access.close()
    # The access log names a sampled request's trace id.
    with open(os.path.join(WORK, f"access-{protocol}.log"), encoding="utf-8") as f:
        lines = [json.loads(l) for l in f if l.startswith("{")]
    traced = [l for l in lines if l.get("trace_id")]
    if not traced or any(len(l["trace_id"]) != 32 for l in traced):
        fail(f"{protocol}: no access log line with a trace_id ({len(lines)} lines)")
    log(f"{protocol}: {len(traced)} of {len(lines)} access log lines carry a trace_id")


def check(protocol, gw, path):
    key = {"X-API-Key": KEY}
    # 1. Sampled parents.
    parents = {}
    for _ in range(N_PARENT):
        trace, span = secrets.token_hex(16), secrets.token_hex(8)
        status, body = get(gw, "/orders?n=1", {**key, "traceparent": f"00-{trace}-{span}-01"})
        if status != 200:
            fail(f"{protocol}: status {status}")
        up_trace, up_parent, flags = upstream_traceparent(body)
        if (up_trace, flags) != (trace, "01") or up_parent == span:
            fail(f"{protocol}: upstream traceparent {up_trace}-{up_parent}-{flags} for parent {trace}-{span}")
        parents[trace] = (span, up_parent, len(body))
    # 2. A refused request, sampled.
    refused_trace = secrets.token_hex(16)
    status, _ = get(gw, "/orders", {"traceparent": f"00-{refused_trace}-{secrets.token_hex(8)}-01"})
    if status != 401:
        fail(f"{protocol}: a request without a key got {status}")
    # 3. Unsampled parents.
    unsampled = set()
    for _ in range(N_PARENT):
        trace = secrets.token_hex(16)
        status, body = get(gw, "/orders", {**key, "traceparent": f"00-{trace}-{secrets.token_hex(8)}-00"})
        up_trace, _, flags = upstream_traceparent(body)
        if (up_trace, flags) != (trace, "00"):
            fail(f"{protocol}: an unsampled parent went upstream as {up_trace}-{flags}")
        unsampled.add(trace)
    # 4. New traces, sampled by ratio.
    roots = {}
    for _ in range(N_ROOT):
        status, body = get(gw, "/orders", key)
        if status != 200:
            fail(f"{protocol}: status {status}")
        trace, _, flags = upstream_traceparent(body)
        roots[trace] = flags == "01"
    kept = {t for t, s in roots.items() if s}
    expected = set(parents) | {refused_trace} | kept

    deadline = time.time() + 60
    while True:
        got = spans(path)
        seen = {s["traceId"] for s in got}
        if expected <= seen or time.time() > deadline:
            break
        time.sleep(0.2)
    missing = expected - seen
    if missing:
        fail(f"{protocol}: {len(missing)} traces never reached the collector, e.g. {sorted(missing)[:3]}")
    by_trace = {}
    for s in got:
        by_trace.setdefault(s["traceId"], []).append(s)

    for trace, (span, up_parent, size) in parents.items():
        ss = by_trace[trace]
        server = [s for s in ss if s["kind"] == SERVER]
        client = [s for s in ss if s["kind"] == CLIENT]
        if len(server) != 1 or len(client) != 1:
            fail(f"{protocol}: trace {trace}: {len(server)} server and {len(client)} client spans")
        server, client = server[0], client[0]
        if server.get("parentSpanId") != span:
            fail(f"{protocol}: server span parent {server.get('parentSpanId')}, client sent {span}")
        if client.get("parentSpanId") != server["spanId"]:
            fail(f"{protocol}: client span parent {client.get('parentSpanId')} is not the server span {server['spanId']}")
        if client["spanId"] != up_parent:
            fail(f"{protocol}: the upstream's parent {up_parent} is not the client span {client['spanId']}")
        a = attrs(server.get("attributes"))
        want = {"http.request.method": "GET", "url.path": "/orders", "url.query": "n=REDACTED",
                "http.response.status_code": 200, "tollgate.route": "default/orders",
                "http.response.body.size": size}
        for k, v in want.items():
            if a.get(k) != v:
                fail(f"{protocol}: server span {k} = {a.get(k)!r}, want {v!r} ({a})")
        events = [(e["name"], attrs(e.get("attributes"))) for e in server.get("events", [])]
        decided = [(x["tollgate.policy"], x["tollgate.policy.rule"], x["tollgate.policy.outcome"])
                   for n, x in events if n == "policy.decision"]
        if decided != [("default/keys", "authentication.api", "authenticated"),
                       ("default/quota", "limits.per-key", "allowed")]:
            fail(f"{protocol}: policy events {decided}")
        ca = attrs(client.get("attributes"))
        if ca.get("http.response.status_code") != 200 or ca.get("server.address") != "127.0.0.1":
            fail(f"{protocol}: client span attributes {ca}")

    refused = by_trace[refused_trace]
    if [s["kind"] for s in refused] != [SERVER]:
        fail(f"{protocol}: the refused request's spans: {[s['kind'] for s in refused]}")
    outcomes = [attrs(e.get("attributes")).get("tollgate.policy.outcome") for e in refused[0].get("events", [])]
    if outcomes != ["unauthenticated"]:
        fail(f"{protocol}: the refused request's events {outcomes}")

    leaked = unsampled & seen
    if leaked:
        fail(f"{protocol}: unsampled traces exported: {sorted(leaked)[:3]}")
    exported_roots = {t for t in roots if t in seen}
    if exported_roots != kept:
        fail(f"{protocol}: exported {len(exported_roots)} new traces, the upstream saw {len(kept)} sampled "
             f"(differ: {sorted(exported_roots ^ kept)[:3]})")
    for t in kept:
        server = [s for s in by_trace[t] if s["kind"] == SERVER]
        if len(server) != 1 or server[0].get("parentSpanId"):
            fail(f"{protocol}: new trace {t}: its server span is not one root span")
    mean = N_ROOT * RATIO
    bound = 4.5 * math.sqrt(N_ROOT * RATIO * (1 - RATIO))
    if abs(len(kept) - mean) > bound:
        fail(f"{protocol}: {len(kept)} of {N_ROOT} new traces sampled at ratio {RATIO}: outside {mean} +- {bound:.1f}")
    log(f"{protocol}: ok: {N_PARENT} parents kept, refusal and decisions as events, "
        f"{len(kept)} of {N_ROOT} new traces sampled (bound {mean} +- {bound:.1f}), none of {N_PARENT} unsampled exported")


def main():
    grpc, http = free_port(), free_port()
    for protocol in ["grpc", "http"]:
        path = os.path.join(WORK, f"spans-{protocol}.jsonl")
        conf = os.path.join(WORK, f"collector-{protocol}.yaml")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(COLLECTOR.format(grpc=grpc, http=http, path=path))
        col_log = open(os.path.join(WORK, f"collector-{protocol}.log"), "w", encoding="utf-8")
        col = subprocess.Popen([OTELCOL, "--config", conf], stdout=col_log, stderr=subprocess.STDOUT)
        try:
            wait_port(grpc, col, "the collector (gRPC)")
            wait_port(http, col, "the collector (HTTP)")
            run_protocol(protocol, grpc, http, path)
        finally:
            col.terminate()
            col.wait(timeout=30)
            col_log.close()
    log("PASS")


if __name__ == "__main__":
    main()
