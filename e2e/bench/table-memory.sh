#!/usr/bin/env bash
# Memory and load time with a large table: one Gateway, N HTTPRoutes (default 10000) over 100
# Services with E endpoints each (default 100, so 10k endpoints).
#  - `tollgate compile`: wall time to read, parse and compile the manifests and write the table;
#  - `tollgate-proxy --table`: resident memory of the data plane alone serving that table (what
#    runs per Gateway in a cluster);
#  - `tollgate run`: resident memory of the all-in-one process (manifests, compiler and proxy).
# A server counts as serving once a routed request gets anything but 404 (the extra endpoints
# are unused loopback addresses, so an answer may be a 502).
# Usage: e2e/bench/table-memory.sh [N] [E]
#   BIN=DIR uses tollgate and tollgate-proxy from DIR instead of building them (run.sh does).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10000}
e=${2:-100}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo build --release -q -p tollgate -p tollgate-proxy
  bin="$CARGO_TARGET_DIR/release"
fi
dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
port=18080; be=19080; admin=19901
python3 e2e/bench/gen.py routes "$n" "$dir/m" --port $port --backend-port $be --endpoints "$e" >/dev/null

now() { date +%s.%N; }
wait_served() {
  local code=000
  for _ in $(seq 1 1200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: host-1.example.com" \
      "http://127.0.0.1:$port/prefix/1/x" || true)
    [ "$code" != 000 ] && [ "$code" != 404 ] && return 0
    sleep 0.05
  done
  echo "never served (last code $code)"; tail -20 "$dir/log"; exit 1
}
rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
hwm() { awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

t0=$(now)
"$bin/tollgate" compile "$dir/m" --out "$dir/t" >/dev/null
t1=$(now)
bytes=$(stat -c %s "$dir/t/default.bench.json")

t2=$(now)
"$bin/tollgate-proxy" --table "$dir/t/default.bench.json" --admin 127.0.0.1:$admin --access-log false >"$dir/log" 2>&1 &
pid=$!
wait_served
t3=$(now)
sleep 1
proxy_rss=$(rss $pid); proxy_hwm=$(hwm $pid)
kill $pid; wait $pid 2>/dev/null || true

t4=$(now)
"$bin/tollgate" run "$dir/m" --admin 127.0.0.1:$admin --access-log false >"$dir/log" 2>&1 &
pid=$!
wait_served
t5=$(now)
sleep 1
run_rss=$(rss $pid); run_hwm=$(hwm $pid)

awk -v n="$n" -v e="$e" -v c="$(echo "$t0 $t1" | awk '{print $2-$1}')" -v b="$bytes" \
  -v pr="$proxy_rss" -v ph="$proxy_hwm" -v pt="$(echo "$t2 $t3" | awk '{print $2-$1}')" \
  -v rr="$run_rss" -v rh="$run_hwm" -v rt="$(echo "$t4 $t5" | awk '{print $2-$1}')" 'BEGIN {
  printf "routes=%d endpoints=%d\n", n, e * 100
  printf "tollgate compile (parse+compile+write): %.2fs, table %.1f MB JSON\n", c, b/1048576
  printf "tollgate-proxy: rss=%sMB peak=%sMB, start to serving %.2fs\n", pr, ph, pt
  printf "tollgate run:   rss=%sMB peak=%sMB, start to serving %.2fs\n", rr, rh, rt }'
