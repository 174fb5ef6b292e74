#!/usr/bin/env python3
"""Control-plane changes against a running `tollgate run DIR` listening on 127.0.0.1:PORT.

Usage:
  control.py latency DIR PORT N     add N routes one at a time; print ms from each file write
                                    to the first request the new route answers (200)
  control.py routes DIR PORT N      N changes of one route (its path alternates); each waits
                                    until the new path answers; prints the elapsed ms
  control.py endpoints DIR N        N changes of an endpoint of svc-2 (a second EndpointSlice
                                    whose port alternates 19081/19082, both served by the
                                    backend); each waits GAP seconds (default 0.4)

Only 127.0.0.1 is ever contacted; every wait is bounded (10 s per change).
"""
import os
import socket
import sys
import time

TIMEOUT = 10.0


def status(port, host, path):
    """Status code of one GET over a fresh connection, 0 on a connection error."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
        return int(head.split(b" ", 2)[1])
    except (OSError, ValueError, IndexError):
        return 0


def wait_for(port, host, path, t0):
    while time.monotonic() - t0 < TIMEOUT:
        if status(port, host, path) == 200:
            return (time.monotonic() - t0) * 1000
        time.sleep(0.002)
    return float("inf")


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def route(name, host, path):
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  hostnames: ["{host}"]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]
    backendRefs: [{{name: svc-0, port: 80}}]
"""


def main():
    mode, d = sys.argv[1], sys.argv[2]
    # Files outside the watched tree first, then renamed in: one complete change each.
    if mode == "latency":
        port, n = int(sys.argv[3]), int(sys.argv[4])
        for k in range(n):
            host = f"new-{k}.example.com"
            text = route(f"new-{k}", host, f"/new/{k}")
            t0 = time.monotonic()
            write(os.path.join(d, f"new-{k}.yaml"), text)
            print(f"{wait_for(port, host, f'/new/{k}/x', t0):.1f}", flush=True)
            time.sleep(0.3)
    elif mode == "routes":
        port, n = int(sys.argv[3]), int(sys.argv[4])
        for k in range(n):
            path = f"/moving/{k % 2}"
            t0 = time.monotonic()
            write(os.path.join(d, "moving.yaml"), route("moving", "moving.example.com", path))
            print(f"{wait_for(port, 'moving.example.com', path + '/x', t0):.1f}", flush=True)
            time.sleep(0.05)
    elif mode == "endpoints":
        n = int(sys.argv[3])
        gap = float(os.environ.get("GAP", "0.4"))
        for k in range(n):
            write(os.path.join(d, "moving-endpoint.yaml"), f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-2-moving
  namespace: default
  labels: {{kubernetes.io/service-name: svc-2}}
addressType: IPv4
ports: [{{name: http, port: {19081 + k % 2}}}]
endpoints:
- addresses: ["127.0.0.1"]
""")
            time.sleep(gap)
        print(n)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
