#!/usr/bin/env bash
# Instructions per request (user space, valgrind callgrind) of tollgate-proxy for the variants of
# the policy benchmark (`gen.py policies`: bare, rl, apikey, jwt): a figure that does not move with
# the machine's load, to see what the policy phase costs and where. Each proxy runs under
# callgrind with instrumentation off, gets a warm-up, then exactly N keep-alive requests
# (oha -n N -c 10) with instrumentation on. Traffic stays on 127.0.0.1.
# Needs valgrind, nginx and oha (e2e/bench/run.sh installs oha). Writes callgrind.out.<variant>
# files to OUT (kept): `callgrind_annotate --inclusive=yes OUT/callgrind.out.rl` for the breakdown.
# With SET=external, the variants of the external authorization benchmark (`gen.py policies DIR
# external`: bare, cached, uncached, ...), asking extauthz-grpc (e2e/extauthz.sh, started here on
# core 1): `cached` is one Check call, then N hits of the decision cache.
# Usage: e2e/bench/callgrind-policies.sh [N (default 5000)] [OUT (default a temp dir)]
#        env: SET (policies | external), VARIANTS ("bare rl apikey jwt"; external: "bare cached"),
#        BUILD=0 to use the binaries already built
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=$PWD/e2e/bench
n=${1:-5000}
out=${2:-$(mktemp -d /tmp/tollgate-callgrind-policies.XXXXXX)}
mkdir -p "$out"
# shellcheck source=e2e/bench/callgrind-lib.sh
. "$bench/callgrind-lib.sh"
callgrind_setup
set=${SET:-policies}
python3 "$bench/gen.py" policies "$out/v" "$set" >/dev/null
variants=${VARIANTS:-bare rl apikey jwt}
if [ "$set" = external ]; then
  variants=${VARIANTS:-bare cached}
  taskset -c 1 "$("$PWD/e2e/extauthz.sh" build)" -listen 127.0.0.1:19191 >"$out/extauthz.log" 2>&1 &
  pids+=($!)
fi

admin=19930
for v in $variants; do
  d=$out/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r -a fields <"$d/request" # port, then the headers every variant sends
  port=${fields[0]}
  h=()
  for x in "${fields[@]:1}"; do h+=(-H "$x"); done
  taskset -c 0 valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out/callgrind.out.$v" "$bin/tollgate-proxy" \
    --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" --access-log false \
    --workers 1 >"$out/$v.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  admin=$((admin + 1))
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "${h[@]}" "http://127.0.0.1:$port/" || true)" = 200 ] && break
    sleep 0.1
  done
  taskset -c 1 "$oha" --no-tui -n 500 -c 10 "${h[@]}" "http://127.0.0.1:$port/" >/dev/null
  callgrind_control -i on "$pid" >/dev/null 2>&1
  taskset -c 1 "$oha" --no-tui -n "$n" -c 10 "${h[@]}" "http://127.0.0.1:$port/" >"$out/$v.oha"
  callgrind_control -i off "$pid" >/dev/null 2>&1
  kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ok=$(awk '/\[200\]/ {print $2}' "$out/$v.oha")
  [ "${ok:-0}" = "$n" ] || { echo "$v: only ${ok:-0} of $n answered 200" >&2; exit 1; }
  ir=$(awk '/^totals:/ {print $2; exit}' "$out/callgrind.out.$v")
  printf '%-8s %10s instructions per request\n' "$v" "$(awk -v i="$ir" -v n="$n" 'BEGIN {printf "%.0f", i / n}')"
done
echo "callgrind files in $out (callgrind_annotate --inclusive=yes FILE for the breakdown)"
