#!/usr/bin/env python3
"""Writes a manifest directory with one Gateway and N HTTPRoutes for `tollgate run`.

Usage: gen-routes.py N DIR [--port 18080] [--backend-port 19080] [--endpoints 1]

Routes mix the shapes a real table has: a third match an exact path, a third a path prefix,
a third a path prefix plus a header; they spread over 100 hostnames, and point at 100
Services whose EndpointSlices list --endpoints loopback endpoints each (all on the backend
port, so one demo backend can answer them all). Deterministic: the same N gives the same files.
"""
import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("dir")
p.add_argument("--port", type=int, default=18080)
p.add_argument("--backend-port", type=int, default=19080)
p.add_argument("--endpoints", type=int, default=1)
a = p.parse_args()
os.makedirs(a.dir, exist_ok=True)

with open(os.path.join(a.dir, "gateway.yaml"), "w") as f:
    f.write(f"""apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tollgate}}
spec: {{controllerName: tollgate.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: bench, namespace: default}}
spec:
  gatewayClassName: tollgate
  addresses: [{{type: IPAddress, value: 127.0.0.1}}]
  listeners:
  - {{name: http, protocol: HTTP, port: {a.port}}}
""")

services = 100
with open(os.path.join(a.dir, "backends.yaml"), "w") as f:
    for s in range(services):
        f.write(f"""---
apiVersion: v1
kind: Service
metadata: {{name: svc-{s}, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-{s}-1
  namespace: default
  labels: {{kubernetes.io/service-name: svc-{s}}}
addressType: IPv4
ports: [{{name: http, port: {a.backend_port}}}]
endpoints:
""")
        for e in range(a.endpoints):
            # 127.0.0.1 first so a single demo backend answers; the rest are other loopback
            # addresses (127.x.y.z), never anything off the machine.
            ip = "127.0.0.1" if e == 0 else f"127.{(e >> 16) & 255}.{(e >> 8) & 255}.{e & 255 or 1}"
            f.write(f"- addresses: [\"{ip}\"]\n")

with open(os.path.join(a.dir, "routes.yaml"), "w") as f:
    for i in range(a.n):
        host = f"host-{i % 100}.example.com"
        kind = i % 3
        if kind == 0:
            match = f"{{path: {{type: Exact, value: /exact/{i}}}}}"
        elif kind == 1:
            match = f"{{path: {{type: PathPrefix, value: /prefix/{i}}}}}"
        else:
            match = (f"{{path: {{type: PathPrefix, value: /hdr/{i}}}, "
                     f"headers: [{{name: x-tenant, value: t{i}}}]}}")
        f.write(f"""---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: route-{i}, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  hostnames: ["{host}"]
  rules:
  - matches: [{match}]
    backendRefs: [{{name: svc-{i % services}, port: 80}}]
""")
print(f"wrote {a.n} routes to {a.dir}")
