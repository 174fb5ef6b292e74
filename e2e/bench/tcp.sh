#!/usr/bin/env bash
# TCP proxying (TCPRoute) per core, against HAProxy `mode tcp` and nginx `stream` in the same
# run: new connections per proxy CPU-second (each an HTTP request with `Connection: close`,
# so every request is a connection set up, copied and torn down) and bytes per proxy
# CPU-second (keep-alive downloads of a 1 MiB file, so the copy loop dominates).
#
# Each proxy runs one worker (tollgate-proxy --workers 1, HAProxy nbthread 1, nginx
# worker_processes 1) pinned to CPU 0; the backend (one nginx worker: `/` answers "ok",
# `/big` is a 1 MiB file) and wrk share CPU 1. The contenders take turns within a round, in
# a rotated order, so drift on the machine falls on all of them; a figure is the median of
# the rounds, and a ratio the median of the per-round ratios. The proxy's CPU is read from
# /proc (schedstat) before and after the measured seconds. Tollgate runs as users run it:
# the table `tollgate compile` makes of a Gateway with a TCP listener and a TCPRoute,
# access log at its default. A measurement needs zero socket errors (wrk) to count.
# Installs nginx's stream module, HAProxy and wrk from apt when missing; builds Tollgate in
# release mode (BUILD=0 to use the last build; PROFILE=debug only checks the script).
#
# ALT_PROXY=/path/to/tollgate-proxy adds that build as a fourth contender, `alt` (a change
# weighed against the current build in the same seconds).
#
# Writes e2e/bench/results/tcp-latest.md and a dated copy.
# Usage: e2e/bench/tcp.sh     env: ROUNDS (5), SAT_SECS (4), CONNS (32), BIG_CONNS (8),
#                                  BUILD=0, KEEP=1, PROFILE (release), ALT_PROXY
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
ROUNDS=${ROUNDS:-5}
SAT_SECS=${SAT_SECS:-4}
CONNS=${CONNS:-32}
BIG_CONNS=${BIG_CONNS:-8}
PROFILE=${PROFILE:-release}
cache=$HOME/.cache/tollgate
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
work=$(mktemp -d /tmp/tollgate-bench-tcp.XXXXXX)
raw=$work/raw.tsv
: >"$raw"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
pids=()
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
spawn() { # cpu command...
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  pids+=("$last_pid")
}
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
apt_install() {
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null; }
}
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
stream_module=/usr/lib/nginx/modules/ngx_stream_module.so
[ -f $stream_module ] || apt_install libnginx-mod-stream
command -v haproxy >/dev/null || apt_install haproxy
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
# shellcheck source=e2e/bench/cpu.sh
. "$bench/cpu.sh"

if [ "${BUILD:-1}" = 1 ]; then
  log "building Tollgate ($PROFILE)"
  if [ "$PROFILE" = debug ]; then cargo build -q -p tollgate -p tollgate-proxy; else
    cargo build --profile "$PROFILE" -q -p tollgate -p tollgate-proxy; fi
fi
mkdir -p "$work/bin"
cp "$CARGO_TARGET_DIR/$PROFILE/tollgate" "$CARGO_TARGET_DIR/$PROFILE/tollgate-proxy" "$work/bin/"
bin=$work/bin

wait_up() { # port path
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1$2" || true)" = 200 ] && return 0
    sleep 0.05
  done
  echo "never answered 200 on port $1" >&2
  exit 1
}

# The backend: one nginx worker on CPU 1.
mkdir -p "$work/www"
head -c 1048576 /dev/urandom >"$work/www/big"
# nginx's worker runs unprivileged: the file and the directories above it must be readable.
chmod 755 "$work" "$work/www"
chmod 644 "$work/www/big"
cat >"$work/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/backend.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  sendfile on;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  server {
    listen 127.0.0.1:19080;
    location = /big { root $work/www; }
    location / { return 200 "ok\n"; }
  }
}
CONF
spawn 1 nginx -e "$work/backend.err" -c "$work/backend.conf"
wait_up 19080 /
wait_up 19080 /big

# Tollgate: a Gateway with one TCP listener, a TCPRoute to the backend.
mkdir -p "$work/tollgate"
cat >"$work/tollgate/manifests.yaml" <<'YAML'
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tollgate}
spec: {controllerName: tollgate.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench, namespace: default}
spec:
  gatewayClassName: tollgate
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners:
  - {name: tcp, protocol: TCP, port: 19100}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: backend, namespace: default}
spec:
  parentRefs: [{name: bench}]
  rules:
  - backendRefs: [{name: backend, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default}
spec:
  ports: [{name: http, port: 80, targetPort: 19080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: backend-1
  namespace: default
  labels: {kubernetes.io/service-name: backend}
addressType: IPv4
ports: [{name: http, port: 19080}]
endpoints: [{addresses: [127.0.0.1], conditions: {ready: true}}]
YAML
"$bin/tollgate" compile "$work/tollgate" --out "$work/tollgate/table" >/dev/null
spawn 0 "$bin/tollgate-proxy" --table "$work/tollgate/table/default.bench.json" \
  --admin 127.0.0.1:19960 --workers 1
declare -A pid_of port_of
pid_of[tollgate]=$last_pid
port_of[tollgate]=19100

cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 8000
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend tcp
  bind 127.0.0.1:19101
  default_backend backend
backend backend
  server s1 127.0.0.1:19080
CONF
spawn 0 haproxy -db -f "$work/haproxy.cfg"
pid_of[haproxy]=$last_pid
port_of[haproxy]=19101

cat >"$work/nginx.conf" <<CONF
load_module $stream_module;
worker_processes 1;
daemon off;
pid $work/nginx.pid;
events { worker_connections 8000; }
stream {
  server {
    listen 127.0.0.1:19102;
    proxy_pass 127.0.0.1:19080;
  }
}
CONF
spawn 0 nginx -e "$work/nginx.err" -c "$work/nginx.conf"
pid_of[nginx]=$last_pid
port_of[nginx]=19102
contenders=(tollgate haproxy nginx)
if [ -n "${ALT_PROXY:-}" ]; then
  sed 's/19100/19103/' "$work/tollgate/manifests.yaml" >"$work/alt.yaml"
  mkdir -p "$work/alt"
  mv "$work/alt.yaml" "$work/alt/manifests.yaml"
  "$bin/tollgate" compile "$work/alt" --out "$work/alt/table" >/dev/null
  spawn 0 "$ALT_PROXY" --table "$work/alt/table/default.bench.json" --admin 127.0.0.1:19961 --workers 1
  pid_of[alt]=$last_pid
  port_of[alt]=19103
  contenders+=(alt)
fi
for c in "${contenders[@]}"; do wait_up "${port_of[$c]}" /; done

# measure ROUND CONTENDER KIND: one measurement; KIND conns (new connection per request) or
# bytes (keep-alive downloads of /big).
measure() {
  local r=$1 c=$2 kind=$3 out=$work/out.$2.$3 args n ns errors
  if [ "$kind" = conns ]; then
    args=(-c"$CONNS" -H 'Connection: close' "http://127.0.0.1:${port_of[$c]}/")
  else
    args=(-c"$BIG_CONNS" "http://127.0.0.1:${port_of[$c]}/big")
  fi
  taskset -c 1 wrk -t1 -d1s "${args[@]}" >/dev/null # warm-up
  cpu_snap "${pid_of[$c]}" "$work/cpu0"
  taskset -c 1 wrk -t1 -d"${SAT_SECS}s" "${args[@]}" >"$out"
  cpu_snap "${pid_of[$c]}" "$work/cpu1"
  ns=$(cpu_ns "$work/cpu0" "$work/cpu1")
  n=$(awk '/requests in/ {print $1}' "$out")
  errors=$(awk '/Non-2xx/ {s += $NF} /Socket errors/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} END {print s + 0}' "$out")
  if [ -z "$n" ] || [ "$n" -eq 0 ] || [ "$errors" -ne 0 ]; then
    echo "$c $kind (round $r): $n requests, $errors errors: $(cat "$out")" >&2
    exit 1
  fi
  if [ "$kind" = conns ]; then
    printf '%s\t%s\tconns_per_core\t%s\n' "$r" "$c" "$(awk -v n="$n" -v ns="$ns" 'BEGIN {printf "%.0f", n / (ns / 1e9)}')" >>"$raw"
    printf '%s\t%s\tconns_per_s\t%s\n' "$r" "$c" "$(awk '/^Requests\/sec/ {print $2}' "$out")" >>"$raw"
  else
    # 1 MiB bodies: bytes are requests x 1 MiB (headers are noise at this size).
    printf '%s\t%s\tmib_per_core\t%s\n' "$r" "$c" "$(awk -v n="$n" -v ns="$ns" 'BEGIN {printf "%.1f", n / (ns / 1e9)}')" >>"$raw"
    printf '%s\t%s\tmib_per_s\t%s\n' "$r" "$c" "$(awk '/^Requests\/sec/ {print $2}' "$out")" >>"$raw"
  fi
  printf '%s\t%s\t%s_cpu\t%s\n' "$r" "$c" "$kind" "$(awk -v ns="$ns" -v s="$SAT_SECS" 'BEGIN {printf "%.2f", ns / 1e9 / s}')" >>"$raw"
}

for r in $(seq 1 "$ROUNDS"); do
  k=$(((r - 1) % ${#contenders[@]}))
  order=("${contenders[@]:$k}" "${contenders[@]:0:$k}")
  for c in "${order[@]}"; do
    measure "$r" "$c" conns
    measure "$r" "$c" bytes
  done
  log "round $r/$ROUNDS: $(awk -F'\t' -v r="$r" '$1 == r && ($3 == "conns_per_core" || $3 == "mib_per_core") {printf "%s %s %s; ", $2, $3, $4}' "$raw")"
done

stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
mkdir -p "$bench/results"
python3 - "$raw" "$started" "$ROUNDS" "$SAT_SECS" "$CONNS" "$BIG_CONNS" \
  "$(nginx -v 2>&1 | sed 's/.*version: //'); $(haproxy -v | head -1 | awk '{print "HAProxy " $3}'); $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}')" \
  >"$bench/results/tcp-$stamp.md" <<'PY'
import statistics, sys
from collections import defaultdict
raw, started, rounds, secs, conns, big, versions = sys.argv[1:]
v = defaultdict(dict)  # (contender, metric) -> round -> value
for line in open(raw):
    r, c, m, x = line.rstrip("\n").split("\t")
    v[(c, m)][r] = float(x)
med = lambda c, m: statistics.median(v[(c, m)].values())
def ratio(m, other):
    rs = [v[("tollgate", m)][r] / v[(other, m)][r] for r in v[("tollgate", m)] if v[(other, m)].get(r)]
    return statistics.median(rs)
print("# TCP proxying per core (TCPRoute): Tollgate, HAProxy `mode tcp`, nginx `stream`\n")
print(f"Run {started}, {rounds} rounds of {secs} s per measurement; {conns} connections for the")
print(f"connection rate (`Connection: close`: one connection per request), {big} keep-alive")
print("connections downloading a 1 MiB file for the byte rate. One worker each on CPU 0; wrk")
print(f"and the backend (one nginx worker) on CPU 1. {versions}.")
print("Command: `e2e/bench/tcp.sh` (env ROUNDS, SAT_SECS, CONNS, BIG_CONNS).\n")
print("| | Tollgate | HAProxy | nginx | Tollgate / HAProxy | Tollgate / nginx |")
print("|---|---:|---:|---:|---:|---:|")
for m, name, fmt in [
    ("conns_per_core", "connections per proxy CPU-second", "{:.0f}"),
    ("mib_per_core", "MiB per proxy CPU-second", "{:.0f}"),
    ("conns_per_s", "connections per second", "{:.0f}"),
    ("mib_per_s", "MiB per second", "{:.0f}"),
    ("conns_cpu", "proxy CPU (cores) under the connection load", "{:.2f}"),
    ("bytes_cpu", "proxy CPU (cores) under the byte load", "{:.2f}"),
]:
    cells = [fmt.format(med(c, m)) for c in ("tollgate", "haproxy", "nginx")]
    rs = [f"{ratio(m, o):.2f}" for o in ("haproxy", "nginx")]
    print(f"| {name} | " + " | ".join(cells + rs) + " |")
alt = any(c == "alt" for c, _ in v)
if alt:
    print("\nAlso `alt` (ALT_PROXY), another build of tollgate-proxy, in the same rounds:\n")
    print("| | alt | alt / Tollgate |")
    print("|---|---:|---:|")
    for m in ("conns_per_core", "mib_per_core"):
        rs = [v[("alt", m)][r] / v[("tollgate", m)][r] for r in v[("alt", m)] if v[("tollgate", m)].get(r)]
        print(f"| {m} | {med('alt', m):.0f} | {statistics.median(rs):.2f} |")
print("\nPer-core figures are requests (or MiB) over the proxy's CPU time in the same seconds;")
print("per-second figures are what the one-core proxy delivered, with wrk and the backend")
print("sharing the other core (so they are bounded by that core as much as by the proxy).")
PY
cp "$bench/results/tcp-$stamp.md" "$bench/results/tcp-latest.md"
cat "$bench/results/tcp-latest.md"
