#!/usr/bin/env bash
# The control plane at scale (issue 32's goals): ROUTES HTTPRoutes (default 50,000) over
# NAMESPACES namespaces (1,000) and GATEWAYS Gateways (100) on the loopback API server
# (e2e/cluster.sh), one `tollgate controller` (release build, --provision=false, its own
# GatewayClass and controllerName) compiling them all, and one `tollgate-proxy` subscribed to
# the first Gateway (ROUTES/GATEWAYS routes) as provisioned proxies are. scale.py creates the
# objects and prints, phase by phase:
#   create/settle  time to create everything and for every status to be written; the
#                  controller's resident memory then;
#   latency        CHANGES (200) route changes, one at a time after GAP_MS (300) idle: change
#                  to served by the proxy and change to status written, p50/p90/p99/max;
#   churn          CHURN (10,000) further route changes over every namespace; resident
#                  memory again and its growth;
#   restart        the controller stopped and started: start to /readyz, and status writes
#                  from start to Ready + QUIET_S (10) seconds, by its own counter and by a
#                  watch on every HTTPRoute (0 is the goal: a restart rewrites nothing).
# Then the goals it checks (a missed goal is reported, and the script exits 1).
# Nothing leaves loopback: the routes' backend endpoint (192.0.2.1, TEST-NET-1) is never
# contacted, and the timed route answers with a RequestRedirect from the proxy itself.
#
# Usage: e2e/bench/scale.sh
# Env:   ROUTES, NAMESPACES, GATEWAYS, CHANGES, CHURN, GAP_MS, THREADS, QUIET_S (scale.py);
#        BUILD=0 uses the release binaries already in $CARGO_TARGET_DIR/release (or BIN=DIR);
#        KEEP=1 keeps the work directory and the objects.
# The cluster is started if it is not running, and stopped at the end only in that case; a
# cluster of its own: TOLLGATE_CLUSTER_DIR=/tmp/scale-cluster TOLLGATE_APISERVER_PORT=6543
# TOLLGATE_ETCD_PORT=2479 TOLLGATE_ETCD_PEER_PORT=2480 e2e/bench/scale.sh
# A full run (50k routes) takes 15-25 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
bin=${BIN:-$CARGO_TARGET_DIR/release}
cluster=$root/e2e/cluster.sh
work=$(mktemp -d /tmp/tollgate-scale.XXXXXX)
pids=()
started_cluster=0
prefix=""
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
  [ ! -s "$work/controller.pid" ] || pids+=("$(cat "$work/controller.pid")")
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    log "kept: work directory $work, namespaces $prefix-*"
  else
    if [ -n "$prefix" ]; then
      kubectl get namespaces -o name | grep "^namespace/$prefix-" |
        xargs -r -n 200 kubectl delete --wait=false >/dev/null 2>&1 || true
    fi
    [ -z "$class" ] || kubectl delete gatewayclass "$class" --wait=false >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
  if [ "$started_cluster" = 1 ]; then "$cluster" down || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() {
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what"
    sleep 0.2
  done
}
rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

for t in curl python3 kubectl; do command -v "$t" >/dev/null || die "$t is required"; done

if "$cluster" status >/dev/null 2>&1; then
  log "cluster already running: it stays up afterwards"
else
  log "starting the cluster (stopped again at the end)"
  started_cluster=1
  "$cluster" up
fi
eval "$("$cluster" env)"
export KUBECONFIG

if [ "${BUILD:-1}" = 1 ] && [ -z "${BIN:-}" ]; then
  log "building release binaries into $CARGO_TARGET_DIR"
  cargo build --release -p tollgate -p tollgate-proxy
fi
for b in tollgate tollgate-proxy; do [ -x "$bin/$b" ] || die "no $bin/$b"; done

suffix=$(od -An -N2 -tx2 /dev/urandom | tr -d ' ')
prefix=scale$suffix
class=tg-scale-$suffix
controller_name=tollgate.dev/scale-$suffix
own_ns=$prefix-system
listen_port=$(free_port)
push_port=$(free_port)
metrics_port=$(free_port)
admin_port=$(free_port)
log "prefix $prefix, class $class, first Gateway's listener 127.0.0.1:$listen_port"
kubectl apply --server-side --field-manager=scale -f - >/dev/null <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: $class}
spec: {controllerName: $controller_name}
YAML

cmd=("$bin/tollgate" controller --kubeconfig "$KUBECONFIG" --namespace "$own_ns" --id scale
  --controller-name "$controller_name" --provision=false
  --push-addr "127.0.0.1:$push_port" --controller-url "https://127.0.0.1:$push_port"
  --metrics-addr "127.0.0.1:$metrics_port")
RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "${cmd[@]}" >"$work/controller.log" 2>&1 </dev/null &
pids+=($!)
controller_pid=$!
wait_for 120 "controller /readyz" curl -fsS "http://127.0.0.1:$metrics_port/readyz"

# The first Gateway's proxy: its client certificate is issued once the Gateway exists, so
# scale.py creates the objects while this waits for the Secret in the background.
first_ns=$prefix-0000
secret=gw-000-tollgate-proxy-tls
start_proxy() {
  wait_for 600 "Secret $first_ns/$secret" kubectl get secret -n "$first_ns" "$secret"
  mkdir -p "$work/tls" "$work/state"
  for k in tls.crt tls.key ca.crt; do
    kubectl get secret -n "$first_ns" "$secret" -o "jsonpath={.data.${k//./\\.}}" | base64 -d >"$work/tls/$k"
  done
  RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 exec "$bin/tollgate-proxy" \
    --controller "https://127.0.0.1:$push_port" --gateway "$first_ns/gw-000" \
    --tls-dir "$work/tls" --state-dir "$work/state" --id scale-proxy \
    --admin "127.0.0.1:$admin_port" --access-log false >"$work/proxy.log" 2>&1 </dev/null
}
start_proxy &
pids+=($!)
proxy_pid=$!

log "measuring: ROUTES=${ROUTES:-50000} NAMESPACES=${NAMESPACES:-1000} GATEWAYS=${GATEWAYS:-100}; $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# scale: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD), $(nproc) cores"
SCALE_PREFIX=$prefix SCALE_CLASS=$class SCALE_CONTROLLER_NAME=$controller_name \
  SCALE_LISTEN_PORT=$listen_port SCALE_METRICS_PORT=$metrics_port \
  SCALE_CONTROLLER_PID=$controller_pid SCALE_CONTROLLER_LOG=$work/controller.log \
  SCALE_CONTROLLER_CMD=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${cmd[@]}") \
  python3 "$root/e2e/bench/scale.py" "$KUBECONFIG" "$work/controller.pid" | tee "$work/figures" &
pids+=($!)
wait "$!"
[ -s "$work/controller.pid.json" ] || die "scale.py did not finish"
proxy_rss=$(rss "$proxy_pid")
echo "proxy of the first Gateway: rss $proxy_rss MB"

python3 - "$work/controller.pid.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
def p99(xs):
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)] if xs else float("inf")
goals = [
    ("controller rss after settling <= 350 MB", r["rss_settled"] <= 350),
    ("controller rss after churn <= 350 MB", r["rss_churned"] <= 350),
    ("controller rss flat within 10% over the churn", r["rss_churned"] <= r["rss_settled"] * 1.10),
    ("change -> served p99 <= 300 ms", p99(r["served"]) <= 300),
    ("change -> status written p99 <= 1000 ms", p99(r["written"]) <= 1000),
    ("controller restart to Ready <= 20 s", r["to_ready"] <= 20),
    ("no status written on restart", r["restart_writes"] == 0 and r["restart_events"] == 0),
]
ok = True
for what, held in goals:
    print(f"goal {'held' if held else 'MISSED'}: {what}")
    ok = ok and held
sys.exit(0 if ok else 1)
PY
