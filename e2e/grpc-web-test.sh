#!/usr/bin/env bash
# e2e/grpc-web-test.sh — gRPC-Web checked with real gRPC-Web clients from npm: `tollgate run`
# on a Gateway with a GRPCRoute (CORS from its tollgate.dev/cors annotation) to a real gRPC
# server (extauthz-grpc, grpc-go, serving grpc.health.v1.Health: e2e/extauthz/health.go), on
# loopback. e2e/grpc-web-client/client.mjs calls it in binary gRPC-Web
# (`application/grpc-web+proto`) with @connectrpc/connect-web's transport on Node's fetch
# (HTTP/1.1) and @connectrpc/connect-node's over HTTP/2, text-client.mjs in
# `application/grpc-web-text` with grpc/grpc-web's own client on an XMLHttpRequest (xhr2,
# HTTP/1.1): each a unary Check, a server-streaming Watch ending with an error in the
# trailers, and a NOT_FOUND; client.mjs also the CORS preflights (their headers list the
# assertions). Then the access log is checked: every call logged with `grpc_web: true` and
# the backend's status.
#
# The client's packages come from package-lock.json (`npm ci`, exact versions) into
# e2e/grpc-web-client/node_modules (not committed), reinstalled only when the lock file
# changes; its service code is generated from e2e/grpc-web-client/proto/grpc/health/v1/
# health.proto by buf and protoc-gen-es (both from npm, run offline) into gen/ (not
# committed). Measured here (2 shared cores, two cargo builds running), with tollgate and
# extauthz-grpc already built: the whole script 10.5 s wall from an empty npm cache (`npm ci`
# 5 s: 14 packages, 130 MB, most of it TypeScript for protoc-gen-es; generation 1.5 s), 5.3 s
# warm.
#
# Needs Node >= 20 with npm, Go (for extauthz-grpc's first build; e2e/extauthz.sh gives the
# cold time). Builds tollgate (debug) unless TOLLGATE_BIN names a binary. KEEP=1 leaves the
# work directory (manifests, logs) for a look.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
CLIENT=$E2E/grpc-web-client
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}

log() { printf '[grpc-web %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

command -v node >/dev/null || fail "node is required"
command -v npm >/dev/null || fail "npm is required"
command -v curl >/dev/null || fail "curl is required"
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || fail "Node >= 20 is required (fetch with streamed bodies), found $(node --version)"

extauthz=$("$E2E/extauthz.sh" build)
if [[ -n ${TOLLGATE_BIN:-} ]]; then
  tollgate=$TOLLGATE_BIN
else
  log "building tollgate (debug)"
  (cd "$ROOT" && cargo build --locked -p tollgate --bin tollgate)
  tollgate=$CARGO_TARGET_DIR/debug/tollgate
fi
[[ -x $tollgate ]] || fail "no tollgate binary at $tollgate"

# npm ci again only when the lock file changed since the last install.
stamp=$CLIENT/node_modules/.tollgate-lock.sha256
want=$(sha256sum "$CLIENT/package-lock.json" | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  log "npm ci (e2e/grpc-web-client)"
  (cd "$CLIENT" && npm ci --no-audit --no-fund --loglevel=error)
  printf '%s\n' "$want" >"$stamp"
fi
log "generating the health service code (buf, protoc-gen-es)"
(cd "$CLIENT" && PATH=$CLIENT/node_modules/.bin:$PATH buf generate)

WORK=$(mktemp -d /tmp/tollgate-grpc-web.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [[ ${KEEP:-0} == 1 ]]; then
    log "kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# Free loopback ports, so the test runs beside others.
free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
backend_port=$(free_port)
gateway_port=$(free_port)
admin_port=$(free_port)
origin=http://localhost:3000

"$extauthz" -listen "127.0.0.1:$backend_port" >"$WORK/backend.log" 2>&1 &
pids+=($!)

mkdir -p "$WORK/manifests"
cat >"$WORK/manifests/grpc-web.yaml" <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tollgate}
spec: {controllerName: tollgate.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: grpc-web, namespace: default}
spec:
  gatewayClassName: tollgate
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners: [{name: http, protocol: HTTP, port: $gateway_port}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: health
  namespace: default
  annotations:
    tollgate.dev/cors: '{"allowOrigins": ["$origin"]}'
spec:
  parentRefs: [{name: grpc-web}]
  rules:
  - matches: [{method: {service: grpc.health.v1.Health}}]
    backendRefs: [{name: health, port: 50051}]
---
apiVersion: v1
kind: Service
metadata: {name: health, namespace: default}
spec: {ports: [{name: grpc, port: 50051, targetPort: $backend_port, appProtocol: grpc}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: health-local, namespace: default, labels: {kubernetes.io/service-name: health}}
addressType: IPv4
ports: [{name: grpc, port: $backend_port, protocol: TCP}]
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
YAML

"$tollgate" run "$WORK/manifests" --admin "127.0.0.1:$admin_port" \
  --access-log-file "$WORK/access.log" >"$WORK/tollgate.log" 2>&1 &
pids+=($!)
log "waiting for tollgate (gateway 127.0.0.1:$gateway_port, backend 127.0.0.1:$backend_port)"
ready=0
for _ in $(seq 1 300); do
  kill -0 "${pids[1]}" 2>/dev/null || { cat "$WORK/tollgate.log" >&2; fail "tollgate exited"; }
  # Ready, and the route served: a gRPC-Web preflight gets the gateway's CORS answer.
  if curl -sf -o /dev/null "http://127.0.0.1:$admin_port/readyz" &&
    curl -s -o /dev/null -D - -X OPTIONS -H "origin: $origin" -H 'access-control-request-method: POST' \
      "http://127.0.0.1:$gateway_port/grpc.health.v1.Health/Check" | grep -qi '^access-control-allow-origin:'; then
    ready=1
    break
  fi
  sleep 0.1
done
((ready)) || { cat "$WORK/tollgate.log" >&2; fail "tollgate did not serve the route within 30 s"; }

log "running the gRPC-Web client (e2e/grpc-web-client/client.mjs)"
node "$CLIENT/client.mjs" "http://127.0.0.1:$gateway_port" "$origin" ||
  { log "tollgate log: $WORK/tollgate.log, access log: $WORK/access.log (KEEP=1 keeps them)"; fail "the gRPC-Web client failed"; }

log "running the gRPC-Web text client (e2e/grpc-web-client/text-client.mjs)"
node "$CLIENT/text-client.mjs" "http://127.0.0.1:$gateway_port" ||
  { log "tollgate log: $WORK/tollgate.log, access log: $WORK/access.log (KEEP=1 keeps them)"; fail "the gRPC-Web text client failed"; }

log "checking the access log (e2e/grpc-web-client/access-log-check.mjs)"
# A line is written as its answer ends, which may be just after the client has read it.
for _ in $(seq 1 50); do
  (($(grep -c '"method":"POST"' "$WORK/access.log" || true) >= 10)) && break
  sleep 0.1
done
node "$CLIENT/access-log-check.mjs" "$WORK/access.log" || fail "access log mismatch (KEEP=1 keeps it)"
log "PASS"
