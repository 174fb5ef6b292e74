#!/usr/bin/env bash
# The response cache's memory bound under many distinct keys: one tollgate-proxy (one worker,
# `--cache-size SIZE`) with a CachePolicy on its route gets KEYS requests, each for a key no
# request asked for before (wrk's Lua script makes the query unique), so the cache fills,
# then evicts for room. The proxy's resident memory is sampled every 200 ms throughout; the
# bound holds when its peak (VmHWM) stays under the proxy's base (its resident memory after
# serving 2 s of requests for one key) plus SIZE.
# Also reports the cache's own account (`tollgate_cache_bytes`), evictions and misses.
# Traffic stays on 127.0.0.1. Installs nginx and wrk from apt when missing; builds Tollgate
# in release mode (PROFILE=debug: a debug build, to check the script quickly).
#
# Writes e2e/bench/results/cache-memory-latest.md and a dated copy; exits 1 when the bound
# does not hold.
# Usage: e2e/bench/cache-memory.sh   env: KEYS (1000000), SIZE (64Mi), CONNS (50), BUILD=0,
#                                         KEEP=1, PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init cache-memory
KEYS=${KEYS:-1000000}
SIZE=${SIZE:-64Mi}
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
size_bytes=$(python3 -c "import sys; s = sys.argv[1]; u = {'Ki': 1 << 10, 'Mi': 1 << 20, 'Gi': 1 << 30}
print(int(s[:-2]) * u[s[-2:]] if s[-2:] in u else int(s))" "$SIZE")
sbs_binaries
sbs_backend

port=18980
d=$work/manifests
mkdir -p "$d"
python3 - "$bench" "$port" >"$d/bench.yaml" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import gen
print(gen.base("bench", int(sys.argv[2])) + """---
apiVersion: tollgate.dev/v1alpha1
kind: CachePolicy
metadata: {name: cache, namespace: default}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}]
  defaultTTL: 1h
""")
PY
"$bin/tollgate" compile "$d" --out "$work/table" >/dev/null
spawn 0 "$bin/tollgate-proxy" --table "$work/table/default.bench.json" --admin 127.0.0.1:19980 \
  --access-log false --workers 1 --cache-size "$SIZE"
proxy=$last_pid
wait_200 "http://127.0.0.1:$port/"

metric() { curl -s http://127.0.0.1:19980/metrics | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {printf "%.0f\n", s}'; }
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$proxy/status"; }

# The base: the proxy after traffic on one cached key.
taskset -c 1 wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port/" >/dev/null
base=$(rss)
log "base resident memory $((base / 1048576)) MiB; bound $SIZE ($size_bytes bytes)"

: >"$work/rss.samples"
(while kill -0 "$proxy" 2>/dev/null; do rss >>"$work/rss.samples" 2>/dev/null || true; sleep 0.2; done) &
sampler=$!
pids+=("$sampler")
start=$(date +%s)
misses=$(metric 'tollgate_cache_requests_total{outcome="miss"}')
while [ "$misses" -lt "$KEYS" ]; do
  taskset -c 1 wrk -t1 -c"$CONNS" -d10s -s "$bench/unique-keys.lua" "http://127.0.0.1:$port/" >"$work/wrk.out"
  grep -q "Non-2xx\|Socket errors" "$work/wrk.out" && { echo "errors under load:" >&2; cat "$work/wrk.out" >&2; exit 1; }
  misses=$(metric 'tollgate_cache_requests_total{outcome="miss"}')
  log "$misses misses, resident $(($(rss) / 1048576)) MiB, cache $(($(metric tollgate_cache_bytes) / 1048576)) MiB"
done
secs=$(($(date +%s) - start))
kill "$sampler" 2>/dev/null || true
peak=$(awk '/^VmHWM/ {print $2 * 1024}' "/proc/$proxy/status")
sampled=$(sort -n "$work/rss.samples" | tail -1)
final=$(rss)
cache_bytes=$(metric tollgate_cache_bytes)
evictions=$(metric tollgate_cache_evictions_total)
limit=$((base + size_bytes))
verdict=holds
[ "$peak" -le "$limit" ] || verdict="DOES NOT HOLD"

mkdir -p "$bench/results"
dated=$bench/results/cache-memory-$(date -u +%Y-%m-%dT%H%M%SZ).md
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
{
  echo "# Tollgate cache memory bound ($started)"
  echo
  echo "One tollgate-proxy (one worker, \`--cache-size $SIZE\`, $PROFILE build), a CachePolicy (\`defaultTTL: 1h\`) on its"
  echo "route, $misses requests each for a new key (wrk, $CONNS connections, a unique query per request) in $secs s; the"
  echo "backend answers \"ok\". Resident memory sampled every 200 ms; the peak is the kernel's VmHWM."
  echo
  echo "Reproduce: \`KEYS=$KEYS SIZE=$SIZE e2e/bench/cache-memory.sh\`"
  echo
  echo "| figure | value |"
  echo "| --- | --- |"
  echo "| base (after 2 s on one key) | $(mib "$base") |"
  echo "| bound: base + $SIZE | $(mib "$limit") |"
  echo "| peak resident (VmHWM) | $(mib "$peak") |"
  echo "| highest sample | $(mib "$sampled") |"
  echo "| resident at the end | $(mib "$final") |"
  echo "| the cache's own account (tollgate_cache_bytes) | $(mib "$cache_bytes") |"
  echo "| misses (keys stored) | $misses |"
  echo "| evictions | $evictions |"
  echo
  echo "The bound $verdict: peak $(mib "$peak") against $(mib "$limit")."
} >"$dated"
cp "$dated" "$bench/results/cache-memory-latest.md"
cat "$dated"
[ "$verdict" = holds ]
