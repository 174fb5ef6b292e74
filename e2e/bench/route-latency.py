#!/usr/bin/env python3
"""Time from applying an HTTPRoute (server-side apply through the API server) to a
tollgate-proxy serving it, for route-latency.sh.

Usage: route-latency.py KUBECONFIG NAMESPACE GATEWAY LISTENER_PORT STATE_DIR N BACKGROUND...

Talks to the API server over one persistent HTTPS connection (http.client + ssl with the
kubeconfig's client certificate files), so no kubectl start-up is in the figures. For each
BACKGROUND count (e.g. `1 1000`): makes sure that many background HTTPRoutes exist (each with
its own path, backendRef to Service `echo`, whose endpoint is never contacted), waits until
the proxy's last applied table (STATE_DIR/table.json) has them, then N times: timestamp, PATCH
(apply) a new HTTPRoute whose only rule is a PathPrefix match on a unique path with a
RequestRedirect filter, then GET that path on 127.0.0.1:LISTENER_PORT every ~2 ms (keep-alive)
until the proxy answers 302 (it answers 404 before the route is there). Latency = first 302
minus the timestamp taken just before the PATCH was sent. A poll gives up after 30 s (counted
as a failure). The measured routes are deleted after each scenario.

Why a redirect and not a backend answering 200: the API server refuses loopback EndpointSlice
addresses (127.0.0.0/8), and no traffic may leave loopback; the redirect is answered by the
proxy itself, which proves the route is in the table the proxy serves.
"""
import http.client
import json
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kubeapi  # noqa: E402

POLL_LIMIT = 30.0
POLL_SLEEP = 0.002
# Idle time before each change (env GAP_MS), so that each one meets a quiet controller: after
# a proxy ACKs, the controller waits one debounce period and runs a status pass, and a change
# arriving meanwhile waits for that pass before its own debounce starts.
GAP = float(os.environ.get("GAP_MS", "500")) / 1000
GROUP = "/apis/gateway.networking.k8s.io/v1"


class Api:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.conn = None

    def call(self, method, path, body=None, ctype="application/json"):
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = self.endpoint.connect()
                headers = {"Accept": "application/json"}
                data = None
                if body is not None:
                    data = json.dumps(body).encode()
                    headers["Content-Type"] = ctype
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                return r.status, raw
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def apply(self, ns, plural, name, body):
        path = f"{GROUP}/namespaces/{ns}/{plural}/{name}?fieldManager=route-latency&force=true"
        status, raw = self.call("PATCH", path, body, "application/apply-patch+yaml")
        if status not in (200, 201):
            sys.exit(f"route-latency: applying {ns}/{name}: HTTP {status}: {raw[:400]!r}")

    def delete(self, ns, plural, name):
        status, raw = self.call("DELETE", f"{GROUP}/namespaces/{ns}/{plural}/{name}")
        if status not in (200, 202, 404):
            sys.exit(f"route-latency: deleting {ns}/{name}: HTTP {status}: {raw[:400]!r}")


class Prober:
    """GET on the proxy listener over a keep-alive connection; reconnects on errors."""

    def __init__(self, port):
        self.port = port
        self.conn = None

    def status(self, path):
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            self.conn.request("GET", path, headers={"Host": "bench.example"})
            r = self.conn.getresponse()
            r.read()
            if r.getheader("connection", "").lower() == "close":
                self.conn.close()
                self.conn = None
            return r.status
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None


def route(ns, gw, name, path, backend=False):
    rule = {"matches": [{"path": {"type": "PathPrefix", "value": path}}]}
    if backend:
        rule["backendRefs"] = [{"name": "echo", "port": 80}]
    else:
        rule["filters"] = [{"type": "RequestRedirect",
                            "requestRedirect": {"hostname": "redirected.example", "statusCode": 302}}]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"name": gw}], "rules": [rule]}}


def pct(sorted_ms, p):
    """Nearest-rank percentile."""
    k = max(0, min(len(sorted_ms) - 1, math.ceil(p / 100 * len(sorted_ms)) - 1))
    return sorted_ms[k]


def table_routes(state_dir):
    """Names of the routes in the table the proxy last applied (its last-known-good file)."""
    try:
        t = json.load(open(os.path.join(state_dir, "table.json")))
    except (OSError, ValueError):
        return set()
    return {r["route"]["name"]
            for p in t.get("ports", []) for li in p.get("listeners", [])
            for vh in li.get("virtualHosts", []) for r in vh.get("routes", [])}


def wait_table(state_dir, name, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if name in table_routes(state_dir):
            return True
        time.sleep(0.1)
    return False


def measure(api, probe, ns, gw, tag, i):
    name = f"lat-{tag}-{i}"
    path = f"/lat-{tag}-{i}"
    first = probe.status(path)
    if first != 404:
        sys.exit(f"route-latency: {path} answered {first} before its route existed")
    body = route(ns, gw, name, path)
    time.sleep(GAP)
    t0 = time.monotonic()
    api.apply(ns, "httproutes", name, body)
    t_applied = time.monotonic()
    deadline = t0 + POLL_LIMIT
    while time.monotonic() < deadline:
        if probe.status(path) == 302:
            t1 = time.monotonic()
            return name, (t1 - t0) * 1000, (t_applied - t0) * 1000
        time.sleep(POLL_SLEEP)
    return name, None, (t_applied - t0) * 1000


def main():
    if len(sys.argv) < 8:
        sys.exit(__doc__)
    kc_path, ns, gw, port, state_dir, n = sys.argv[1:7]
    port, n = int(port), int(n)
    backgrounds = [int(b) for b in sys.argv[7:]]
    api = Api(kubeapi.Endpoint(kc_path, "route-latency"))
    probe = Prober(port)
    tag = f"{int(time.time()) % 100000}"
    have = 0
    ok = True
    for bg in backgrounds:
        t = time.monotonic()
        for j in range(have, bg):
            api.apply(ns, "httproutes", f"bg-{j}", route(ns, gw, f"bg-{j}", f"/bg-{j}/", backend=True))
        have = max(have, bg)
        if not wait_table(state_dir, f"bg-{have - 1}", 300):
            sys.exit(f"route-latency: the proxy's table never got bg-{have - 1} ({bg} background routes)")
        print(f"# {bg} background routes in the proxy's table "
              f"({time.monotonic() - t:.1f}s to create and push)", flush=True)
        stag = f"{tag}-{bg}"
        for w in range(3):  # warm-up, not counted
            name, _, _ = measure(api, probe, ns, gw, stag, f"w{w}")
            api.delete(ns, "httproutes", name)
        lat, api_ms, failed, names = [], [], 0, []
        for i in range(n):
            name, ms, a = measure(api, probe, ns, gw, stag, i)
            names.append(name)
            api_ms.append(a)
            if ms is None:
                failed += 1
                print(f"# {name}: not served within {POLL_LIMIT:.0f}s", flush=True)
            else:
                lat.append(ms)
        for name in names:
            api.delete(ns, "httproutes", name)
        load = open("/proc/loadavg").read().split()[:3]
        if not lat:
            print(f"background={bg} n=0/{n} (every change failed)")
            ok = False
            continue
        lat.sort()
        api_ms.sort()
        print(f"background={bg} n={len(lat)}/{n} failed={failed} "
              f"p50={pct(lat, 50):.0f}ms p90={pct(lat, 90):.0f}ms p99={pct(lat, 99):.0f}ms "
              f"max={lat[-1]:.0f}ms min={lat[0]:.0f}ms mean={statistics.mean(lat):.0f}ms | "
              f"apply round trip p50={pct(api_ms, 50):.0f}ms p99={pct(api_ms, 99):.0f}ms | "
              f"gap {GAP * 1000:.0f}ms | loadavg {' '.join(load)}", flush=True)
        ok = ok and failed == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
