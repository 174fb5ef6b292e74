#!/usr/bin/env python3
"""Time from creating an HTTPRoute (the POST returned) to the controller's status on it (as a
watch event), over N new routes created one after another, attached to Gateway `bench` in
namespace `default` (what `gen.py routes` makes) and pointing at Service svc-0.

Usage: status-latency.py N CONTROLLER_NAME
Env: TOLLGATE_CLUSTER_DIR (default ~/.cache/tollgate/cluster: its pki/ authenticates curl),
     TOLLGATE_APISERVER_PORT (default 6443). Prints p50/p90/p99/max in ms.
"""
import json, os, subprocess, sys, threading, time, statistics
P = os.path.join(os.environ.get("TOLLGATE_CLUSTER_DIR", os.path.expanduser("~/.cache/tollgate/cluster")), "pki")
PORT = os.environ.get("TOLLGATE_APISERVER_PORT", "6443")
BASE = f"https://127.0.0.1:{PORT}/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes"
CURL = ["curl", "-sS", "--cacert", f"{P}/ca.crt", "--cert", f"{P}/admin.crt", "--key", f"{P}/admin.key"]
n, cn = int(sys.argv[1]), sys.argv[2]
seen = {}
rv = json.loads(subprocess.check_output(CURL + [BASE + "?limit=1"]))["metadata"]["resourceVersion"]
w = subprocess.Popen(CURL + ["-N", f"{BASE}?watch=1&resourceVersion={rv}"], stdout=subprocess.PIPE, text=True)
def watch():
    for line in w.stdout:
        ev = json.loads(line)
        o = ev["object"]
        name = o["metadata"]["name"]
        ps = (o.get("status") or {}).get("parents") or []
        if name not in seen and any(p.get("controllerName") == cn for p in ps):
            seen[name] = time.monotonic()
threading.Thread(target=watch, daemon=True).start()
time.sleep(0.5)
sent = {}
tag = str(int(time.time()))
for i in range(n):
    name = f"lat-{tag}-{i}"
    body = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"parentRefs": [{"name": "bench"}], "hostnames": [f"lat-{i}.example.com"],
                     "rules": [{"backendRefs": [{"name": "svc-0", "port": 80}]}]}}
    subprocess.check_output(CURL + ["-X", "POST", "-H", "Content-Type: application/json", "-d", json.dumps(body), BASE])
    sent[name] = time.monotonic()
    deadline = time.monotonic() + 10
    while name not in seen and time.monotonic() < deadline:
        time.sleep(0.002)
lat = sorted((seen[k] - sent[k]) * 1000 for k in sent if k in seen)
print(f"n={len(lat)}/{n} p50={statistics.median(lat):.0f}ms p90={lat[int(len(lat)*0.9)-1]:.0f}ms p99={lat[max(0,int(len(lat)*0.99)-1)]:.0f}ms max={lat[-1]:.0f}ms")
w.kill()
