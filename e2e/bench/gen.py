#!/usr/bin/env python3
"""The benchmarks' inputs, one mode each (deterministic: the same arguments give the same files,
except the JWT of `policies`, signed with the current time):

  gen.py routes N DIR [--port 18080] [--backend-port 19080] [--endpoints 1]
  gen.py configs SCENARIO DIR --cert PEM --key PEM
  gen.py policies DIR [policies | costs | client [PROXY_VERSION] | backends | external | oidc]

---------------------------------------------------------------------------------- routes
Writes a manifest directory with one Gateway and N HTTPRoutes for `tollgate run`
(table-memory.sh, run.sh's control plane, `configs routes10k`).

Routes mix the shapes a real table has: a third match an exact path, a third a path prefix,
a third a path prefix plus a header; they spread over 100 hostnames, and point at 100
Services whose EndpointSlices list --endpoints loopback endpoints each (all on the backend
port, so one demo backend can answer them all). Deterministic: the same N gives the same files.

---------------------------------------------------------------------------------- configs
Writes the same route configuration for every contender of the benchmark (run.sh, profile.sh,
callgrind.sh).

SCENARIO is `one` (one catch-all route), `routes10k` (the 10k HTTPRoutes of `routes`)
or `https` (the one route behind TLS termination). DIR receives:
  manifests/         Gateway API manifests (compiled with `tollgate compile` for tollgate-proxy)
  nginx.conf         nginx: server_name per hostname, a location per path match
  haproxy.cfg (+ .map files)  HAProxy: maps for exact and prefix paths, ACLs for header matches
  request            the Host header, path and extra header the load generator sends

Every contender listens on 127.0.0.1 only, forwards to the backend on 127.0.0.1:19080 over
pooled keep-alive connections, and does the same per-request work Tollgate does by default:
X-Forwarded-For/-Proto/-Host, a fresh X-Request-Id sent upstream and returned to the client,
no access log.

---------------------------------------------------------------------------------- policies
Writes the manifests of the policy benchmark: one Gateway and route per variant, each on its
own port, so every variant runs in its own tollgate-proxy (policies.sh measures each beside the
bare route); with `client`, those of the client-address benchmark (client.sh); with
`backends`, those of the backend-settings benchmark (backends.sh).

Variants of `policies` (port):
  bare      18090  the route alone
  rl        18091  a local RateLimitPolicy, one counter per client address, never exceeded
  apikey    18092  an AuthPolicy with an API key (custom header) plus the same local limit
  jwt       18093  an AuthPolicy with an HS256 JWT (inline JWKS) plus the same local limit;
                   the same token on every request, so the verified-token cache answers
  cached    18094  the rl variant, its counters shared through Redis in redis-cached mode
  twin      18095  the bare route again: measured beside the bare route, a control whose
                   ratio shows what the measurement itself does (1.0 when it is fair)
  basic     18096  an AuthPolicy with basic auth (a SHA-512 crypt htpasswd entry) plus the
                   same local limit; the same credential on every request, so the memo of
                   checked passwords answers (its Authorization header replaces the token)

With `costs`, the variants of the cost and shadow limit benchmark (costs.sh), each limit
the `rl` one (one counter per client address, never exceeded) but for what it counts:
  bare      18690  the route alone
  rl        18691  the plain limit, as in `policies`
  reqcost   18692  cost.request: int(request.headers['x-cost']) (every request sends 1)
  respcost  18693  cost.response: int(response.headers['content-length']) (the backend's
                   body, counted after each response)
  bodycost  18696  cost.response: int(response.body.usage.total_tokens) (the backend answers
                   {"usage":{"total_tokens":1}} in costs.sh, counted once the body ended)
  shadow    18694  the plain limit in mode: Shadow
  twin      18695  the bare route again (the control)

DIR/<variant>/manifests.yaml and DIR/<variant>/request (its port, then the headers the load
generator sends, tab-separated). Every variant gets the same request, API key and token
included, so the bare route parses and forwards the same bytes and the ratios measure the
policies alone. The backend is 127.0.0.1:19080. The token is signed here with the standard
library. Prints the variants.

`client` writes four proxies, DIR/proxies/<proxy>/manifests/bench.yaml (port):
  bare            18290  the route alone, no ClientPolicy
  xff             18291  a ClientPolicy on the Gateway: xForwardedFor {numTrustedHops: 1}
  proxy-protocol  18292  a ClientPolicy on the Gateway: proxyProtocol {required: true}
  twin            18293  the bare route again (the control)
DIR/proxies.tsv (proxy, port), DIR/haproxy.cfg, an L4 relay (HAProxy, mode tcp) on 18390,
18392 and 18393 in front of bare, proxy-protocol and twin, sending a PROXY header (v1,
`send-proxy`; PROXY_VERSION 2: v2, `send-proxy-v2`) to proxy-protocol only, and
DIR/targets.tsv, what the load generator loads: target, proxy, port, the target loaded beside
it (- for none), then the headers, tab-separated. Every target sends X-Forwarded-For:
203.0.113.7, 198.51.100.9 (so the bare route parses the same bytes as xff, whose client is
198.51.100.9); the -close ones also Connection: close (a new connection per request). Prints
the variants measured beside the bare route: xff (beside bare), proxy-protocol and
proxy-protocol-close (beside the bare route through the same relay, bare-relay and
bare-relay-close), and the controls twin and twin-relay.

`backends` writes the variants of the backend-settings benchmark (backends.sh) as `policies`
does, each over three endpoints (127.0.0.1:19080, 19081, 19082, one EndpointSlice each):
  bare    18490  the route alone
  policy  18491  a BackendPolicy with a circuit breaker, outlier detection and an HTTP health
                 check every second, none of which ever trips
  retry   18492  the route with a retry rule (attempts 2, codes 502/503/504), never used
  hash    18493  a BackendPolicy: ConsistentHash on x-user-id (every request carries it)
  expr    18495  a BackendPolicy: ConsistentHash on the CEL expression
                 `request.headers['x-user-id']` (the same key, evaluated per request)
  twin    18494  the bare route again (the control)

`external` writes the variants of the external authorization benchmark (external-authz.sh), as
`policies` does; the authorization service is extauthz-grpc on 127.0.0.1:19191 (gRPC, h2c),
or for the -opa variants opa-envoy-grpc (OPA with OPA-Envoy's tutorial policy) on 19193:
  bare          18590  the route alone
  cached        18591  an AuthPolicy `external` gRPC rule with cacheTTL 1h (a hit after the first)
  uncached      18592  the same rule without a cache: one Check call per request
  twin          18593  the bare route again (the control)
  cached-opa    18594  `cached` asking opa-envoy-grpc
  uncached-opa  18595  `uncached` asking opa-envoy-grpc
Each variant's `request` holds its port and headers: `x-allow: yes` for extauthz-grpc, an HS256
JWT bearer token with the tutorial's `role: guest` claim (secret `secret`) for OPA, which allows
it GET /people/*.

`oidc` writes the variants of the OIDC session benchmark (oidc.sh), as `policies` does; the
OpenID Provider (e2e/oidc-provider.sh, client `bench`, secret `bench-secret`) is
http://127.0.0.1:18398, and the request file holds the port alone (oidc.sh logs in and adds
the session cookie):
  bare      18490  the route alone
  oidc      18491  an AuthPolicy `oidc` method logging browsers in at that provider, `x-user`
                   set from the ID token's `sub`
  twin      18492  the bare route again (the control)
"""
import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time

USAGE = """usage: gen.py routes N DIR [--port 18080] [--backend-port 19080] [--endpoints 1]
       gen.py configs SCENARIO DIR --cert PEM --key PEM
       gen.py policies DIR [policies | costs | client [PROXY_VERSION] | backends | external | oidc]"""


# ================================================================================== routes
def write_routes(a):
    """The files of `routes` for a (n, dir, port, backend_port, endpoints)."""
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


def main_routes(argv):
    p = argparse.ArgumentParser(prog="gen.py routes")
    p.add_argument("n", type=int)
    p.add_argument("dir")
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--backend-port", type=int, default=19080)
    p.add_argument("--endpoints", type=int, default=1)
    a = p.parse_args(argv)
    write_routes(a)
    print(f"wrote {a.n} routes to {a.dir}")


# ================================================================================== configs
def main_configs(argv):
    p = argparse.ArgumentParser(prog="gen.py configs")
    p.add_argument("scenario", choices=["one", "routes10k", "https", "logs"])
    p.add_argument("dir")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args(argv)
    BACKEND = "127.0.0.1:19080"
    PORTS = {  # contender: (http, https)
        "tollgate": (18080, 18443),
        "nginx": (18081, 18444),
        "haproxy": (18082, 18445),
    }
    HOST = "bench.example.test"

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
        write_routes(argparse.Namespace(n=n, dir=man, port=PORTS["tollgate"][0],
                                        backend_port=19080, endpoints=1))
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
    # `logs`: every contender writes a JSON line per request with the fields of Tollgate's
    # access log (nginx buffered, as its docs advise under load; HAProxy to stdout).
    access_log = "access_log off;"
    if a.scenario == "logs":
        access_log = (
            "log_format tg escape=json '{\"time\":\"$time_iso8601\",\"method\":\"$request_method\","
            "\"host\":\"$host\",\"path\":\"$uri\",\"status\":$status,\"duration_ms\":$request_time,"
            "\"route\":\"default/bench\",\"upstream\":\"$upstream_addr\",\"bytes\":$body_bytes_sent,"
            "\"request_id\":\"$request_id\",\"peer\":\"$remote_addr:$remote_port\"}';\n"
            f"  access_log {os.path.abspath(a.dir)}/nginx-access.log tg buffer=64k flush=1s;")
    with open(os.path.join(a.dir, "nginx.conf"), "w") as f:
        f.write(f"""worker_processes 1;
daemon off;
pid {os.path.abspath(a.dir)}/nginx.pid;
error_log {os.path.abspath(a.dir)}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  {access_log}
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
    sections = "\n".join(f"backend svc-{s}\n  server s1 {BACKEND}\n" for s in range(services))
    sections += "backend not-found\n  http-request deny deny_status 404\n"
    with open(os.path.join(a.dir, "haproxy.cfg"), "w") as f:
        haproxy_log = ""
        haproxy_log_defaults = ""
        haproxy_capture = "\n  http-request capture req.hdr(host) len 64" if a.scenario == "logs" else ""
        if a.scenario == "logs":
            haproxy_log = "\n  log stdout format raw local0"
            haproxy_log_defaults = (
                "\n  log global\n  log-format '{\"time\":\"%t\",\"method\":\"%HM\",\"host\":\"%hr\","
                "\"path\":\"%HPO\",\"status\":%ST,\"duration_ms\":%Ta,\"route\":\"%b\","
                "\"upstream\":\"%si:%sp\",\"bytes\":%B,\"request_id\":\"%ID\",\"peer\":\"%ci:%cp\"}'")
        f.write(f"""global
  nbthread 1
  maxconn 4096
  tune.ssl.default-dh-param 2048{haproxy_log}
defaults
  mode http{haproxy_log_defaults}
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  option forwardfor
  http-reuse safe
frontend fe
  {bind}
  unique-id-format %[uuid()]
  unique-id-header X-Request-Id{haproxy_capture}
  http-request set-header X-Forwarded-Proto {"https" if tls else "http"}
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-response set-header X-Request-Id %[unique-id]
  {chr(10).join("  " + r for r in rules).lstrip()}
{sections}""")
    print(f"wrote {a.scenario} configs to {a.dir}")


# ================================================================================== policies
SECRET = b"tollgate-bench-hs256-secret-0123456789"
API_KEY = "bench-api-key-0123456789"
PORTS = {"bare": 18090, "rl": 18091, "apikey": 18092, "jwt": 18093, "cached": 18094,
         "twin": 18095, "basic": 18096}
BASIC_USER, BASIC_PASSWORD = "bench", "bench-password"
# `openssl passwd -6 -salt benchsaltbenchsa bench-password` (SHA-512 crypt, 5,000 rounds).
BASIC_HASH = ("$6$benchsaltbenchsa$nbRlu6nxQH4/V2j5At6Hj2QmA09b0k1taVuj0ATGan5wupScb8uAUwOSHMk"
              "UQFMMpvQCFRNzp2j4bYLI6P0no/")
# Never reached in a benchmark run: limit × window_ms stays below 2^53 as the limiter requires.
HUGE_LIMIT = "{rates: [{limit: 1000000000, window: 1h}], counters: [{expression: source.address}]}"


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token():
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "bench"}).encode())
    now = int(time.time())
    claims = {"iss": "https://id.bench.test", "aud": "bench", "sub": "bench-user",
              "iat": now, "nbf": now - 60, "exp": now + 86400}
    payload = b64url(json.dumps(claims).encode())
    sig = hmac.new(SECRET, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(sig)}"


def base(name, port):
    return f"""apiVersion: gateway.networking.k8s.io/v1
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
  listeners: [{{name: http, protocol: HTTP, port: {port}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: svc-0, namespace: default}}
spec: {{ports: [{{name: http, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc-0-1, namespace: default, labels: {{kubernetes.io/service-name: svc-0}}}}
addressType: IPv4
ports: [{{name: http, port: 19080}}]
endpoints: [{{addresses: ["127.0.0.1"]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: bench, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /}}}}]
    backendRefs: [{{name: svc-0, port: 80}}]
"""


def on_route(kind, name, spec):
    """A Tollgate policy of `kind` on the route `bench`, its spec after targetRefs `spec` (YAML
    lines, indented)."""
    return f"""---
apiVersion: tollgate.dev/v1alpha1
kind: {kind}
metadata: {{name: {name}, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}}]
{spec}"""


RL = on_route("RateLimitPolicy", "bench-limit", f"""  limits:
    per-client: {HUGE_LIMIT}
""")

APIKEY = f"""---
apiVersion: v1
kind: Secret
metadata: {{name: bench-key, namespace: default, labels: {{app: bench, tollgate.dev/credential: "true"}}}}
stringData: {{api_key: {API_KEY}}}
""" + on_route("AuthPolicy", "bench-auth", """  rules:
    authentication:
      keys:
        apiKey: {selector: {matchLabels: {app: bench}}}
        credentials: {customHeader: {name: x-api-key}}
""")

jwks = json.dumps({"keys": [{"kty": "oct", "kid": "bench", "alg": "HS256",
                             "k": b64url(SECRET)}]})
JWT = on_route("AuthPolicy", "bench-auth", f"""  rules:
    authentication:
      users:
        jwt:
          issuer: https://id.bench.test
          audiences: [bench]
          jwks: '{jwks}'
""")

BASIC = f"""---
apiVersion: v1
kind: Secret
metadata: {{name: bench-users, namespace: default, labels: {{app: bench, tollgate.dev/credential: "true"}}}}
stringData: {{htpasswd: "{BASIC_USER}:{BASIC_HASH}"}}
""" + on_route("AuthPolicy", "bench-auth", """  rules:
    authentication:
      users:
        basic: {selector: {matchLabels: {app: bench}}}
""")

BACKEND_PORTS = {"bare": 18490, "policy": 18491, "retry": 18492, "hash": 18493, "twin": 18494,
                 "expr": 18495}


def base_three(port, retry=""):
    """base() over three endpoints, the route's rule with `retry` (YAML) when given."""
    text = base("bench", port)
    one = text[text.index("apiVersion: discovery.k8s.io/v1"):text.index("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute")]
    slices = "---\n".join(one.replace("svc-0-1", f"svc-0-{p}").replace("port: 19080", f"port: {p}")
                     for p in (19080, 19081, 19082))
    text = text.replace(one, slices)
    if retry:
        text = text.rstrip("\n") + f"\n    retry: {retry}\n"
    return text


def backend_policy(spec):
    return f"""---
apiVersion: tollgate.dev/v1alpha1
kind: BackendPolicy
metadata: {{name: bench, namespace: default}}
spec:
  targetRefs: [{{group: "", kind: Service, name: svc-0}}]
{spec}"""


def write_variants(out, manifests, request):
    """DIR/<variant>/manifests/bench.yaml (manifests: variant -> text) and DIR/<variant>/request
    (the fields request(variant) gives: its port, then headers; tab-separated); prints the
    variants."""
    for name, text in manifests.items():
        d = os.path.join(out, name)
        os.makedirs(os.path.join(d, "manifests"), exist_ok=True)
        with open(os.path.join(d, "manifests", "bench.yaml"), "w") as f:
            f.write(text)
        with open(os.path.join(d, "request"), "w") as f:
            f.write("\t".join(str(x) for x in request(name)) + "\n")
    print(" ".join(manifests))


def backends(out):
    variants = {
        "bare": base_three(BACKEND_PORTS["bare"]),
        "policy": base_three(BACKEND_PORTS["policy"]) + backend_policy(
            "  circuitBreaker: {maxConnections: 4096, maxPendingRequests: 1024, maxRequests: 8192, maxRetries: 64}\n"
            "  outlierDetection: {consecutive5xx: 5, consecutiveGatewayErrors: 3, interval: 5s, baseEjectionTime: 30s, maxEjectionPercent: 50}\n"
            "  healthCheck:\n"
            "    active: {type: HTTP, http: {path: /, expectedStatuses: [200]}, interval: 1s, timeout: 500ms, unhealthyThreshold: 2, healthyThreshold: 1}\n"),
        "retry": base_three(BACKEND_PORTS["retry"], "{attempts: 2, backoff: 25ms, codes: [502, 503, 504]}"),
        "hash": base_three(BACKEND_PORTS["hash"]) + backend_policy(
            "  loadBalancer: {type: ConsistentHash, consistentHash: {header: x-user-id}}\n"),
        "expr": base_three(BACKEND_PORTS["expr"]) + backend_policy(
            "  loadBalancer: {type: ConsistentHash, consistentHash: {expression: \"request.headers['x-user-id']\"}}\n"),
        "twin": base_three(BACKEND_PORTS["twin"]),
    }
    write_variants(out, variants, lambda name: [BACKEND_PORTS[name], "x-user-id: bench-user-42"])


def policies(out):
    variants = {
        "bare": "",
        "rl": RL,
        "apikey": RL + APIKEY,
        "jwt": RL + JWT,
        "cached": RL,
        "twin": "",
        "basic": RL + BASIC,
    }
    headers = [f"x-api-key: {API_KEY}", f"authorization: Bearer {token()}"]
    basic = base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
    # One Authorization header per request: the basic variant's carries its credential
    # instead of the bearer token (the same length within a few bytes of the token's).
    basic_headers = [f"x-api-key: {API_KEY}", f"authorization: Basic {basic}"]
    write_variants(out, {name: base(name, PORTS[name]) + extra for name, extra in variants.items()},
                   lambda name: [PORTS[name]] + (basic_headers if name == "basic" else headers))


COST_PORTS = {"bare": 18690, "rl": 18691, "reqcost": 18692, "respcost": 18693, "shadow": 18694,
              "twin": 18695, "bodycost": 18696}


def limit_with(extra):
    """RL with `extra` (flow-mapping entries) added to the limit."""
    return RL.replace(HUGE_LIMIT, HUGE_LIMIT[:-1] + ", " + extra + "}")


def costs(out):
    variants = {
        "bare": "",
        "rl": RL,
        "reqcost": limit_with("cost: {request: \"int(request.headers['x-cost'])\"}"),
        "respcost": limit_with("cost: {response: \"int(response.headers['content-length'])\"}"),
        "bodycost": limit_with("cost: {response: \"int(response.body.usage.total_tokens)\"}"),
        "shadow": limit_with("mode: Shadow"),
        "twin": "",
    }
    write_variants(out, {name: base(name, COST_PORTS[name]) + extra for name, extra in variants.items()},
                   lambda name: [COST_PORTS[name], "x-cost: 1"])


def client_policy(client_ip):
    return f"""---
apiVersion: tollgate.dev/v1alpha1
kind: ClientPolicy
metadata: {{name: bench-client, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: bench}}]
  clientIP: {client_ip}
"""


CLIENT_PROXIES = {  # proxy: (port, relay port or None, ClientPolicy)
    "bare": (18290, 18390, ""),
    "xff": (18291, None, client_policy("{xForwardedFor: {numTrustedHops: 1}}")),
    "proxy-protocol": (18292, 18392, client_policy("{proxyProtocol: {required: true}}")),
    "twin": (18293, 18393, ""),
}
XFF = "X-Forwarded-For: 203.0.113.7, 198.51.100.9"
CLOSE = "Connection: close"


def client(out, pp_version):
    relay = [
        "global",
        "  nbthread 1",
        "  maxconn 4000",
        "defaults",
        "  mode tcp",
        "  maxconn 4000",
        "  timeout connect 5s",
        "  timeout client 60s",
        "  timeout server 60s",
    ]
    send = {"1": " send-proxy", "2": " send-proxy-v2"}[pp_version]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "proxies.tsv"), "w") as f:
        for name, (port, relay_port, extra) in CLIENT_PROXIES.items():
            d = os.path.join(out, "proxies", name, "manifests")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "bench.yaml"), "w") as m:
                m.write(base(name, port) + extra)
            f.write(f"{name}\t{port}\n")
            if relay_port:
                relay += [f"frontend {name}", f"  bind 127.0.0.1:{relay_port}",
                          f"  default_backend {name}", f"backend {name}",
                          f"  server {name} 127.0.0.1:{port}"
                          + (send if name == "proxy-protocol" else "")]
    with open(os.path.join(out, "haproxy.cfg"), "w") as f:
        f.write("\n".join(relay) + "\n")
    relayed = {name: r for name, (_, r, _) in CLIENT_PROXIES.items()}
    direct = {name: p for name, (p, _, _) in CLIENT_PROXIES.items()}
    targets = [  # target, proxy, port, partner, headers
        ("bare", "bare", direct["bare"], "-", [XFF]),
        ("xff", "xff", direct["xff"], "bare", [XFF]),
        ("twin", "twin", direct["twin"], "bare", [XFF]),
        ("bare-relay", "bare", relayed["bare"], "-", [XFF]),
        ("proxy-protocol", "proxy-protocol", relayed["proxy-protocol"], "bare-relay", [XFF]),
        ("twin-relay", "twin", relayed["twin"], "bare-relay", [XFF]),
        ("bare-relay-close", "bare", relayed["bare"], "-", [XFF, CLOSE]),
        ("proxy-protocol-close", "proxy-protocol", relayed["proxy-protocol"], "bare-relay-close",
         [XFF, CLOSE]),
    ]
    with open(os.path.join(out, "targets.tsv"), "w") as f:
        for t, proxy, port, partner, headers in targets:
            f.write("\t".join([t, proxy, str(port), partner] + headers) + "\n")
    print("xff proxy-protocol proxy-protocol-close twin twin-relay")


EXTERNAL_PORTS = {"bare": 18590, "cached": 18591, "uncached": 18592, "twin": 18593,
                  "cached-opa": 18594, "uncached-opa": 18595}
# extauthz-grpc (e2e/extauthz.sh) listens here: an Envoy ext_authz service allowing `x-allow: yes`.
EXTAUTHZ_PORT = 19191
# opa-envoy-grpc (e2e/opa-envoy.sh) listens here: OPA evaluating OPA-Envoy's tutorial policy.
OPA_PORT = 19193


def opa_token():
    """A token OPA-Envoy's tutorial policy allows GET /people/* for: HS256 with the secret
    `secret`, role guest, valid from a minute ago for a day."""
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    now = int(time.time())
    claims = {"role": "guest", "sub": b64url(b"alice"), "nbf": now - 60, "exp": now + 86400}
    payload = b64url(json.dumps(claims).encode())
    sig = hmac.new(b"secret", f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(sig)}"


def external_policy(cache_ttl, port=EXTAUTHZ_PORT):
    ttl = f", cacheTTL: {cache_ttl}" if cache_ttl else ""
    return f"""---
apiVersion: v1
kind: Service
metadata: {{name: authz, namespace: default}}
spec: {{ports: [{{name: grpc, port: 9191, appProtocol: kubernetes.io/h2c}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: authz-1, namespace: default, labels: {{kubernetes.io/service-name: authz}}}}
addressType: IPv4
ports: [{{name: grpc, port: {port}}}]
endpoints: [{{addresses: ["127.0.0.1"]}}]
""" + on_route("AuthPolicy", "bench-ext", f"""  rules:
    authorization:
      opa:
        external: {{grpc: {{backendRef: {{name: authz, port: 9191}}}}, timeout: 1s{ttl}}}
""")


def external(out):
    """The variants of external-authz.sh: the bare route, the route asking extauthz-grpc (or
    opa-envoy-grpc) with a decision cache (1h: every request after the first is a hit) and
    without one."""
    variants = {
        "bare": "",
        "cached": external_policy("1h"),
        "uncached": external_policy(None),
        "twin": "",
        "cached-opa": external_policy("1h", OPA_PORT),
        "uncached-opa": external_policy(None, OPA_PORT),
    }
    bearer = opa_token()
    write_variants(out, {name: base(name, EXTERNAL_PORTS[name]) + extra for name, extra in variants.items()},
                   lambda name: [EXTERNAL_PORTS[name]] + (
                       [f"authorization: Bearer {bearer}"] if name.endswith("-opa")
                       else ["x-allow: yes", "authorization: Bearer bench-user"]))


OIDC_PORTS = {"bare": 18490, "oidc": 18491, "twin": 18492}
OIDC_ISSUER = "http://127.0.0.1:18398"
OIDC = on_route("AuthPolicy", "bench-login", f"""  rules:
    authentication:
      browser:
        oidc: {{issuer: "{OIDC_ISSUER}", clientID: bench, clientSecretRef: {{name: bench-oidc}},
               redirectPath: /oauth2/callback, logoutPath: /logout,
               cookieKeyRef: {{name: bench-cookie-key}}, scopes: [openid, offline_access]}}
    response:
      success: {{headers: {{x-user: {{expression: auth.identity.sub}}}}}}
""") + """---
apiVersion: v1
kind: Secret
metadata: {name: bench-oidc, namespace: default, labels: {tollgate.dev/credential: "true"}}
stringData: {clientSecret: bench-secret}
---
apiVersion: v1
kind: Secret
metadata: {name: bench-cookie-key, namespace: default, labels: {tollgate.dev/credential: "true"}}
stringData: {keys: "bench-cookie-key-0123456789abcdef0123456789"}
"""


def oidc(out):
    """The variants of oidc.sh: the bare route and the route behind an OIDC login."""
    variants = {"bare": "", "oidc": OIDC, "twin": ""}
    write_variants(out, {name: base(name, OIDC_PORTS[name]) + extra for name, extra in variants.items()},
                   lambda name: [OIDC_PORTS[name]])


def main_policies(argv):
    if not argv:
        sys.exit(f"{USAGE}\ngen.py policies: DIR missing")
    which = argv[1] if len(argv) > 1 else "policies"
    if which == "client":
        client(argv[0], argv[2] if len(argv) > 2 else "1")
    elif which == "backends":
        backends(argv[0])
    elif which == "external":
        external(argv[0])
    elif which == "costs":
        costs(argv[0])
    elif which == "oidc":
        oidc(argv[0])
    else:
        policies(argv[0])


MODES = {"routes": main_routes, "configs": main_configs, "policies": main_policies}

if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit(USAGE)
    if sys.argv[1] not in MODES:
        sys.exit(f"{USAGE}\ngen.py: unknown mode {sys.argv[1]!r} (routes, configs, policies)")
    MODES[sys.argv[1]](sys.argv[2:])


def api_list(path):
    """Writes to `path` the JSON answer compression.sh and cache.sh serve: 60 records of an
    API's list, about 15 KiB."""
    import json
    items = [{"id": i, "sku": f"SKU-{i:06d}", "name": f"Product number {i}",
              "price": {"amount": 1999 + i * 7, "currency": "EUR"},
              "tags": ["catalog", "featured" if i % 3 == 0 else "standard"], "inStock": i % 4 != 0,
              "updatedAt": f"2026-11-{1 + i % 28:02d}T12:00:00Z"} for i in range(60)]
    with open(path, "w") as f:
        json.dump({"items": items, "next": "/products?page=2"}, f, indent=1)
