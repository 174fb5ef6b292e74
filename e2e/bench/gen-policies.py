#!/usr/bin/env python3
"""Writes the manifests of the policy benchmark: one Gateway and route per variant, each on its
own port, so every variant runs in its own tollgate-proxy (policies.sh measures each beside the
bare route); with `client`, those of the client-address benchmark (client.sh).

Usage: gen-policies.py DIR [policies | client [PROXY_VERSION] | backends]

Variants of `policies` (port):
  bare      18090  the route alone
  rl        18091  a local RateLimitPolicy, one counter per client address, never exceeded
  apikey    18092  an AuthPolicy with an API key (custom header) plus the same local limit
  jwt       18093  an AuthPolicy with an HS256 JWT (inline JWKS) plus the same local limit;
                   the same token on every request, so the verified-token cache answers
  cached    18094  the rl variant, its counters shared through Redis in redis-cached mode
  twin      18095  the bare route again: measured beside the bare route, a control whose
                   ratio shows what the measurement itself does (1.0 when it is fair)

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
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import time

SECRET = b"tollgate-bench-hs256-secret-0123456789"
API_KEY = "bench-api-key-0123456789"
PORTS = {"bare": 18090, "rl": 18091, "apikey": 18092, "jwt": 18093, "cached": 18094,
         "twin": 18095}
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


RL = f"""---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{name: bench-limit, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}}]
  limits:
    per-client: {HUGE_LIMIT}
"""

APIKEY = f"""---
apiVersion: v1
kind: Secret
metadata: {{name: bench-key, namespace: default, labels: {{app: bench, tollgate.dev/credential: "true"}}}}
stringData: {{api_key: {API_KEY}}}
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: bench-auth, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}}]
  rules:
    authentication:
      keys:
        apiKey: {{selector: {{matchLabels: {{app: bench}}}}}}
        credentials: {{customHeader: {{name: x-api-key}}}}
"""

jwks = json.dumps({"keys": [{"kty": "oct", "kid": "bench", "alg": "HS256",
                             "k": b64url(SECRET)}]})
JWT = f"""---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: bench-auth, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}}]
  rules:
    authentication:
      users:
        jwt:
          issuer: https://id.bench.test
          audiences: [bench]
          jwks: '{jwks}'
"""

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
    for name, text in variants.items():
        d = os.path.join(out, name)
        os.makedirs(os.path.join(d, "manifests"), exist_ok=True)
        with open(os.path.join(d, "manifests", "bench.yaml"), "w") as f:
            f.write(text)
        with open(os.path.join(d, "request"), "w") as f:
            f.write("\t".join([str(BACKEND_PORTS[name]), "x-user-id: bench-user-42"]) + "\n")
    print(" ".join(variants))


def policies(out):
    variants = {
        "bare": "",
        "rl": RL,
        "apikey": RL + APIKEY,
        "jwt": RL + JWT,
        "cached": RL,
        "twin": "",
    }
    headers = [f"x-api-key: {API_KEY}", f"authorization: Bearer {token()}"]
    for name, extra in variants.items():
        d = os.path.join(out, name)
        os.makedirs(os.path.join(d, "manifests"), exist_ok=True)
        with open(os.path.join(d, "manifests", "bench.yaml"), "w") as f:
            f.write(base(name, PORTS[name]) + extra)
        with open(os.path.join(d, "request"), "w") as f:
            f.write("\t".join([str(PORTS[name])] + headers) + "\n")
    print(" ".join(variants))


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


if __name__ == "__main__":
    which = sys.argv[2] if len(sys.argv) > 2 else "policies"
    if which == "client":
        client(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else "1")
    elif which == "backends":
        backends(sys.argv[1])
    else:
        policies(sys.argv[1])
