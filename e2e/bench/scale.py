#!/usr/bin/env python3
"""The control plane at scale, for scale.sh: ROUTES HTTPRoutes over NAMESPACES namespaces and
GATEWAYS Gateways on the loopback API server, one `tollgate controller` compiling them all and
one `tollgate-proxy` subscribed to the first Gateway.

Usage: scale.py KUBECONFIG STATE_FILE
Env (set by scale.sh): SCALE_PREFIX (names), SCALE_CLASS, SCALE_CONTROLLER_NAME,
  SCALE_LISTEN_PORT (the first Gateway's listener, served by the proxy), SCALE_METRICS_PORT
  (the controller's /metrics and /readyz), SCALE_CONTROLLER_PID, SCALE_CONTROLLER_CMD (a JSON
  list: how to start the controller again), SCALE_CONTROLLER_LOG, ROUTES (50000),
  NAMESPACES (1000), GATEWAYS (100), CHANGES (200: timed changes), CHURN (10000: further
  changes before memory is read again), GAP_MS (300: idle time before each timed change),
  THREADS (4: API connections creating objects), QUIET_S (10: after Ready, how long status
  writes are counted on restart).

Phases, each printing one line of figures:
  create   namespaces, one Service and EndpointSlice per namespace (its endpoint, 192.0.2.1,
           TEST-NET-1, is never contacted: nothing leaves loopback), Gateways (one in every
           NAMESPACES/GATEWAYS-th namespace, routes from all namespaces allowed), then the
           routes, ROUTES/NAMESPACES per namespace, each attached to the Gateway of its block
           of namespaces, with a hostname and a path match of its own;
  settle   until every route carries the controller's status (a watch on all HTTPRoutes);
           the controller's resident memory then;
  latency  CHANGES times: a timestamp, a server-side apply moving the probe route (attached to
           the first Gateway) to a new path with a RequestRedirect, then (a) GETs on the proxy
           every ~2 ms until the new path answers 302: change to served; (b) the watch event
           whose status has the new generation observed: change to status written;
  churn    CHURN changes to routes spread over every namespace and Gateway (a new path each),
           THREADS at a time, until every status observes its generation; resident memory
           again, and its change against the settle figure;
  restart  SIGTERM to the controller, the same command again: time from start to /readyz,
           then QUIET_S seconds more; status writes counted by the new controller
           (tollgate_controller_status_writes_total) and by the watch (HTTPRoute events
           changing a status) from its start to the end of the quiet period.
Exits non-zero when a phase cannot finish (not when a goal is missed: scale.sh compares).
"""
import concurrent.futures
import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kubeapi  # noqa: E402

GW = "/apis/gateway.networking.k8s.io/v1"
ENV = os.environ
PREFIX = ENV.get("SCALE_PREFIX", "scale")
ROUTES = int(ENV.get("ROUTES", "50000"))
NAMESPACES = int(ENV.get("NAMESPACES", "1000"))
GATEWAYS = int(ENV.get("GATEWAYS", "100"))
CHANGES = int(ENV.get("CHANGES", "200"))
CHURN = int(ENV.get("CHURN", "10000"))
GAP = float(ENV.get("GAP_MS", "300")) / 1000
THREADS = int(ENV.get("THREADS", "4"))
QUIET = float(ENV.get("QUIET_S", "10"))
POLL_LIMIT = 30.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


class Api:
    """One persistent HTTPS connection to the API server (one per thread)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.conn = None

    def connect(self, timeout=60):
        return self.endpoint.connect(timeout)

    def call(self, method, path, body=None, ctype="application/json"):
        for attempt in range(5):
            try:
                if self.conn is None:
                    self.conn = self.connect()
                headers = {"Accept": "application/json"}
                data = None
                if body is not None:
                    data = json.dumps(body).encode()
                    headers["Content-Type"] = ctype
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                if r.status == 429 or r.status >= 500:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                return r.status, raw
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt == 4:
                    raise
                time.sleep(0.2)
        return r.status, raw

    def apply(self, path, body):
        status, raw = self.call("PATCH", f"{path}?fieldManager={PREFIX}-bench&force=true", body,
                                "application/apply-patch+yaml")
        if status not in (200, 201):
            sys.exit(f"scale: applying {path}: HTTP {status}: {raw[:400]!r}")
        return json.loads(raw)


def ns_name(i):
    return f"{PREFIX}-{i:04d}"


def gw_of(i):
    """The Gateway (namespace, name) the routes of namespace i attach to."""
    per = max(1, NAMESPACES // GATEWAYS)
    g = min(i // per, GATEWAYS - 1)
    return ns_name(g * per), f"gw-{g:03d}"


def gateway(ns, name, port, cls):
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"gatewayClassName": cls,
                     "addresses": [{"type": "IPAddress", "value": "127.0.0.1"}],
                     "listeners": [{"name": "http", "port": port, "protocol": "HTTP",
                                    "allowedRoutes": {"namespaces": {"from": "All"}}}]}}


def route(i, j, version=0, redirect=False):
    ns = ns_name(i)
    gns, gname = gw_of(i)
    name = f"r-{j:03d}"
    rule = {"matches": [{"path": {"type": "PathPrefix", "value": f"/{name}/v{version}"}}]}
    if j % 3 == 2:
        rule["matches"][0]["headers"] = [{"name": "x-team", "value": f"t{j % 7}"}]
    if redirect:
        rule["filters"] = [{"type": "RequestRedirect",
                            "requestRedirect": {"hostname": "redirected.example", "statusCode": 302}}]
    else:
        rule["backendRefs"] = [{"name": "echo", "port": 80}]
    return ns, name, {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                      "metadata": {"name": name, "namespace": ns},
                      "spec": {"parentRefs": [{"name": gname, "namespace": gns}],
                               "hostnames": [f"{name}.{ns}.example"], "rules": [rule]}}


def pct(xs, p):
    k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


def summary(ms):
    ms = sorted(ms)
    if not ms:
        return "n=0"
    return (f"n={len(ms)} p50={pct(ms, 50):.0f}ms p90={pct(ms, 90):.0f}ms "
            f"p99={pct(ms, 99):.0f}ms max={ms[-1]:.0f}ms")


class Watch(threading.Thread):
    """Every HTTPRoute of the run: its generation and the generation its status from the
    controller observes; events that changed a status are counted."""

    def __init__(self, kc, controller_name):
        super().__init__(daemon=True)
        self.api = Api(kc)
        self.cn = controller_name
        self.lock = threading.Condition()
        self.observed = {}  # (ns, name) -> (generation, observed generation or None)
        self.status_events = 0
        self.status_at = {}  # (ns, name, observed generation) -> monotonic time first seen

    def status_of(self, o):
        best = None
        for p in (o.get("status") or {}).get("parents") or []:
            if p.get("controllerName") != self.cn:
                continue
            for c in p.get("conditions") or []:
                if c.get("type") == "Accepted":
                    g = c.get("observedGeneration")
                    best = g if best is None else min(best, g)
        return best

    def record(self, o, event):
        md = o["metadata"]
        if not md["namespace"].startswith(PREFIX + "-"):
            return
        key = (md["namespace"], md["name"])
        gen, obs = md.get("generation"), self.status_of(o)
        status = json.dumps(o.get("status"), sort_keys=True)
        with self.lock:
            before = self.observed.get(key)
            if event == "MODIFIED" and before is not None and before[2] != status:
                self.status_events += 1
            if event == "DELETED":
                self.observed.pop(key, None)
            else:
                self.observed[key] = (gen, obs, status)
                if obs is not None:
                    self.status_at.setdefault((key[0], key[1], obs), time.monotonic())
            self.lock.notify_all()

    def run(self):
        rv = None
        while True:
            if rv is None:
                cont = None
                while True:
                    q = "?limit=5000" + (f"&continue={cont}" if cont else "")
                    status, raw = self.api.call("GET", f"{GW}/httproutes{q}")
                    body = json.loads(raw)
                    for o in body.get("items", []):
                        self.record(o, "ADDED")
                    cont = body["metadata"].get("continue")
                    if not cont:
                        rv = body["metadata"]["resourceVersion"]
                        break
            conn = self.api.connect(timeout=None)
            try:
                conn.request("GET", f"{GW}/httproutes?watch=1&allowWatchBookmarks=true&resourceVersion={rv}",
                             headers={"Accept": "application/json"})
                r = conn.getresponse()
                if r.status != 200:
                    rv = None
                    continue
                for line in r:
                    ev = json.loads(line)
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    o = ev["object"]
                    rv = o["metadata"].get("resourceVersion", rv)
                    if ev["type"] != "BOOKMARK":
                        self.record(o, ev["type"])
            except (OSError, http.client.HTTPException, ValueError):
                pass
            finally:
                conn.close()

    def wait(self, pred, limit):
        deadline = time.monotonic() + limit
        with self.lock:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(min(left, 1.0))
        return True

    def caught_up(self, n):
        return len(self.observed) >= n and all(
            obs is not None and obs == gen for gen, obs, _ in self.observed.values())


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(port, name):
    """The samples of one counter: {labels: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            labels, value = line[len(name):].rsplit(" ", 1)
            if float(value):
                out[labels.strip() or "{}"] = float(value)
    return out


def ready(port):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200
    except OSError:
        return False


def parallel(kc, jobs):
    """Runs (path, body) applies on THREADS connections."""
    local = threading.local()

    def one(job):
        if not hasattr(local, "api"):
            local.api = Api(kc)
        local.api.apply(*job)

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        for _ in pool.map(one, jobs, chunksize=64):
            pass


def probe_get(conn_box, port, path):
    try:
        if conn_box[0] is None:
            conn_box[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn_box[0].request("GET", path, headers={"Host": f"r-000.{ns_name(0)}.example"})
        r = conn_box[0].getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException):
        conn_box[0] = None
        return None


def main():
    kc_path, state_file = sys.argv[1], sys.argv[2]
    kc = kubeapi.Endpoint(kc_path, "scale")
    api = Api(kc)
    cls, cn = ENV["SCALE_CLASS"], ENV["SCALE_CONTROLLER_NAME"]
    listen, mport = int(ENV["SCALE_LISTEN_PORT"]), int(ENV["SCALE_METRICS_PORT"])
    pid = int(ENV["SCALE_CONTROLLER_PID"])
    per_ns = ROUTES // NAMESPACES
    results = {}

    watch = Watch(kc, cn)
    watch.start()

    # ------------------------------------------------------------------ create
    t = time.monotonic()
    parallel(kc, [(f"/api/v1/namespaces/{ns_name(i)}",
                   {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns_name(i)}})
                  for i in range(NAMESPACES)])
    jobs = []
    for i in range(NAMESPACES):
        ns = ns_name(i)
        jobs.append((f"/api/v1/namespaces/{ns}/services/echo",
                     {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
                      "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}))
        jobs.append((f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/echo-1",
                     {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                      "metadata": {"name": "echo-1", "namespace": ns,
                                   "labels": {"kubernetes.io/service-name": "echo"}},
                      "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
                      "endpoints": [{"addresses": ["192.0.2.1"], "conditions": {"ready": True}}]}))
    gateways = sorted({gw_of(i) for i in range(NAMESPACES)})
    for k, (gns, gname) in enumerate(gateways):
        jobs.append((f"{GW}/namespaces/{gns}/gateways/{gname}",
                     gateway(gns, gname, listen if k == 0 else 8080, cls)))
    parallel(kc, jobs)
    routes = []
    for i in range(NAMESPACES):
        for j in range(per_ns):
            ns, name, body = route(i, j, redirect=(i == 0 and j == 0))
            routes.append((f"{GW}/namespaces/{ns}/httproutes/{name}", body))
    parallel(kc, routes)
    total = NAMESPACES * per_ns
    created = time.monotonic() - t
    print(f"create: {NAMESPACES} namespaces, {len(gateways)} Gateways, {total} HTTPRoutes "
          f"in {created:.0f}s", flush=True)

    # ------------------------------------------------------------------ settle
    if not watch.wait(lambda: watch.caught_up(total), 1800):
        sys.exit(f"scale: statuses not written within 30 min ({len(watch.observed)} routes seen)")
    settled = time.monotonic() - t
    time.sleep(5)
    results["rss_settled"] = rss_mb(pid)
    print(f"settle: every route's status written {settled:.0f}s after the first create; "
          f"controller rss {results['rss_settled']:.0f} MB", flush=True)

    # ------------------------------------------------------------------ latency
    box = [None]
    served, written, failed = [], [], 0
    ns0 = ns_name(0)
    for k in range(1, CHANGES + 1):
        path = f"/r-000/v{k}"
        if probe_get(box, listen, path) != 404:
            sys.exit(f"scale: {path} answered before its change")
        time.sleep(GAP)
        _, _, body = route(0, 0, version=k, redirect=True)
        t0 = time.monotonic()
        o = api.apply(f"{GW}/namespaces/{ns0}/httproutes/r-000", body)
        gen = o["metadata"]["generation"]
        got = None
        while time.monotonic() - t0 < POLL_LIMIT:
            if probe_get(box, listen, path) == 302:
                got = time.monotonic()
                break
            time.sleep(0.002)
        if got is None:
            failed += 1
        else:
            served.append((got - t0) * 1000)
        key = (ns0, "r-000", gen)
        if watch.wait(lambda: key in watch.status_at, POLL_LIMIT):
            written.append((watch.status_at[key] - t0) * 1000)
        else:
            failed += 1
    results["served"], results["written"] = sorted(served), sorted(written)
    print(f"latency: change -> served by the proxy {summary(served)}; change -> status written "
          f"{summary(written)}; failed {failed}", flush=True)

    # ------------------------------------------------------------------ churn
    t = time.monotonic()
    jobs = []
    for c in range(CHURN):
        i = (c * 7919) % NAMESPACES  # every namespace and Gateway, in a scattered order
        j = 1 + (c // NAMESPACES) % max(1, per_ns - 1)
        ns, name, body = route(i, j, version=1 + c // (NAMESPACES * max(1, per_ns - 1)))
        body["spec"]["rules"][0]["matches"][0]["path"]["value"] = f"/{name}/c{c}"
        jobs.append((f"{GW}/namespaces/{ns}/httproutes/{name}", body))
    parallel(kc, jobs)
    applied = time.monotonic() - t
    if not watch.wait(lambda: watch.caught_up(total), 1800):
        sys.exit("scale: statuses not caught up within 30 min of the churn")
    caught = time.monotonic() - t
    time.sleep(5)
    results["rss_churned"] = rss_mb(pid)
    growth = (results["rss_churned"] / results["rss_settled"] - 1) * 100
    print(f"churn: {CHURN} changes applied in {applied:.0f}s, every status caught up after "
          f"{caught:.0f}s; controller rss {results['rss_churned']:.0f} MB ({growth:+.1f}%)",
          flush=True)

    # ------------------------------------------------------------------ restart
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except OSError:
            break
        time.sleep(0.1)
    with watch.lock:
        events_before = watch.status_events
    out = open(ENV["SCALE_CONTROLLER_LOG"], "ab")
    t0 = time.monotonic()
    proc = subprocess.Popen(json.loads(ENV["SCALE_CONTROLLER_CMD"]), stdout=out, stderr=out,
                            stdin=subprocess.DEVNULL)
    open(state_file, "w").write(str(proc.pid))
    while not ready(mport):
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            sys.exit("scale: the restarted controller never became ready")
        time.sleep(0.05)
    to_ready = time.monotonic() - t0
    time.sleep(QUIET)
    by_kind = metric(mport, "tollgate_controller_status_writes_total")
    writes = sum(by_kind.values())
    with watch.lock:
        events = watch.status_events - events_before
    results["rss_restarted"] = rss_mb(proc.pid)
    results["to_ready"], results["restart_writes"], results["restart_events"] = to_ready, writes, events
    print(f"restart: start to Ready {to_ready:.1f}s; status writes from start to Ready+{QUIET:.0f}s: "
          f"{writes:.0f} counted by the controller {by_kind or ''}, {events} HTTPRoute status "
          f"changes seen by the watch; "
          f"controller rss {results['rss_restarted']:.0f} MB", flush=True)
    json.dump(results, open(state_file + ".json", "w"))


if __name__ == "__main__":
    main()
