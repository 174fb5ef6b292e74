#!/usr/bin/env python3
"""Writes the same route configuration for every contender of the benchmark.

Usage: gen-configs.py SCENARIO DIR --cert PEM --key PEM

SCENARIO is `one` (one catch-all route), `routes10k` (the 10k HTTPRoutes of gen-routes.py)
or `https` (the one route behind TLS termination). DIR receives:
  manifests/         Gateway API manifests (compiled with `tollgate compile` for tollgate-proxy)
  nginx.conf         nginx: server_name per hostname, a location per path match
  haproxy.cfg (+ .map files)  HAProxy: maps for exact and prefix paths, ACLs for header matches
  request            the Host header, path and extra header the load generator sends

Every contender listens on 127.0.0.1 only, forwards to the backend on 127.0.0.1:19080 over
pooled keep-alive connections, and does the same per-request work Tollgate does by default:
X-Forwarded-For/-Proto/-Host, a fresh X-Request-Id sent upstream and returned to the client,
no access log.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = "127.0.0.1:19080"
PORTS = {  # contender: (http, https)
    "tollgate": (18080, 18443),
    "nginx": (18081, 18444),
    "haproxy": (18082, 18445),
}
HOST = "bench.example.test"

p = argparse.ArgumentParser()
p.add_argument("scenario", choices=["one", "routes10k", "https"])
p.add_argument("dir")
p.add_argument("--cert", required=True)
p.add_argument("--key", required=True)
a = p.parse_args()
tls = a.scenario == "https"
man = os.path.join(a.dir, "manifests")
os.makedirs(man, exist_ok=True)
cert_pem = open(a.cert).read()
key_pem = open(a.key).read()


def indent(text, n):
    return "".join(" " * n + line + "\n" for line in text.strip("\n").split("\n"))


# ---------------------------------------------------------------- routes (one model, three outputs)
# Each route: (host or None, kind, path, header value or None, service index)
routes = []
if a.scenario == "routes10k":
    n = 10000
    subprocess.run([sys.executable, os.path.join(HERE, "gen-routes.py"), str(n), man,
                    "--port", str(PORTS["tollgate"][0]), "--backend-port", "19080"],
                   check=True, stdout=subprocess.DEVNULL)
    for i in range(n):
        host = f"host-{i % 100}.example.com"
        kind = ("exact", "prefix", "hdr")[i % 3]
        path = {"exact": f"/exact/{i}", "prefix": f"/prefix/{i}", "hdr": f"/hdr/{i}"}[kind]
        routes.append((host, kind, path, f"t{i}" if kind == "hdr" else None, i % 100))
    services = 100
    # A prefix route in the middle of the table.
    request = ("host-2.example.com", "/prefix/5002/item", "")
else:
    routes.append((None, "prefix", "/", None, 0))
    services = 1
    request = (HOST, "/", "")
    listeners = f"  - {{name: http, protocol: HTTP, port: {PORTS['tollgate'][0]}}}\n"
    if tls:
        listeners = (f"  - name: https\n    protocol: HTTPS\n    port: {PORTS['tollgate'][1]}\n"
                     "    tls: {mode: Terminate, certificateRefs: [{kind: Secret, name: bench-cert}]}\n")
    with open(os.path.join(man, "bench.yaml"), "w") as f:
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
{listeners}---
apiVersion: v1
kind: Service
metadata: {{name: svc-0, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-0-1
  namespace: default
  labels: {{kubernetes.io/service-name: svc-0}}
addressType: IPv4
ports: [{{name: http, port: 19080}}]
endpoints:
- addresses: ["127.0.0.1"]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: bench, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /}}}}]
    backendRefs: [{{name: svc-0, port: 80}}]
""")
        if tls:
            f.write(f"""---
apiVersion: v1
kind: Secret
metadata: {{name: bench-cert, namespace: default}}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{indent(cert_pem, 4)}  tls.key: |
{indent(key_pem, 4)}""")

with open(os.path.join(a.dir, "request"), "w") as f:
    f.write("\t".join(request) + "\n")

# ---------------------------------------------------------------- nginx
port, sport = PORTS["nginx"]
listen = f"listen 127.0.0.1:{sport} ssl;" if tls else f"listen 127.0.0.1:{port};"
ssl = (f"ssl_certificate {os.path.abspath(a.cert)};\n  ssl_certificate_key {os.path.abspath(a.key)};\n"
       "  ssl_protocols TLSv1.2 TLSv1.3;\n" if tls else "")
by_host = {}
for host, kind, path, hdr, svc in routes:
    by_host.setdefault(host, []).append((kind, path, hdr, svc))


def nginx_locations(rs):
    out = []
    for kind, path, hdr, svc in rs:
        body = f"proxy_pass http://svc-{svc};"
        if hdr is not None:
            body = f'if ($http_x_tenant != "{hdr}") {{ return 404; }} {body}'
        if kind == "exact":
            out.append(f"location = {path} {{ {body} }}")
        elif path == "/":
            out.append(f"location / {{ {body} }}")
        else:
            # Gateway API PathPrefix matches whole segments: /p and /p/..., never /pq.
            out.append(f"location = {path} {{ {body} }}")
            out.append(f"location {path}/ {{ {body} }}")
    return "\n    ".join(out)


servers = []
for host, rs in by_host.items():
    name = f"server_name {host};" if host else "server_name _;"
    servers.append(f"""  server {{
    {listen}
    {name}
    {nginx_locations(rs)}
  }}""")
if None not in by_host:
    servers.append(f"  server {{\n    {listen.replace(';', ' default_server;')}\n    return 404;\n  }}")
upstreams = "\n".join(f"  upstream svc-{s} {{ server {BACKEND}; keepalive 64; }}"
                      for s in range(services))
with open(os.path.join(a.dir, "nginx.conf"), "w") as f:
    f.write(f"""worker_processes 1;
daemon off;
pid {os.path.abspath(a.dir)}/nginx.pid;
error_log {os.path.abspath(a.dir)}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  server_names_hash_bucket_size 128;
  server_names_hash_max_size 4096;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  {ssl}
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_set_header Host $http_host;
  proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
  proxy_set_header X-Forwarded-Proto $scheme;
  proxy_set_header X-Forwarded-Host $http_host;
  proxy_set_header X-Request-Id $request_id;
  add_header X-Request-Id $request_id always;
{upstreams}
{chr(10).join(servers)}
}}
""")

# ---------------------------------------------------------------- haproxy
port, sport = PORTS["haproxy"]
bind = (f"bind 127.0.0.1:{sport} ssl crt {os.path.abspath(a.dir)}/haproxy.pem alpn http/1.1"
        if tls else f"bind 127.0.0.1:{port}")
if tls:
    with open(os.path.join(a.dir, "haproxy.pem"), "w") as f:
        f.write(cert_pem + key_pem)
rules = []
if a.scenario == "routes10k":
    exact = open(os.path.join(a.dir, "exact.map"), "w")
    prefix = open(os.path.join(a.dir, "prefix.map"), "w")
    for host, kind, path, hdr, svc in routes:
        if kind == "exact":
            exact.write(f"{host}{path} svc-{svc}\n")
        elif kind == "prefix":
            exact.write(f"{host}{path} svc-{svc}\n")
            prefix.write(f"{host}{path}/ svc-{svc}\n")
    exact.close()
    prefix.close()
    d = os.path.abspath(a.dir)
    rules.append(f"http-request set-var(txn.be) base,map({d}/exact.map)")
    rules.append(f"http-request set-var(txn.be) base,map_beg({d}/prefix.map) "
                 "unless { var(txn.be) -m found }")
    rules.append("use_backend %[var(txn.be)] if { var(txn.be) -m found }")
    for host, kind, path, hdr, svc in routes:
        if kind == "hdr":
            rules.append(f"use_backend svc-{svc} if {{ hdr(host) -i {host} }} "
                         f"{{ hdr(x-tenant) -m str {hdr} }} {{ path_beg {path}/ }}")
    rules.append("default_backend not-found")
else:
    rules.append("default_backend svc-0")
backends = "\n".join(f"backend svc-{s}\n  server s1 {BACKEND}\n" for s in range(services))
backends += "backend not-found\n  http-request deny deny_status 404\n"
with open(os.path.join(a.dir, "haproxy.cfg"), "w") as f:
    f.write(f"""global
  nbthread 1
  maxconn 4096
  tune.ssl.default-dh-param 2048
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  option forwardfor
  http-reuse safe
frontend fe
  {bind}
  unique-id-format %[uuid()]
  unique-id-header X-Request-Id
  http-request set-header X-Forwarded-Proto {"https" if tls else "http"}
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-response set-header X-Request-Id %[unique-id]
  {chr(10).join("  " + r for r in rules).lstrip()}
{backends}""")
print(f"wrote {a.scenario} configs to {a.dir}")
