#!/usr/bin/env bash
# What the backend settings cost when nothing fails: requests per proxy CPU-second of a route
# whose Service has a BackendPolicy (circuit breaker, outlier detection and an HTTP health check
# every second), of a route with a retry rule, and of a consistent hash on a header and on a CEL
# expression, as ratios
# to the bare route measured at the same time. Every variant balances over the same three
# endpoints (one nginx, three ports); nothing ever fails, so the figures are the cost of
# counting, checking and deciding.
#
# The method is policies.sh's (side-by-side.sh): each variant runs in its own tollgate-proxy
# (one worker, access log off) beside the bare route's, both on CPU 0, each loaded by its own
# wrk (CONNS/2 connections) on CPU 1 with the backend; a round's ratio is the variant's
# requests per proxy CPU-second over the bare route's in the same seconds, the figure the
# median across rounds. Each round also measures the bare route alone, for what sharing the
# core costs, and the goal is judged with that added back when it is positive. A control,
# twin (the bare route again), shows two equal proxies come out equal. The health checks'
# own requests reach the backend, not the proxies' wrk counts: their CPU is in the figures.
# A goal also needs zero errors. Traffic stays on 127.0.0.1.
# Installs nginx and wrk from apt when missing; builds Tollgate in release mode
# (PROFILE=debug: a debug build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/backends-latest.md and a dated copy.
# Usage: e2e/bench/backends.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                       PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# The method: sbs_init, spawn, wait_200, load, alone, pair (and cpu.sh, backend.sh).
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init backends
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
backend_conf "$work" 19080 19081 19082
spawn 1 nginx -e "$work/backend.err" -c "$work/backend.conf"
for p in 19080 19081 19082; do wait_200 "http://127.0.0.1:$p/"; done

read -r -a variants <<<"$(python3 "$bench/gen.py" policies "$work/v" backends)"
declare -A admin_of
admin=19960
for v in "${variants[@]}"; do
  d=$work/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r port hdr <"$d/request"
  port_of[$v]=$port
  hdr_of[$v]=$hdr
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin_of[$v]=$admin
  admin=$((admin + 1))
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port/" "${hs[@]}"
done
# The tables carry what each variant measures, and nothing else.
python3 - "$work/v" <<'PY'
import json, sys
def table(v):
    return json.load(open(f"{sys.argv[1]}/{v}/table/default.bench.json"))
for v in ["bare", "policy", "retry", "hash", "expr", "twin"]:
    t = table(v)
    (b,) = t["backends"].values()
    routes = [r for p in t["ports"] for l in p["listeners"] for h in l["virtualHosts"] for r in h["routes"]]
    got = (len(b["endpoints"]), b.get("loadBalancer", "least-request"), sorted(b.get("settings", {})),
           [r.get("retry") is not None for r in routes])
    want = {"policy": (3, "least-request", ["circuitBreaker", "healthCheck", "outlier"], [False]),
            "retry": (3, "least-request", [], [True]),
            "hash": (3, "consistent-hash", ["hash"], [False]),
            "expr": (3, "consistent-hash", ["hash"], [False])}.get(v, (3, "least-request", [], [False]))
    if got != want:
        sys.exit(f"{v}: the table has {got}, not {want}")
PY
# Every variant reaches all three endpoints (the hash one: one per key, so three keys).
for v in "${variants[@]}"; do
  seen=$(for k in a b c d e f g h i j k l; do
    curl -s -D - -o /dev/null -H "x-user-id: key-$k" "http://127.0.0.1:${port_of[$v]}/" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-port" {print $2}'
  done | sort -u | tr '\n' ' ')
  [ "$seen" = "19080 19081 19082 " ] || { echo "$v reached only: $seen" >&2; exit 1; }
done
metric() { curl -s "http://127.0.0.1:${admin_of[$1]}/metrics" | awk -v m="$2" '$1 == m {print $2}'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do
    [ "$v" = bare ] || pair "$v" "$r"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
# Nothing tripped: no ejection, no breaker refusal, no retry, every health check passed.
checks_failed=$(metric policy 'tollgate_health_checks_total{result="fail"}')
checks_passed=$(metric policy 'tollgate_health_checks_total{result="pass"}')
tripped=$(for v in "${variants[@]}"; do curl -s "http://127.0.0.1:${admin_of[$v]}/metrics"; done |
  awk '/^tollgate_(upstream_ejections|upstream_retries|circuit_breaker_rejections)_total/ {s += $NF} END {print s + 0}')

mkdir -p "$bench/results"
dated=$bench/results/backends-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" \
  "${checks_passed:-0}" "${checks_failed:-0}" "$tripped" >"$dated" <<'EOF'
import sys
raw, started, rounds, before, after, conns, bench, passed, failed, tripped = sys.argv[1:11]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
share = runs.share()
print(f"# Tollgate backend-settings benchmark ({started})\n")
print(f"Rounds: {rounds}. Each variant is measured side by side with the bare route (policies.sh's method): "
      f"both tollgate-proxy processes (one worker each) on CPU 0, each loaded by its own wrk ({int(conns) // 2} "
      "connections) on CPU 1 with the backend (one nginx on three ports: every variant balances over three "
      "endpoints); a round's ratio is the variant's requests per proxy CPU-second over the bare route's in the "
      "same seconds, the figure the median across rounds. Nothing fails, so nothing trips: the figures are the "
      "cost of counting and checking.\n")
print(f"Sharing a core's overhead: {share:+.1%} (the bare route's CPU per request beside the twin over alone); the "
      "goal is judged on the side-by-side loss times (1 + that) when it is positive.\n")
print(f"Load average before: {before}; after: {after}.\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/backends.sh`\n")
print("Variants: `policy`, a BackendPolicy on the Service with `circuitBreaker {maxConnections: 4096, "
      "maxPendingRequests: 1024, maxRequests: 8192, maxRetries: 64}`, `outlierDetection {consecutive5xx: 5, "
      "consecutiveGatewayErrors: 3, interval: 5s, baseEjectionTime: 30s, maxEjectionPercent: 50}` and "
      "`healthCheck.active {type: HTTP, path: /, interval: 1s}`; `retry`, the route's rule with `retry "
      "{attempts: 2, codes: [502, 503, 504]}`; `hash`, a BackendPolicy `ConsistentHash` on `x-user-id` (every "
      "request carries `x-user-id: bench-user-42`, so does every other variant's); `expr`, the same key as a CEL "
      "`expression` (`request.headers['x-user-id']`), evaluated per request.\n")
print("## Goal (issue 28)\n")
print("| goal | target | measured | result |\n| --- | --- | --- | --- |")
m, xs = ratio("policy")
loss = 1 - m
judged = loss * (1 + max(share, 0.0))
errs = errors("policy")
ok = judged < 0.03 and errs == 0 and int(tripped) == 0 and int(float(failed)) == 0
print(f"| BackendPolicy with outlier detection, circuit breaker and active health checks: fewer requests per "
      f"proxy CPU-second than the bare route | < 3% | {judged:.1%} ({loss:.1%} side by side, ratios "
      f"{', '.join(f'{x:.3f}' for x in xs)}; errors {errs:.0f}) | **{'PASS' if ok else 'FAIL'}** |")
print(f"\nHealth checks during the run: {float(passed):.0f} passed, {float(failed):.0f} failed; ejections, retries "
      f"and breaker refusals in all proxies: {tripped}.\n")
print("## Per variant (medians across rounds)\n")
print("| variant | requests per proxy CPU-second | the bare route beside it | ratio | cost | wrk requests/s | errors |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for var in ["policy", "retry", "hash", "expr", "twin"]:
    r = ratio(var)[0]
    print(f"| {var} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{r:.3f} | {(1 - r) * (1 + max(share, 0.0)):.1%} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| bare route alone | {med('bare-alone', 'rps_per_core'):,.0f} | | | | {med('bare-alone', 'rps'):,.0f} | "
      f"{runs.alone_errors():.0f} |")
m, xs = ratio("twin")
print(f"\nControl: `twin`'s ratio {m:.3f} (rounds {', '.join(f'{x:.3f}' for x in xs)}).")
EOF
cp "$dated" "$bench/results/backends-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/backends-latest.md"
