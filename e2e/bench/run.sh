#!/usr/bin/env bash
# Tollgate against nginx and HAProxy on the same machine, reported as ratios.
#
# Installs what is missing (nginx, haproxy, wrk from apt; oha with cargo install, cached in
# ~/.cache/tollgate/cargo-bin), builds Tollgate in release mode, and runs ROUNDS rounds per
# scenario that interleave the contenders (tollgate, nginx, haproxy; again; ...). The proxy
# under test runs on CPU 0 with one worker (tollgate-proxy --workers 1, nginx
# worker_processes 1, haproxy nbthread 1); the load generator and the backend (a second nginx
# answering a fixed small body) share CPU 1. Every contender gets the same routes, translated
# by `gen.py configs`, and does the same per-request work (X-Forwarded-*, X-Request-Id, no
# access log but in the `logs` scenario). All traffic goes to 127.0.0.1.
#
# Scenarios (SCENARIOS, space-separated, default all):
#   one        one catch-all route over HTTP
#   routes10k  the 10k HTTPRoutes of `gen.py routes` (nginx server/location blocks, HAProxy maps)
#   https      one route, TLS terminated by the proxy (generated certificate)
#   logs       one route, each contender writing a JSON access log line per request to a file
#              (Tollgate's default log; nginx with buffer=64k; HAProxy to stdout)
#   control    compile time and memory (table-memory.sh), route change to first served
#              request with 10k routes under load, failed requests during route and endpoint
#              changes (tollgate only)
# Per data-plane scenario and round: requests/s at saturation (wrk, keep-alive), CPU time per
# request at saturation and at a fixed 10k requests/s (utime+stime from /proc), and p50, p99,
# p99.9 at a fixed rate of half nginx's saturation throughput of that round (oha -q with
# latency correction). The report is the median across rounds of each ratio.
#
# Writes e2e/bench/results/latest.md and a dated copy.
# Usage: e2e/bench/run.sh        env: ROUNDS (3), SCENARIOS, SAT_SECS (8), FIXED_SECS (8),
#                                     LAT_SECS (8), CONNS (50), KEEP=1 keeps the work directory,
#                                     BUILD=0 uses the binaries already built
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
ROUNDS=${ROUNDS:-3}
SCENARIOS=${SCENARIOS:-one logs routes10k https control}
SAT_SECS=${SAT_SECS:-8}
FIXED_SECS=${FIXED_SECS:-8}
LAT_SECS=${LAT_SECS:-8}
CONNS=${CONNS:-50}
FIXED_RATE=10000
cache=$HOME/.cache/tollgate
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
bin=$CARGO_TARGET_DIR/release
work=$(mktemp -d /tmp/tollgate-bench.XXXXXX)
raw=$work/raw.tsv
notes=$work/notes.txt
: >"$raw"
: >"$notes"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
pids=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
note() { echo "$*" >>"$notes"; log "note: $*"; }
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# ------------------------------------------------------------------------------ tools
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
apt_updated=0
apt_install() { # first installable candidate of the given packages
  local pkg
  if [ $apt_updated = 0 ]; then $sudo apt-get update -qq; apt_updated=1; fi
  for pkg in "$@"; do
    if apt-cache show "$pkg" >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null; then
      return 0
    fi
  done
  return 1
}
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light nginx || { echo "nginx unavailable" >&2; exit 1; }
command -v haproxy >/dev/null || apt_install haproxy || { echo "haproxy unavailable" >&2; exit 1; }
command -v wrk >/dev/null || apt_install wrk || { echo "wrk unavailable" >&2; exit 1; }
for t in curl openssl python3 taskset; do
  command -v $t >/dev/null || apt_install "$t" || { echo "$t unavailable" >&2; exit 1; }
done
oha=$cache/cargo-bin/bin/oha
[ -x "$oha" ] || command -v cmake >/dev/null || apt_install cmake || true # oha builds aws-lc
if [ ! -x "$oha" ]; then
  log "installing oha (cargo install, once)"
  CARGO_TARGET_DIR=$cache/oha-target cargo install oha --locked -q --root "$cache/cargo-bin" ||
    true
fi
if [ ! -x "$oha" ]; then
  oha=
  note "oha could not be installed: fixed-rate CPU and latency figures are not measured (wrk has no fixed-rate mode)"
fi
if [ "${BUILD:-1}" = 1 ]; then
  log "building Tollgate (release)"
  cargo build --release -q -p tollgate -p tollgate-proxy
fi
# A private copy, so a build running elsewhere cannot swap the binaries mid-run.
mkdir -p "$work/bin"
cp "$bin/tollgate" "$bin/tollgate-proxy" "$work/bin/"
bin=$work/bin

# ------------------------------------------------------------------------------ processes
# Pins a background command to a CPU; its pid lands in $last_pid.
spawn() {
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  pids+=("$last_pid")
}
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# shellcheck source=e2e/bench/cpu.sh
. "$bench/cpu.sh"
wait_200() { # url host
  local code
  for _ in $(seq 1 300); do
    code=$(curl -sk -o /dev/null -w '%{http_code}' -H "Host: $2" "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  echo "never answered 200: $1 (last $code)" >&2
  return 1
}

backend_dir=$work/backend
mkdir -p "$backend_dir"
. "$bench/backend.sh"
backend_conf "$backend_dir" 19080 19081 19082
spawn 1 nginx -e "$backend_dir/error.log" -c "$backend_dir/backend.conf"
backend_pid=$last_pid
wait_200 http://127.0.0.1:19080/ backend

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
  -subj /CN=bench.example.test \
  -addext "subjectAltName=DNS:bench.example.test,DNS:*.example.test,DNS:*.example.com" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

# quantile FILE Q: the value at rank ceil(N * Q) of FILE's N numbers, sorted (Q=1: the largest).
quantile() { sort -n "$1" | awk -v q="$2" '{a[NR] = $1} END {i = int(NR * q + 0.999); print a[i < 1 ? 1 : i]}'; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$raw"; } # scenario round contender metric value

# ------------------------------------------------------------------------------ data plane
contenders=(tollgate nginx haproxy)
declare -A pid_of port_of
start_contenders() { # scenario dir
  local s=$1 d=$2 tls=0 c
  [ "$s" = https ] && tls=1
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  # `logs`: each contender's access log goes to a file of the work dir (nginx's is set in its
  # config); `exec` keeps the pid the proxy's.
  local logs=false
  [ "$s" = logs ] && logs=true
  spawn 0 sh -c 'exec "$@" >"$0"' "$d/tollgate-access.log" "$bin/tollgate-proxy" \
    --table "$d/table/default.bench.json" --admin 127.0.0.1:19901 --access-log "$logs" --workers 1
  pid_of[tollgate]=$last_pid
  spawn 0 nginx -e "$d/nginx-error.log" -c "$d/nginx.conf"
  pid_of[nginx]=$last_pid
  spawn 0 sh -c 'exec "$@" >"$0"' "$d/haproxy-access.log" haproxy -db -f "$d/haproxy.cfg"
  pid_of[haproxy]=$last_pid
  if [ $tls = 1 ]; then
    port_of=([tollgate]=18443 [nginx]=18444 [haproxy]=18445)
  else
    port_of=([tollgate]=18080 [nginx]=18081 [haproxy]=18082)
  fi
  for c in "${contenders[@]}"; do wait_200 "$(url "$c")" "$req_host"; done
}
url() {
  local scheme=http
  [ "$scenario" = https ] && scheme=https
  echo "$scheme://127.0.0.1:${port_of[$1]}$req_path"
}
hdr_args() {
  printf '%s\n' -H "Host: $req_host"
  [ -n "$req_hdr" ] && printf '%s\n' -H "$req_hdr"
  return 0
}

# wrk at saturation: records rps, cpu_sat_us, errors.
saturate() { # contender round
  local c=$1 r=$2 out ns n rps errs
  mapfile -t h < <(hdr_args)
  taskset -c 1 wrk -t1 -c"$CONNS" -d1s "${h[@]}" "$(url "$c")" >/dev/null # warm-up
  cpu_snap "${pid_of[$c]}" "$work/cpu0"
  out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SAT_SECS}s" "${h[@]}" "$(url "$c")")
  cpu_snap "${pid_of[$c]}" "$work/cpu1"
  ns=$(cpu_ns "$work/cpu0" "$work/cpu1")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {s += $NF} /Socket errors/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} END {print s + 0}' <<<"$out")
  record "$scenario" "$r" "$c" rps "$rps"
  record "$scenario" "$r" "$c" cpu_sat_us "$(awk -v d="$ns" -v n="$n" 'BEGIN {printf "%.2f", d / 1e3 / n}')"
  # Throughput per core: requests per second of the proxy's own CPU time. On a shared 2-core
  # machine wrk and the backend on CPU 1 may saturate before the proxy does; this figure does
  # not depend on that.
  record "$scenario" "$r" "$c" rps_per_core "$(awk -v d="$ns" -v n="$n" 'BEGIN {printf "%.0f", (d > 0) ? n / (d / 1e9) : 0}')"
  record "$scenario" "$r" "$c" errors_sat "$errs"
  log "$scenario r$r $c: $rps req/s, errors $errs"
}

# oha at a fixed rate: prints the JSON summary path; records what the caller asks for.
fixed_rate() { # contender rate secs out.json
  local c=$1 rate=$2 secs=$3 out=$4 insecure=()
  mapfile -t h < <(hdr_args)
  [ "$scenario" = https ] && insecure=(--insecure)
  taskset -c 1 "$oha" --no-tui --output-format json --latency-correction -w -q "$rate" -z "${secs}s" \
    -c "$CONNS" "${insecure[@]}" "${h[@]}" "$(url "$c")" >"$out"
}
oha_field() { # file python-expression over j
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}
oha_ok='sum(v for k, v in j["statusCodeDistribution"].items() if k.startswith("2"))'
oha_bad='sum(v for k, v in j["statusCodeDistribution"].items() if not k.startswith("2")) + sum(j.get("errorDistribution", {}).values())'

at_fixed() { # contender round rate
  local c=$1 r=$2 rate=$3 ns n f=$work/oha-10k.json
  cpu_snap "${pid_of[$c]}" "$work/cpu0"
  fixed_rate "$c" "$rate" "$FIXED_SECS" "$f"
  cpu_snap "${pid_of[$c]}" "$work/cpu1"
  ns=$(cpu_ns "$work/cpu0" "$work/cpu1")
  n=$(oha_field "$f" "$oha_ok")
  record "$scenario" "$r" "$c" cpu_10k_us "$(awk -v d="$ns" -v n="$n" 'BEGIN {printf "%.2f", (n > 0) ? d / 1e3 / n : -1}')"
  record "$scenario" "$r" "$c" rate_10k "$(oha_field "$f" 'round(j["summary"]["requestsPerSec"])')"
  record "$scenario" "$r" "$c" target_10k "$rate"
}

at_half() { # contender round rate
  local c=$1 r=$2 rate=$3 f=$work/oha-half.json q
  fixed_rate "$c" "$rate" "$LAT_SECS" "$f"
  for q in p50 p99 p99.9; do
    record "$scenario" "$r" "$c" "${q/./}_ms" "$(oha_field "$f" "round(j['latencyPercentiles']['$q'] * 1000, 3)")"
  done
  record "$scenario" "$r" "$c" half_rate "$rate"
  record "$scenario" "$r" "$c" half_achieved "$(oha_field "$f" 'round(j["summary"]["requestsPerSec"])')"
  record "$scenario" "$r" "$c" errors_half "$(oha_field "$f" "$oha_bad")"
}

data_plane() { # scenario
  local d=$work/$scenario r c half fixed
  python3 "$bench/gen.py" configs "$scenario" "$d" --cert "$work/cert.pem" --key "$work/key.pem" >/dev/null
  IFS=$'\t' read -r req_host req_path req_hdr <"$d/request"
  start_contenders "$scenario" "$d"
  for r in $(seq 1 "$ROUNDS"); do
    for c in "${contenders[@]}"; do saturate "$c" "$r"; done
    [ -n "$oha" ] || continue
    half=$(awk -v s="$scenario" -v r="$r" '$1 == s && $2 == r && $3 == "nginx" && $4 == "rps" {printf "%d", $5 / 2}' "$raw")
    # oha costs more CPU per request than wrk, and shares CPU 1 with the backend: above 10k
    # req/s it is the load generator that queues, not the proxy. Cap the latency rate there.
    [ "$half" -le "$FIXED_RATE" ] || half=$FIXED_RATE
    # 10k req/s, or 80% of nginx's saturation when that is lower (a rate nginx does not
    # sustain would measure saturation again).
    fixed=$(awk -v s="$scenario" -v r="$r" -v f=$FIXED_RATE '$1 == s && $2 == r && $3 == "nginx" && $4 == "rps" {x = 0.8 * $5; printf "%d", (x < f) ? x : f}' "$raw")
    for c in "${contenders[@]}"; do
      at_fixed "$c" "$r" "$fixed"
      at_half "$c" "$r" "$half"
    done
  done
  for c in "${contenders[@]}"; do stop "${pid_of[$c]}"; done
  if [ "$scenario" = logs ]; then
    # Proof that each wrote its lines: lines per request served over the scenario.
    for c in "${contenders[@]}"; do
      record "$scenario" 0 "$c" log_lines "$(wc -l <"$d/$c-access.log")"
    done
  fi
}

# ------------------------------------------------------------------------------ control plane
control_plane() {
  local n out d=$work/control run_pid oha_pid f
  for n in 1000 10000; do
    log "table-memory.sh $n 100"
    out=$(BIN=$bin "$bench/table-memory.sh" "$n" 100)
    echo "$out" >&2
    record control 1 tollgate "compile_${n}_s" "$(sed -n 's/^tollgate compile.*: \([0-9.]*\)s.*/\1/p' <<<"$out")"
    record control 1 tollgate "proxy_rss_${n}_mb" "$(sed -n 's/^tollgate-proxy: rss=\([0-9.]*\)MB.*/\1/p' <<<"$out")"
    record control 1 tollgate "run_rss_${n}_mb" "$(sed -n 's/^tollgate run: *rss=\([0-9.]*\)MB.*/\1/p' <<<"$out")"
  done

  python3 "$bench/gen.py" routes 10000 "$d" --port 18080 --backend-port 19080 >/dev/null
  spawn 0 "$bin/tollgate" run "$d" --admin 127.0.0.1:19911 --access-log false 2>"$work/run.log"
  run_pid=$last_pid
  wait_200 http://127.0.0.1:18080/prefix/5002/item host-2.example.com
  # Background load at a fixed rate on a loaded route while the files change.
  load() { # name secs
    if [ -n "$oha" ]; then
      taskset -c 1 "$oha" --no-tui --output-format json -q 1000 -z "$2s" -c 10 \
        -H "Host: host-2.example.com" http://127.0.0.1:18080/prefix/5002/item >"$work/load-$1.json" &
    else
      taskset -c 1 wrk -t1 -c4 -d"$2s" -H "Host: host-2.example.com" \
        http://127.0.0.1:18080/prefix/5002/item >"$work/load-$1.txt" &
    fi
    oha_pid=$!
  }
  load_failed() { # name
    wait "$oha_pid" || true
    if [ -n "$oha" ]; then
      oha_field "$work/load-$1.json" "$oha_bad"
    else
      awk '/Non-2xx/ {s += $NF} /Socket errors/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} END {print s + 0}' "$work/load-$1.txt"
    fi
  }
  load_total() {
    if [ -n "$oha" ]; then oha_field "$work/load-$1.json" 'sum(j["statusCodeDistribution"].values()) + sum(j.get("errorDistribution", {}).values())'
    else awk '/requests in/ {print $1}' "$work/load-$1.txt"; fi
  }

  # 100 changes: the p99 of 20 would be their maximum, one sample of the host's noise.
  log "route change to first served request (${LATENCY_CHANGES:-100} changes, 10k routes, under load)"
  load latency 120
  python3 "$bench/control.py" latency "$d" 18080 "${LATENCY_CHANGES:-100}" >"$work/latency.txt"
  record control 1 tollgate change_p50_ms "$(quantile "$work/latency.txt" 0.5)"
  record control 1 tollgate change_p99_ms "$(quantile "$work/latency.txt" 0.99)"
  record control 1 tollgate change_max_ms "$(quantile "$work/latency.txt" 1)"
  kill -INT "$oha_pid" 2>/dev/null || true
  record control 1 tollgate change_failed "$(load_failed latency)"

  log "100 route changes under load"
  load routes 90
  python3 "$bench/control.py" routes "$d" 18080 "${CHANGES:-100}" >"$work/routes.txt"
  kill -INT "$oha_pid" 2>/dev/null || true
  record control 1 tollgate route_changes_failed "$(load_failed routes)"
  record control 1 tollgate route_changes_requests "$(load_total routes)"
  record control 1 tollgate route_changes_p50_ms "$(quantile "$work/routes.txt" 0.5)"
  record control 1 tollgate route_changes_p99_ms "$(quantile "$work/routes.txt" 0.99)"

  log "100 endpoint changes under load"
  load endpoints 60
  GAP=0.4 python3 "$bench/control.py" endpoints "$d" "${CHANGES:-100}" >/dev/null
  kill -INT "$oha_pid" 2>/dev/null || true
  record control 1 tollgate endpoint_changes_failed "$(load_failed endpoints)"
  record control 1 tollgate endpoint_changes_requests "$(load_total endpoints)"
  stop "$run_pid"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for scenario in $SCENARIOS; do
  case $scenario in
  one | routes10k | https | logs)
    log "scenario $scenario: $ROUNDS rounds"
    data_plane
    ;;
  control) control_plane ;;
  *) echo "unknown scenario $scenario" >&2; exit 2 ;;
  esac
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
stop "$backend_pid"

mkdir -p "$bench/results"
dated=$bench/results/$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 "$bench/report.py" "$raw" --notes "$notes" --started "$started" --rounds "$ROUNDS" \
  --load "$load_before" --load-after "$load_after" --command "ROUNDS=$ROUNDS SCENARIOS=\"$SCENARIOS\" e2e/bench/run.sh" \
  --versions "$(nginx -v 2>&1 | sed 's/.*version: //'); $(haproxy -v | head -1 | awk '{print "HAProxy " $3}'); $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'); ${oha:+oha $("$oha" --version | awk '{print $2}')}" \
  >"$dated"
cp "$dated" "$bench/results/latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/latest.md"
