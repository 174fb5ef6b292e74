#!/usr/bin/env bash
# Route propagation latency: the time from applying an HTTPRoute through the real
# kube-apiserver (e2e/cluster.sh) to a subscribed tollgate-proxy serving it, p50/p90/p99/max
# over N changes, with BACKGROUND other routes present (default: 1, then 1000).
#
# What runs: `tollgate controller` (release build, its own namespace, GatewayClass and
# controllerName, push server on loopback, --provision=false), one Gateway whose listener
# binds 127.0.0.1:<free port>, and `tollgate-proxy --controller` subscribed with the client
# certificate from the `<gateway>-tollgate-proxy-tls` Secret the controller issues. The timed
# part is route-latency.py: one persistent HTTPS connection to the API server (no kubectl
# start-up in the figures), a timestamp just before each server-side apply, then GETs on the
# proxy every ~2 ms until the new path answers. The measured routes answer with a
# RequestRedirect (302) from the proxy itself: the API server refuses loopback EndpointSlice
# addresses and no traffic may leave 127.0.0.1 (see the helper's docstring). Background
# routes point at Service `echo`, whose single endpoint (192.0.2.1, TEST-NET-1) is never
# contacted. The controller's debounce (--debounce-ms, default 100 ms) is part of the figure.
# Each change follows GAP_MS of idle time: back to back, a change can land in the debounce +
# status pass that follows the proxy's ACK of the previous one and wait ~100 ms more.
#
# Usage: e2e/bench/route-latency.sh
# Env:   N (100) changes per scenario; BACKGROUND ("1 1000") background route counts, run in
#        that order; GAP_MS (500) idle time before each change, 0 = back to back;
#        DEBOUNCE_MS (unset: the controller's default); BUILD=0 uses the binaries
#        already built; KEEP=1 keeps the work directory and the namespace.
# The cluster is started if it is not running, and stopped at the end only in that case.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
N=${N:-100}
BACKGROUND=${BACKGROUND:-1 1000}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
bin=$CARGO_TARGET_DIR/release
cluster=$root/e2e/cluster.sh
work=$(mktemp -d /tmp/tollgate-route-latency.XXXXXX)
pids=()
started_cluster=0
ns=""
class=""

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

cleanup() {
  local rc=$? p f
  if [ "$rc" != 0 ]; then
    for f in "$work/controller.log" "$work/proxy.log"; do
      [ ! -s "$f" ] || { log "tail of $f:"; tail -n 20 "$f" >&2; }
    done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    log "kept: work directory $work, namespace $ns"
  else
    if [ -n "$ns" ]; then
      kubectl delete httproutes --all -n "$ns" --wait=false >/dev/null 2>&1 || true
      kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
    fi
    [ -z "$class" ] || kubectl delete gatewayclass "$class" --wait=false >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
  if [ "$started_cluster" = 1 ]; then "$cluster" down || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for SECONDS DESCRIPTION COMMAND...: run COMMAND every 0.2 s until it succeeds.
wait_for() {
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what"
    sleep 0.2
  done
}

for t in curl python3 kubectl; do command -v "$t" >/dev/null || die "$t is required"; done

# ---------------------------------------------------------------------------- cluster
if "$cluster" status >/dev/null 2>&1; then
  log "cluster already running: it stays up afterwards"
else
  log "starting the cluster (stopped again at the end)"
  started_cluster=1
  "$cluster" up
fi
eval "$("$cluster" env)"
export KUBECONFIG

# ---------------------------------------------------------------------------- build
if [ "${BUILD:-1}" = 1 ]; then
  log "building release binaries into $CARGO_TARGET_DIR"
  cargo build --release -p tollgate -p tollgate-proxy
fi
for b in tollgate tollgate-proxy; do [ -x "$bin/$b" ] || die "no $bin/$b"; done

# ---------------------------------------------------------------------------- objects
suffix=$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
ns=route-latency-$suffix
class=tg-route-latency-$suffix
controller_name=tollgate.dev/route-latency-$suffix
gw=bench
listen_port=$(free_port)
push_port=$(free_port)
metrics_port=$(free_port)
admin_port=$(free_port)
log "namespace $ns, class $class, listener 127.0.0.1:$listen_port, push 127.0.0.1:$push_port"

kubectl apply --server-side --field-manager=route-latency -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $ns}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: $class}
spec: {controllerName: $controller_name}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: $gw, namespace: $ns}
spec:
  gatewayClassName: $class
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners: [{name: http, port: $listen_port, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: $ns}
spec: {ports: [{port: 80, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-1, namespace: $ns, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: "", port: 8080, protocol: TCP}]
endpoints: [{addresses: [192.0.2.1], conditions: {ready: true}}]
EOF

# ---------------------------------------------------------------------------- controller
debounce=()
[ -z "${DEBOUNCE_MS:-}" ] || debounce=(--debounce-ms "$DEBOUNCE_MS")
RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$bin/tollgate" controller \
  --kubeconfig "$KUBECONFIG" --namespace "$ns" --id bench \
  --controller-name "$controller_name" --provision=false \
  --push-addr "127.0.0.1:$push_port" --controller-url "https://127.0.0.1:$push_port" \
  --metrics-addr "127.0.0.1:$metrics_port" "${debounce[@]}" \
  >"$work/controller.log" 2>&1 </dev/null &
pids+=($!)
wait_for 60 "controller /readyz" curl -fsS "http://127.0.0.1:$metrics_port/readyz"

secret=$gw-tollgate-proxy-tls
wait_for 60 "Secret $ns/$secret" kubectl get secret -n "$ns" "$secret"
mkdir -p "$work/tls" "$work/state"
for k in tls.crt tls.key ca.crt; do
  kubectl get secret -n "$ns" "$secret" -o "jsonpath={.data.${k//./\\.}}" | base64 -d >"$work/tls/$k"
  [ -s "$work/tls/$k" ] || die "Secret $ns/$secret has no $k"
done

# ---------------------------------------------------------------------------- proxy
RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$bin/tollgate-proxy" \
  --controller "https://127.0.0.1:$push_port" --gateway "$ns/$gw" \
  --tls-dir "$work/tls" --state-dir "$work/state" --id bench-proxy \
  --admin "127.0.0.1:$admin_port" --access-log false \
  >"$work/proxy.log" 2>&1 </dev/null &
pids+=($!)
wait_for 60 "proxy /readyz" curl -fsS "http://127.0.0.1:$admin_port/readyz"
# The listener is bound once the table is applied: an unknown path answers 404.
wait_for 30 "the proxy listener" curl -s -o /dev/null "http://127.0.0.1:$listen_port/"

# ---------------------------------------------------------------------------- measure
log "measuring: N=$N, background routes: $BACKGROUND; $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# route-latency: apply (one persistent API connection) -> proxy serves the path; $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD), $(nproc) cores, debounce ${DEBOUNCE_MS:-default}, gap ${GAP_MS:-500} ms"
# shellcheck disable=SC2086 # BACKGROUND is a list of counts
python3 "$root/e2e/bench/route-latency.py" "$KUBECONFIG" "$ns" "$gw" "$listen_port" "$work/state" "$N" $BACKGROUND &
pids+=($!)
wait "$!" # in the background so that INT/TERM reach the trap at once
