#!/usr/bin/env bash
# Resident memory of `tollgate run` serving one Gateway with N HTTPRoutes (default 10000) over
# 100 Services with E endpoints each (default 100, so 10k endpoints), and the time from start
# to the first routed answer. Usage: e2e/bench/table-memory.sh [N] [E]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10000}
e=${2:-100}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
cargo build --release -q -p tollgate
bin="$CARGO_TARGET_DIR/release/tollgate"
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
port=18080; be=19080; admin=19901
python3 e2e/bench/gen-routes.py "$n" "$dir/m" --port $port --backend-port $be --endpoints "$e" >/dev/null
start=$(date +%s.%N)
"$bin" run "$dir/m" --demo-backend 127.0.0.1:$be --admin 127.0.0.1:$admin --access-log false \
  >"$dir/log" 2>&1 &
pid=$!
last=$((n - 1 - (n - 1) % 3 + 1)); [ "$last" -lt "$n" ] || last=1   # a PathPrefix route
for _ in $(seq 1 600); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: host-$((last % 100)).example.com" \
    "http://127.0.0.1:$port/prefix/$last/x" || true)
  [ "$code" = 200 ] && break
  sleep 0.1
done
ready=$(date +%s.%N)
[ "$code" = 200 ] || { echo "never served (last code $code)"; tail -20 "$dir/log"; exit 1; }
rss_kb=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
hwm_kb=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
awk -v n="$n" -v e="$e" -v rss="$rss_kb" -v hwm="$hwm_kb" -v s="$start" -v r="$ready" 'BEGIN {
  printf "routes=%d endpoints_per_service=%d rss=%.1fMB peak_rss=%.1fMB start_to_first_answer=%.2fs\n", n, e, rss/1024, hwm/1024, r-s }'
