#!/usr/bin/env bash
# Failover: one of three endpoints killed under load. What the clients saw (errors, and when;
# latency, and right after the kill) and how soon the endpoint took its share again after it
# came back, for Tollgate, nginx and HAProxy in the same run.
#
# For each round and each contender in turn (tollgate, nginx, haproxy; again; ...): three
# fresh backends, each its own single-process nginx (master_process off, so one SIGKILL ends
# it) on 127.0.0.1:19180-19182, answering 200 "ok" and logging every request with its
# millisecond time ($msec) and User-Agent; the contender in front (one worker or thread, CPU 0);
# wrk (one thread, CONNS keep-alive connections) and the backends on CPU 1. The contender must
# answer, and a warm-up of WARMUP seconds must reach every endpoint with at least a fifth of the
# requests, before the timeline: steady load for DURATION seconds; at KILL_AT seconds SIGKILL
# endpoint 2 (19181); at RESTART_AT seconds start it again; wrk stops at DURATION.
#
# What each contender does about a dead endpoint (as equivalent as the products allow; the
# report says where they differ):
#   tollgate  HTTPRoute retry {attempts: 2, backoff: 25ms, codes: [502, 503]}; a BackendPolicy:
#             RoundRobin, outlierDetection {consecutiveGatewayErrors: 3, baseEjectionTime: 10s,
#             interval: 10s, maxEjectionPercent: 50}, an HTTP health check of / every 1s
#             (timeout 500ms, unhealthy after 2, healthy after 1), connectTimeout 1s
#   nginx     round robin, max_fails=1 fail_timeout=10s, proxy_next_upstream error timeout
#             http_502 http_503, proxy_next_upstream_tries 3, keepalive, HTTP/1.1 upstream
#   haproxy   balance roundrobin, retries 2, option redispatch 1, retry-on conn-failure
#             empty-response response-timeout 502 503, option httpchk GET / with check inter 1s
#             fall 2 rise 1 (timeout check 500ms), observe layer4 error-limit 3 on-error
#             mark-down, http-reuse safe
#
# Clients: every non-2xx answer with its time (wrk's Lua response hook, failover.lua); socket
# errors (connect, read, write, timeout) only as wrk's totals. Latency p50/p99/max over the
# run (wrk), and over the WINDOW seconds before the kill, after it and after the restart (the
# requests sent then carry X-Seq, which the backends echo). Backends: when endpoint 2 last
# served before the kill, when it served its first client request after the restart, and when
# it first served a fair share (>= 25% of a 1-second window) again. Health-check requests are
# told apart from clients' by their User-Agent.
#
# Writes e2e/bench/results/failover-latest.md and a dated copy (+ the raw figures, .jsonl).
# Usage: e2e/bench/failover.sh   env: ROUNDS (1; medians when more), CONNS (32), WARMUP (2),
#                                     DURATION (25), KILL_AT (5), RESTART_AT (15), WINDOW (2),
#                                     CONTENDERS ("tollgate nginx haproxy"), BUILD=0 uses the
#                                     binaries in CARGO_TARGET_DIR, KEEP=1 keeps the work dir
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
ROUNDS=${ROUNDS:-1}
CONNS=${CONNS:-32}
WARMUP=${WARMUP:-2}
DURATION=${DURATION:-25}
KILL_AT=${KILL_AT:-5}
RESTART_AT=${RESTART_AT:-15}
WINDOW=${WINDOW:-2}
read -r -a contenders <<<"${CONTENDERS:-tollgate nginx haproxy}"
for n in ROUNDS CONNS WARMUP DURATION KILL_AT RESTART_AT WINDOW; do
  [[ ${!n} =~ ^[0-9]+$ ]] || { echo "$n must be a whole number" >&2; exit 2; }
done
((WINDOW <= KILL_AT && KILL_AT < RESTART_AT && RESTART_AT + WINDOW < DURATION)) ||
  { echo "need WINDOW <= KILL_AT < RESTART_AT and RESTART_AT + WINDOW < DURATION" >&2; exit 2; }
for c in "${contenders[@]}"; do
  case $c in tollgate | nginx | haproxy) ;; *) echo "unknown contender $c" >&2; exit 2 ;; esac
done
cache=$HOME/.cache/tollgate
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
work=$(mktemp -d /tmp/tollgate-bench-failover.XXXXXX)
raw=$work/raw.jsonl
: >"$raw"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)

PORTS=(19180 19181 19182) # endpoints 1, 2, 3; endpoint 2 is killed
KILLED=1                  # its index in PORTS
declare -A port_of=([tollgate]=18180 [nginx]=18181 [haproxy]=18182)
TOLLGATE_ADMIN=19981
HAPROXY_STATS=19982
UA=tollgate-failover-bench # the clients' User-Agent: what the backends count as client traffic

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# ------------------------------------------------------------------------------ processes
# Every process started here, by pid, while it lives; the EXIT trap ends those left.
declare -A live=()
cleanup() {
  local p
  for p in "${!live[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${!live[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM # so that cleanup runs
spawn() { # cpu command...: pinned, in the background; its pid in $last_pid
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  live[$last_pid]=1
}
stop() { # pid [signal]
  kill "-${2:-TERM}" "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  unset "live[$1]"
}
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
sleep_until() { # epoch ms
  local d=$(($1 - $(now_ms)))
  if ((d > 0)); then sleep "$(printf '%d.%03d' $((d / 1000)) $((d % 1000)))"; fi
}
wait_200() { # url: 200 within 10 s, or fail loudly
  local code=
  for _ in $(seq 1 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 -A failover-probe "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  die "never answered 200: $1 (last answer: ${code:-none})"
}

# ------------------------------------------------------------------------------ tools
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
apt_install() {
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null; }
}
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v haproxy >/dev/null || apt_install haproxy
command -v wrk >/dev/null || apt_install wrk
for t in nginx haproxy wrk curl python3 taskset; do
  command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }
done
if [ "${BUILD:-1}" = 1 ]; then
  log "building Tollgate (release)"
  cargo build --release -q -p tollgate -p tollgate-proxy
fi
# A private copy, so a build running elsewhere cannot swap the binaries mid-run.
mkdir -p "$work/bin"
cp "$CARGO_TARGET_DIR/release/tollgate" "$CARGO_TARGET_DIR/release/tollgate-proxy" "$work/bin/"
bin=$work/bin

# Nothing may listen on our ports yet: a process left from another run would answer for ours.
for p in "${PORTS[@]}" "${port_of[@]}" "$TOLLGATE_ADMIN" "$HAPROXY_STATS"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "127.0.0.1:$p is in use"; fi
done

# ------------------------------------------------------------------------------ configurations
conf=$work/conf
mkdir -p "$conf/manifests"
# shellcheck disable=SC2016 # $msec and friends are nginx's variables
backend_conf() { # port run-dir: one endpoint, a process of its own
  cat >"$2/be-$1.conf" <<CONF
master_process off;
daemon off;
pid $2/be-$1.pid;
events { worker_connections 4096; }
http {
  log_format failover '\$msec \$http_user_agent';
  access_log $2/be-$1.log failover;
  keepalive_requests 1000000;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  server {
    listen 127.0.0.1:$1;
    location / { add_header X-Seq \$http_x_seq; return 200 "ok\n"; }
  }
}
CONF
}

slices=
for i in "${!PORTS[@]}"; do
  slices+="---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-ep$((i + 1)), namespace: default, labels: {kubernetes.io/service-name: svc}}
addressType: IPv4
ports: [{name: http, port: ${PORTS[$i]}}]
endpoints: [{addresses: [\"127.0.0.1\"]}]
"
done
cat >"$conf/manifests/failover.yaml" <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tollgate}
spec: {controllerName: tollgate.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: failover, namespace: default}
spec:
  gatewayClassName: tollgate
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners: [{name: http, protocol: HTTP, port: ${port_of[tollgate]}}]
---
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: default}
spec: {ports: [{name: http, port: 80}]}
# One slice per endpoint: the three listen on one address, each on its own port.
${slices}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: failover, namespace: default}
spec:
  parentRefs: [{name: failover}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{name: svc, port: 80}]
    retry: {attempts: 2, backoff: 25ms, codes: [502, 503]}
    timeouts: {backendRequest: 5s}
---
apiVersion: tollgate.dev/v1alpha1
kind: BackendPolicy
metadata: {name: svc, namespace: default}
spec:
  targetRefs: [{group: "", kind: Service, name: svc}]
  loadBalancer: {type: RoundRobin}
  outlierDetection: {consecutiveGatewayErrors: 3, interval: 10s, baseEjectionTime: 10s, maxEjectionPercent: 50}
  healthCheck:
    active: {type: HTTP, http: {path: /}, interval: 1s, timeout: 500ms, unhealthyThreshold: 2, healthyThreshold: 1}
  connection: {connectTimeout: 1s}
YAML

servers=
for p in "${PORTS[@]}"; do servers+="    server 127.0.0.1:$p max_fails=1 fail_timeout=10s;"$'\n'; done
# shellcheck disable=SC2016 # nginx's variables
cat >"$conf/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $conf/nginx.pid;
error_log $conf/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  upstream eps {
${servers}    keepalive 64;
  }
  server {
    listen 127.0.0.1:${port_of[nginx]};
    location / {
      proxy_pass http://eps;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_next_upstream error timeout http_502 http_503;
      proxy_next_upstream_tries 3;
      proxy_connect_timeout 1s;
      proxy_read_timeout 5s;
      # Tollgate's per-request work by default (as run.sh's configurations do).
      proxy_set_header Host \$http_host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$http_host;
      proxy_set_header X-Request-Id \$request_id;
      add_header X-Request-Id \$request_id always;
    }
  }
}
CONF

servers=
for i in "${!PORTS[@]}"; do servers+="  server ep$((i + 1)) 127.0.0.1:${PORTS[$i]}"$'\n'; done
cat >"$conf/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
  # State changes of the servers (and failed or retried requests, below) with their time.
  log stderr format iso local0 info
defaults
  mode http
  log global
  option httplog
  option dontlog-normal
  timeout connect 1s
  timeout client 30s
  timeout server 5s
  timeout check 500ms
  timeout http-keep-alive 30s
  option forwardfor
  http-reuse safe
frontend fe
  bind 127.0.0.1:${port_of[haproxy]}
  unique-id-format %[uuid()]
  unique-id-header X-Request-Id
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-response set-header X-Request-Id %[unique-id]
  default_backend eps
backend eps
  balance roundrobin
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response response-timeout 502 503
  option httpchk GET /
  default-server check inter 1s fall 2 rise 1 observe layer4 error-limit 3 on-error mark-down
${servers}frontend stats
  bind 127.0.0.1:${HAPROXY_STATS}
  option dontlog-normal
  stats enable
  stats uri /stats
CONF

# Every configuration must be one its product accepts, and Tollgate's objects all Accepted.
"$bin/tollgate" validate "$conf/manifests" >"$conf/validate.txt" 2>&1 ||
  { cat "$conf/validate.txt" >&2; die "tollgate validate rejected the manifests"; }
# Every condition as it should be, and the BackendPolicy among the objects, Accepted.
awk '/^[^ ]/ {obj = $0} /BackendPolicy default\/svc/ {bp = 1}
  obj ~ /^BackendPolicy default\/svc/ && /Accepted=True/ {bpok = 1}
  /(Accepted|ResolvedRefs|Programmed)=(False|Unknown)|Conflicted=True/ {bad = 1; print "bad: " obj ": " $0}
  END {if (!bp) print "no BackendPolicy default/svc"; exit (bad || !bpok)}' "$conf/validate.txt" >&2 ||
  { cat "$conf/validate.txt" >&2; die "tollgate validate: not everything is Accepted"; }
"$bin/tollgate" compile "$conf/manifests" --out "$conf/table" >/dev/null
table=$conf/table/default.failover.json
python3 - "$table" "${PORTS[@]}" <<'EOF' || die "the compiled table lacks the failover settings"
import json, sys
t = json.load(open(sys.argv[1]))
(route,) = [r for p in t["ports"] for l in p["listeners"] for v in l["virtualHosts"] for r in v["routes"]]
(b,) = t["backends"].values()
s = b["settings"]
got = {
    "retry": route.get("retry"),
    "endpoints": [e["port"] for e in b["endpoints"]],
    "loadBalancer": b["loadBalancer"],
    "outlier": s.get("outlier"),
    "healthCheck": {k: v for k, v in s.get("healthCheck", {}).items() if k != "probe"},
    "probe path": s.get("healthCheck", {}).get("probe", {}).get("http", {}).get("path"),
}
want = {
    "retry": {"attempts": 2, "backoffMs": 25, "codes": [502, 503]},
    "endpoints": [int(p) for p in sys.argv[2:]],
    "loadBalancer": "round-robin",
    "outlier": {"consecutiveGatewayErrors": 3, "intervalMs": 10000, "baseEjectionMs": 10000, "maxEjectionPercent": 50},
    "healthCheck": {"intervalMs": 1000, "timeoutMs": 500, "unhealthyThreshold": 2, "healthyThreshold": 1},
    "probe path": "/",
}
bad = {k: got[k] for k in want if got[k] != want[k]}
if bad:
    sys.exit(f"{sys.argv[1]}: {bad}")
EOF
nginx -t -q -e "$conf/nginx-t.log" -c "$conf/nginx.conf" 2>&1 || die "nginx -t"
backend_conf "${PORTS[0]}" "$conf" # the report shows it
nginx -t -q -e "$conf/nginx-t.log" -c "$conf/be-${PORTS[0]}.conf" 2>&1 || die "nginx -t (endpoint)"
haproxy -c -q -f "$conf/haproxy.cfg" || die "haproxy -c"

# ------------------------------------------------------------------------------ one timeline
declare -A be_pid=()
start_backend() { # index run-dir
  local p=${PORTS[$1]}
  spawn 1 nginx -e "$2/be-$p.err" -c "$2/be-$p.conf"
  be_pid[$1]=$last_pid
}
start_contender() { # name run-dir
  case $1 in
  tollgate)
    spawn 0 "$bin/tollgate-proxy" --table "$table" --workers 1 --access-log false \
      --admin "127.0.0.1:$TOLLGATE_ADMIN" >"$2/contender.log" 2>&1
    ;;
  nginx) spawn 0 nginx -e "$2/contender.log" -c "$conf/nginx.conf" ;;
  haproxy) spawn 0 haproxy -db -f "$conf/haproxy.cfg" >"$2/contender.log" 2>&1 ;;
  esac
  contender_pid=$last_pid
}
# What the contender counted itself (retries, ejections, checks), after the timeline.
contender_counts() { # name run-dir
  case $1 in
  tollgate) curl -s --max-time 5 "http://127.0.0.1:$TOLLGATE_ADMIN/metrics" >"$2/metrics.txt" || true ;;
  haproxy) curl -s --max-time 5 "http://127.0.0.1:$HAPROXY_STATS/stats;csv" >"$2/stats.csv" || true ;;
  nginx) cp "$conf/nginx-error.log" "$2/nginx-error.log" 2>/dev/null || true ;;
  esac
}

timeline() { # contender round
  local c=$1 r=$2 d=$work/runs/r$2-$1 i url t0 kill_plan restart_plan wrk_pid t_kill t_restart t_up
  mkdir -p "$d"
  url="http://127.0.0.1:${port_of[$c]}/"
  for i in "${!PORTS[@]}"; do
    backend_conf "${PORTS[$i]}" "$d"
    start_backend "$i" "$d"
  done
  for i in "${!PORTS[@]}"; do wait_200 "http://127.0.0.1:${PORTS[$i]}/"; done
  [ "$c" != nginx ] || : >"$conf/nginx-error.log"
  start_contender "$c" "$d"
  wait_200 "$url"
  kill -0 "$contender_pid" 2>/dev/null || die "$c exited: $(tail -5 "$d/contender.log")"

  # Warm-up; every endpoint must have had at least a fifth of its requests.
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${WARMUP}s" -H "User-Agent: $UA" "$url" >"$d/warmup.txt"
  python3 "$bench/failover.py" spread "$d" "$UA" "${PORTS[@]}" >"$d/spread.txt" ||
    die "$c: the warm-up did not spread over the three endpoints: $(cat "$d/spread.txt")"
  log "r$r $c: warm-up $(awk '/^Requests\/sec/ {print $2}' "$d/warmup.txt") req/s, spread $(cat "$d/spread.txt")"

  t0=$(now_ms)
  kill_plan=$((t0 + KILL_AT * 1000))
  restart_plan=$((t0 + RESTART_AT * 1000))
  # Latency windows, with a margin for when the kill and the restart really happen.
  FAILOVER_SUMMARY=$d/summary.txt FAILOVER_UNMATCHED=$d/unmatched.txt \
    spawn 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 2s -H "User-Agent: $UA" \
    -s "$bench/failover.lua" "$url" -- "$d/errors.txt" "$d/latencies.txt" \
    $((kill_plan - WINDOW * 1000 - 100)) $((kill_plan + WINDOW * 1000 + 300)) \
    $((restart_plan - 100)) $((restart_plan + WINDOW * 1000 + 300)) >"$d/wrk.txt"
  wrk_pid=$last_pid
  sleep_until "$kill_plan"
  t_kill=$(now_ms)
  stop "${be_pid[$KILLED]}" KILL
  sleep_until "$restart_plan"
  t_restart=$(now_ms)
  start_backend "$KILLED" "$d"
  # When it listens again (a connect every 5 ms; nothing is sent).
  t_up=
  for _ in $(seq 1 400); do
    if (exec 3<>"/dev/tcp/127.0.0.1/${PORTS[$KILLED]}") 2>/dev/null; then t_up=$(now_ms); break; fi
    sleep 0.005
  done
  wait "$wrk_pid" || die "$c: wrk failed: $(cat "$d/wrk.txt")"
  unset "live[$wrk_pid]"
  contender_counts "$c" "$d"
  stop "$contender_pid"
  for i in "${!PORTS[@]}"; do stop "${be_pid[$i]}"; done
  printf 't0=%s\nkill=%s\nrestart=%s\nup=%s\nend=%s\n' "$t0" "$t_kill" "$t_restart" "$t_up" \
    $((t0 + DURATION * 1000)) >"$d/timeline.txt"
  [ -s "$d/summary.txt" ] || die "$c: wrk wrote no summary: $(cat "$d/wrk.txt")"
  python3 "$bench/failover.py" analyze "$d" "$c" "$r" "$UA" "${PORTS[@]}" --killed "$KILLED" \
    --window "$WINDOW" >>"$raw" || die "$c: could not analyse round $r"
  log "r$r $c: $(tail -1 "$raw" | python3 "$bench/failover.py" brief)"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  for c in "${contenders[@]}"; do timeline "$c" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

reproduce="ROUNDS=$ROUNDS CONNS=$CONNS"
for n in WARMUP DURATION KILL_AT RESTART_AT WINDOW; do
  def=$(case $n in WARMUP) echo 2 ;; DURATION) echo 25 ;; KILL_AT) echo 5 ;; RESTART_AT) echo 15 ;; WINDOW) echo 2 ;; esac)
  [ "${!n}" = "$def" ] || reproduce+=" $n=${!n}"
done
[ "${contenders[*]}" = "tollgate nginx haproxy" ] || reproduce+=" CONTENDERS=\"${contenders[*]}\""
reproduce+=" e2e/bench/failover.sh"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit+=" (with uncommitted changes)"
[ "${BUILD:-1}" = 1 ] || commit+=", binaries built before the run (BUILD=0)"
versions="$(nginx -v 2>&1 | sed 's/.*version: //'); HAProxy $(haproxy -v | awk 'NR == 1 {print $3}'); $( (wrk -v 2>&1 || true) | awk 'NR == 1 {print $1, $2}')"

mkdir -p "$bench/results"
dated=$bench/results/failover-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 "$bench/failover.py" report "$raw" --conf "$conf" --started "$started" --rounds "$ROUNDS" \
  --conns "$CONNS" --timeline "$WARMUP $DURATION $KILL_AT $RESTART_AT $WINDOW" \
  --load "$load_before" --load-after "$load_after" --reproduce "$reproduce" --commit "$commit" \
  --versions "$versions" --contenders "${contenders[*]}" >"$dated"
cp "$dated" "$bench/results/failover-latest.md"
cp "$raw" "${dated%.md}.jsonl"
cat "$bench/results/failover-latest.md"
