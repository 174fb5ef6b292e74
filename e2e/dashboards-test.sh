#!/usr/bin/env bash
# e2e/dashboards-test.sh — the chart's Grafana dashboards checked against a real Prometheus
# scraping the loopback cluster (`e2e/cluster.sh up --full`):
#
# 1. The Prometheus Operator's ServiceMonitor and PodMonitor CRDs (e2e/prometheus.sh crds)
#    are applied, and the chart is installed with metrics.serviceMonitor, metrics.podMonitor
#    and metrics.dashboards enabled, so the API server validates the monitors and the
#    dashboard ConfigMaps exist.
# 2. A Gateway (HTTP, and a TLS listener terminating with a self-signed certificate) serves
#    echo-basic through its provisioned proxy pod: an AuthPolicy (API keys) and a
#    RateLimitPolicy with Redis storage (a redis-server on the host's pod-network address
#    10.244.0.1) on one route, a ClientPolicy compressing responses, a route whose Service
#    points at a port nothing listens on (upstream errors), one to a missing Service (a
#    Warning Event).
# 3. The scrape targets are what the installed monitors select on the cluster
#    (e2e/dashboards-check.py scrape-config: the Services and pods of their selectors, the
#    named ports, the PodMonitor's `gateway` relabeling), so a selector that misses the
#    controller or the proxy pod fails here. Prometheus (e2e/prometheus.sh, built from its Go
#    module) runs on the host and scrapes the pod IPs every second.
# 4. Traffic: plain and compressed requests, a request without a key (401), keyed ones up
#    to the limit and past it (429), 502s, a TLS request; then Redis is stopped and a keyed
#    request is counted with local counters (Redis errors, fallback 1).
# 5. Every panel query of every dashboard (read from the installed ConfigMaps) is asked of
#    Prometheus's /api/v1/query with $namespace and $gateway set to this test's; the test
#    fails naming each panel whose query errs or returns no data, and each template
#    variable whose label_values() lacks this test's namespace or Gateway.
#
# Needs a running `up --full` cluster (skips, exit 0, without one; fails then under
# TOLLGATE_REQUIRE_FULL=1), redis-server, openssl and python3. Builds tollgate and
# tollgate-proxy (debug) and Prometheus (cached; e2e/prometheus.sh gives the cold time).
# KEEP=1 leaves the namespaces, the CRDs and Prometheus's directory for a look.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}
RELEASE=tg-dash
SYSTEM_NS=tg-dash-system
NS=tg-dash
TIMEOUT=${TOLLGATE_DASHBOARDS_TIMEOUT:-120}
# The host's address on the pod network (e2e/full.sh's BRIDGE_IP): pods reach the host there.
HOST_FOR_PODS=10.244.0.1

log() { printf '[dashboards %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

# shellcheck source=e2e/full-lib.sh
source "$E2E/full-lib.sh"
require_full_cluster
command -v redis-server >/dev/null || die "redis-server is required (apt-get install redis-server)"
prometheus_bin=$("$E2E/prometheus.sh" path)
crds_dir=$("$E2E/prometheus.sh" crds)

WORK=$(mktemp -d /tmp/tollgate-dashboards.XXXXXX)
redis_pid="" prom_pid=""

# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  local rc=$?
  if ((rc != 0)); then
    kubectl -n "$NS" get gateway,httproute,tlsroute,authpolicy,ratelimitpolicy,pods -o wide >&2 2>/dev/null || true
    kubectl -n "$SYSTEM_NS" logs "deploy/$RELEASE-tollgate-controller" --tail 30 >&2 || true
    [[ -f $WORK/prometheus.log ]] && tail -n 20 "$WORK/prometheus.log" >&2
  fi
  [[ -z $prom_pid ]] || kill "$prom_pid" 2>/dev/null || true
  [[ -z $redis_pid ]] || kill "$redis_pid" 2>/dev/null || true
  if [[ ${KEEP:-} != 1 ]]; then
    kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    kubectl wait --for=delete "namespace/$NS" --timeout=120s >/dev/null 2>&1 || true
    "$E2E/helm.sh" uninstall "$RELEASE" -n "$SYSTEM_NS" --wait --timeout 120s >/dev/null 2>&1 || true
    kubectl delete namespace "$SYSTEM_NS" --timeout=120s >/dev/null 2>&1 || true
    kubectl delete -f "$crds_dir" --ignore-not-found >/dev/null 2>&1 || true
    [[ -n $prom_pid ]] && wait "$prom_pid" 2>/dev/null
    rm -rf "$WORK"
  else
    log "KEEP=1: left $NS, $SYSTEM_NS, the monitoring.coreos.com CRDs and $WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for ns in "$NS" "$SYSTEM_NS"; do
  kubectl wait --for=delete "namespace/$ns" --timeout=180s >/dev/null 2>&1 || true
done

# --- Redis for the rate-limit counters, where the proxy pods reach the host (the bridge
# address: no protected mode, which would refuse every client not on loopback) ---------
redis_port=$(free_port)
redis-server --bind "$HOST_FOR_PODS" --port "$redis_port" --protected-mode no --save "" --appendonly no \
  --daemonize no >"$WORK/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 1 50); do
  redis-cli -h "$HOST_FOR_PODS" -p "$redis_port" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -h "$HOST_FOR_PODS" -p "$redis_port" ping 2>/dev/null | grep -q PONG || die "redis-server did not start: $(cat "$WORK/redis.log")"
log "redis-server on $HOST_FOR_PODS:$redis_port"

# --- the chart with its monitors and dashboards ----------------------------------------
kubectl apply --server-side -f "$crds_dir" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$crds_dir" >/dev/null
kubectl create namespace "$SYSTEM_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "helm install charts/tollgate into $SYSTEM_NS (monitors and dashboards on, Redis rate-limit storage)"
"$E2E/helm.sh" upgrade --install "$RELEASE" "$ROOT/charts/tollgate" -n "$SYSTEM_NS" \
  --set controller.replicas=1 \
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set "metrics.podMonitor.gatewayClasses={tollgate}" --set metrics.dashboards.enabled=true \
  --set proxy.rateLimit.storage=redis --set "proxy.rateLimit.redisUrl=redis://$HOST_FOR_PODS:$redis_port" \
  --wait --timeout "${TIMEOUT}s" >/dev/null

# The dashboards as Grafana's sidecar finds them: ConfigMaps with the label.
mkdir -p "$WORK/dashboards"
cms=$(kubectl -n "$SYSTEM_NS" get configmaps -l grafana_dashboard=1 -o name)
[[ $(wc -w <<<"$cms") == 2 ]] || die "want 2 dashboard ConfigMaps labelled grafana_dashboard=1, got: $cms"
for cm in $cms; do
  kubectl -n "$SYSTEM_NS" get "$cm" -o json |
    python3 -c 'import json,sys; d=json.load(sys.stdin)["data"]; [open(sys.argv[1]+"/"+k,"w").write(v) for k,v in d.items()]' "$WORK/dashboards"
done
for f in proxy controller; do
  python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' \
    "$WORK/dashboards/tollgate-$f.json" "$ROOT/charts/tollgate/dashboards/$f.json" ||
    die "ConfigMap tollgate-$f.json is not charts/tollgate/dashboards/$f.json"
done
log "dashboard ConfigMaps: $(tr '\n' ' ' <<<"$cms")"

# --- the Gateway and its routes and policies -------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj /CN=tls.example.test -addext subjectAltName=DNS:tls.example.test \
  -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS" create secret tls tls-cert --cert "$WORK/tls.crt" --key "$WORK/tls.key" >/dev/null
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: echo
        image: gcr.io/k8s-staging-gateway-api/echo-basic:v20251204-v1.4.1
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        readinessProbe: {tcpSocket: {port: 3000}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: 3000}]
---
# The echo pod, on a port nothing listens on: every request is an upstream connect error.
apiVersion: v1
kind: Service
metadata: {name: refused}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: 3999}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: http, protocol: HTTP, port: 8080, allowedRoutes: {namespaces: {from: Same}}}
  - name: tls
    protocol: TLS
    port: 8443
    hostname: tls.example.test
    tls: {mode: Terminate, certificateRefs: [{kind: Secret, name: tls-cert}]}
    allowedRoutes: {namespaces: {from: Same}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: open}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules: [{matches: [{path: {type: PathPrefix, value: /open}}], backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: keyed}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules: [{matches: [{path: {type: PathPrefix, value: /keyed}}], backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: broken}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules: [{matches: [{path: {type: PathPrefix, value: /broken}}], backendRefs: [{name: refused, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: tls}
spec:
  parentRefs: [{name: gw, sectionName: tls}]
  hostnames: [tls.example.test]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: keys}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: keyed}]
  rules:
    authentication:
      api-keys:
        apiKey: {selector: {matchLabels: {app: dash}}}
        credentials: {customHeader: {name: X-API-Key}}
---
apiVersion: v1
kind: Secret
metadata:
  name: alice
  labels: {app: dash, tollgate.dev/credential: "true"}
stringData: {api_key: alice-key}
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: per-key}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: keyed}]
  limits:
    per-key:
      rates: [{limit: 3, window: 1m}]
      counters: [{expression: "request.headers['x-api-key']"}]
---
apiVersion: tollgate.dev/v1alpha1
kind: ClientPolicy
metadata: {name: compress}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw}]
  compression: {minBytes: 0}
YAML
addr=$(lb_address "$NS" gw "$TIMEOUT")
log "Gateway Programmed at $addr"

# code URL [CURL ARGS...]: the status curl gets.
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" || true; }
# The proxy serves the table with the policies once /keyed refuses a request without a key.
deadline=$((SECONDS + TIMEOUT))
until [[ $(code "http://$addr:8080/open") == 200 && $(code "http://$addr:8080/keyed") == 401 ]]; do
  ((SECONDS < deadline)) || die "http://$addr:8080/open never answered 200 with /keyed 401"
  sleep 0.2
done

# --- Prometheus, scraping what the monitors select -------------------------------------
python3 "$E2E/dashboards-check.py" scrape-config "$SYSTEM_NS" "$WORK/prometheus.yml" >&2
prom_port=$(free_port)
"$prometheus_bin" --config.file "$WORK/prometheus.yml" --storage.tsdb.path "$WORK/data" \
  --web.listen-address "127.0.0.1:$prom_port" >"$WORK/prometheus.log" 2>&1 &
prom_pid=$!
PROM=http://127.0.0.1:$prom_port
# up_targets: how many targets Prometheus has scraped successfully.
up_targets() { curl -fsS "$PROM/api/v1/query" --data-urlencode 'query=count(up == 1)' 2>/dev/null |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null || echo 0; }
want=$(python3 -c 'import json,sys; print(sum(len(s["targets"]) for j in json.load(open(sys.argv[1]))["scrape_configs"] for s in j["static_configs"]))' "$WORK/prometheus.yml")
deadline=$((SECONDS + TIMEOUT))
until [[ $(up_targets) == "$want" ]]; do
  kill -0 "$prom_pid" 2>/dev/null || die "Prometheus exited: $(tail -n 20 "$WORK/prometheus.log")"
  ((SECONDS < deadline)) || die "Prometheus scrapes $(up_targets) of $want targets: $(curl -s "$PROM/api/v1/targets")"
  sleep 0.5
done
log "Prometheus $PROM scrapes all $want targets"

# --- traffic, after the first scrapes so that every rate sees it -----------------------
# A route to a Service that does not exist: a reconcile, a status write and a Warning Event
# now, inside the dashboards' windows.
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: missing}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules: [{matches: [{path: {type: PathPrefix, value: /missing}}], backendRefs: [{name: nope, port: 8080}]}]
YAML
for _ in $(seq 1 20); do
  [[ $(code "http://$addr:8080/open") == 200 ]] || die "/open did not answer 200"
done
enc=$(curl -s -o /dev/null -w '%header{content-encoding}' -H 'Accept-Encoding: gzip' "http://$addr:8080/open/compressed")
[[ $enc == gzip ]] || die "a response to Accept-Encoding: gzip came with Content-Encoding '$enc'"
for _ in $(seq 1 5); do
  curl -s -o /dev/null -H 'Accept-Encoding: zstd' "http://$addr:8080/open/compressed"
done
[[ $(code "http://$addr:8080/keyed") == 401 ]] || die "/keyed without a key did not answer 401"
got=""
for _ in $(seq 1 5); do got+="$(code -H 'X-API-Key: alice-key' "http://$addr:8080/keyed") "; done
[[ $got == "200 200 200 429 429 " ]] || die "keyed requests past a limit of 3 answered: $got"
for _ in $(seq 1 3); do
  [[ $(code "http://$addr:8080/broken") == 502 ]] || die "/broken (nothing listening) did not answer 502"
done
tls=$(code --cacert "$WORK/tls.crt" --resolve "tls.example.test:8443:$addr" https://tls.example.test:8443/tls)
[[ $tls == 200 ]] || die "the TLS listener answered '$tls'"
deadline=$((SECONDS + TIMEOUT))
until [[ $(kubectl -n "$NS" get httproute missing -o jsonpath='{.status.parents[0].conditions[?(@.type=="ResolvedRefs")].reason}') == BackendNotFound ]]; do
  ((SECONDS < deadline)) || die "the route to a missing Service never reported BackendNotFound"
  sleep 0.2
done
# Redis gone: the limit is enforced with local counters, the failures are counted.
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
redis_pid=""
for _ in $(seq 1 3); do
  c=$(code -H 'X-API-Key: alice-key' "http://$addr:8080/keyed")
  [[ $c == 200 || $c == 429 ]] || die "a keyed request with Redis down answered $c"
done
log "traffic sent: 200, compressed, 401, 429, 502, TLS; Redis stopped"

# Three scrapes after the last request (scrape interval 1 s), then every panel.
sleep 4
python3 "$E2E/dashboards-check.py" queries "$PROM" "$WORK/dashboards/tollgate-proxy.json" -- \
  namespace="$NS" gateway=gw || die "a proxy dashboard query returned no data (above)"
python3 "$E2E/dashboards-check.py" queries "$PROM" "$WORK/dashboards/tollgate-controller.json" -- \
  namespace="$SYSTEM_NS" || die "a controller dashboard query returned no data (above)"
log "PASS: every panel of both dashboards has data from the cluster's controller and proxy"
