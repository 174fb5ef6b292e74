#!/usr/bin/env bash
# What policies cost: requests per proxy CPU-second of a route with a local rate limit, with an
# API key plus the limit, and with a cached JWT plus the limit, as ratios to the bare route,
# measured in the same run; and Redis commands per request in redis-cached mode.
#
# A round measures the bare route between every two variants (bare rl bare apikey bare jwt bare
# cached bare), and a variant's ratio in a round is to the mean of the two bare measurements
# around it: the machine's speed drifts (other tenants of the host), and a drift that is linear
# over the ~20 s around a variant cancels out. The figure is the median across rounds.
#
# Each variant runs in its own tollgate-proxy (one worker, CPU 0); wrk and the backend (nginx
# answering a small fixed body) share CPU 1. The limit is never exceeded: every request is
# admitted, so the figures are the cost of deciding. Traffic stays on 127.0.0.1.
# Installs nginx, wrk and redis-server from apt when missing; builds Tollgate in release mode.
#
# Writes e2e/bench/results/policies-latest.md and a dated copy.
# Usage: e2e/bench/policies.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
ROUNDS=${ROUNDS:-7}
SAT_SECS=${SAT_SECS:-5}
CONNS=${CONNS:-50}
cache=$HOME/.cache/tollgate
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
work=$(mktemp -d /tmp/tollgate-bench-policies.XXXXXX)
raw=$work/raw.tsv
: >"$raw"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
pids=()
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
apt_install() {
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null; }
}
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
command -v redis-server >/dev/null || apt_install redis-server
for t in curl python3 taskset redis-cli; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
if [ "${BUILD:-1}" = 1 ]; then
  log "building Tollgate (release)"
  cargo build --release -q -p tollgate -p tollgate-proxy
fi
mkdir -p "$work/bin"
cp "$CARGO_TARGET_DIR/release/tollgate" "$CARGO_TARGET_DIR/release/tollgate-proxy" "$work/bin/"
bin=$work/bin
tck=$(getconf CLK_TCK)

spawn() { # cpu command...
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  pids+=("$last_pid")
}
ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
wait_200() { # url [header...]
  local code h=() x
  for x in "${@:2}"; do h+=(-H "$x"); done
  for _ in $(seq 1 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "${h[@]}" "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  echo "never answered 200: $1 (last $code)" >&2
  return 1
}

. "$bench/backend.sh"
backend_conf "$work"
spawn 1 nginx -e "$work/backend.err" -c "$work/backend.conf"
wait_200 http://127.0.0.1:19080/

redis_port=19379
spawn 1 redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --logfile "$work/redis.log"
for _ in $(seq 1 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.05; done

read -r -a variants <<<"$(python3 "$bench/gen-policies.py" "$work/v")"
declare -A pid_of port_of hdr_of
admin=19910
for v in "${variants[@]}"; do
  d=$work/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r port hdr <"$d/request" # hdr: the headers, tab-separated
  port_of[$v]=$port
  hdr_of[$v]=$hdr
  extra=()
  [ "$v" = cached ] && extra=(--rate-limit-storage redis-cached --redis-url "redis://127.0.0.1:$redis_port")
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1 "${extra[@]}"
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port/" "${hs[@]}"
done
# Without the credential the auth variants must refuse: the benchmark measures enforcement.
for v in apikey jwt; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port_of[$v]}/")
  [ "$code" = 401 ] || { echo "$v answered $code without a credential" >&2; exit 1; }
done

seq_no=0                                                      # position of a measurement in the run
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$seq_no" "$2" "$3" "$4" >>"$raw"; } # round variant metric value
redis_calls() { redis-cli -p "$redis_port" info commandstats | awk -F'[:=,]' '/^cmdstat_/ && !/cmdstat_info/ {s += $3} END {print s + 0}'; }

saturate() { # variant round
  local v=$1 r=$2 out t0 t1 n rps errs c0 c1 h=()
  local x hs
  IFS=$'\t' read -r -a hs <<<"${hdr_of[$v]}"
  for x in "${hs[@]}"; do h+=(-H "$x"); done
  local url="http://127.0.0.1:${port_of[$v]}/"
  seq_no=$((seq_no + 1))
  taskset -c 1 wrk -t1 -c"$CONNS" -d1s "${h[@]}" "$url" >/dev/null
  c0=$(redis_calls)
  t0=$(ticks "${pid_of[$v]}")
  out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SAT_SECS}s" "${h[@]}" "$url")
  t1=$(ticks "${pid_of[$v]}")
  c1=$(redis_calls)
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {s += $NF} /Socket errors/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} END {print s + 0}' <<<"$out")
  record "$r" "$v" rps "$rps"
  record "$r" "$v" rps_per_core "$(awk -v d=$((t1 - t0)) -v n="$n" -v t="$tck" 'BEGIN {printf "%.0f", (d > 0) ? n / (d / t) : 0}')"
  record "$r" "$v" errors "$errs"
  record "$r" "$v" requests "$n"
  [ "$v" = cached ] && record "$r" "$v" redis_per_request "$(awk -v c=$((c1 - c0)) -v n="$n" 'BEGIN {printf "%.5f", c / n}')"
  log "r$r $v: $rps req/s, errors $errs"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  saturate bare "$r"
  for v in "${variants[@]}"; do
    [ "$v" = bare ] && continue
    saturate "$v" "$r"
    saturate bare "$r"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/policies-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" >"$dated" <<'EOF'
import statistics, sys
from collections import defaultdict
raw, started, rounds, before, after = sys.argv[1:6]
m_of = defaultdict(dict)  # measurement number -> metric -> value
who = {}                  # measurement number -> (round, variant)
for line in open(raw):
    r, n, var, m, val = line.rstrip("\n").split("\t")
    who[int(n)] = (r, var)
    m_of[int(n)][m] = float(val)
rs = sorted({r for r, _ in who.values()}, key=int)
def runs(var):
    return [n for n in sorted(who) if who[n][1] == var]
def ratio(var):
    # To the mean of the bare measurements just before and just after (the same round's).
    if var == "bare":
        return 1.0, [1.0 for _ in rs]
    xs = []
    for n in runs(var):
        around = [m_of[k]["rps_per_core"] for k in (n - 1, n + 1) if who.get(k, (None, None))[1] == "bare"]
        xs.append(m_of[n]["rps_per_core"] / (sum(around) / len(around)))
    return statistics.median(xs), xs
def med(var, m):
    return statistics.median(m_of[n][m] for n in runs(var))
print(f"# Tollgate policy benchmark ({started})\n")
print(f"Rounds: {rounds}, each measuring the bare route between every two variants (bare, rl, bare, apikey, bare, "
      "jwt, bare, cached, bare); a variant's ratio in a round is to the mean of the two bare measurements around it "
      "(a drift of the machine's speed cancels), and the figure is the median across rounds. Each variant in its own "
      "tollgate-proxy on CPU 0 with one worker; wrk and the backend on CPU 1. Every request is admitted "
      "(the limit is never reached): the figures are the cost of deciding.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/policies.sh`\n")
print("Same request to every variant (the API key and bearer token headers included), so the ratios "
      "are the cost of the policies, not of carrying credentials.\n")
print("## Goals (issue 5)\n")
print("| goal | target | measured | result |\n| --- | --- | --- | --- |")
goals = [("local rate limit: fewer requests per proxy CPU-second than the bare route", "rl", 0.05),
         ("API key + local limit: fewer requests per proxy CPU-second", "apikey", 0.10),
         ("cached JWT + local limit: fewer requests per proxy CPU-second", "jwt", 0.12)]
for text, var, budget in goals:
    m, xs = ratio(var)
    loss = 1 - m
    print(f"| {text} | < {budget:.0%} | {loss:.1%} (ratios {', '.join(f'{x:.3f}' for x in xs)}) | "
          f"**{'PASS' if loss < budget else 'FAIL'}** |")
cmds = med("cached", "redis_per_request")
print(f"| Redis commands per request, redis-cached | < 0.05 | {cmds:.4f} | **{'PASS' if cmds < 0.05 else 'FAIL'}** |")
print("\n## Per variant (medians across rounds)\n")
print("| variant | requests per proxy CPU-second | ratio to bare | wrk requests/s | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- |")
for var in ["bare", "rl", "apikey", "jwt", "cached"]:
    print(f"| {var} | {med(var, 'rps_per_core'):,.0f} | {ratio(var)[0]:.3f} | {med(var, 'rps'):,.0f} | "
          f"{sum(m_of[n]['errors'] for n in runs(var)):.0f} |")
bare = [m_of[n]["rps_per_core"] for n in runs("bare")]
print(f"\nThe machine's steadiness: the bare route's {len(bare)} measurements ranged from {min(bare):,.0f} to "
      f"{max(bare):,.0f} requests per proxy CPU-second ({max(bare) / min(bare) - 1:.0%} apart). The same binary "
      "and request every time: that spread is the machine's noise, which the pairing within a round and the "
      "median across rounds have to overcome.")
EOF
cp "$dated" "$bench/results/policies-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/policies-latest.md"
