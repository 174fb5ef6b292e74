#!/usr/bin/env bash
# Instructions per request (user space, valgrind callgrind) for each contender of a scenario
# of `gen.py configs` (`one`, default, or `routes10k`: SCENARIO=routes10k): a figure that does not
# move with the machine's load, for when wall time is too noisy to decide. Each proxy runs under callgrind with instrumentation off, gets a warm-up,
# then exactly N keep-alive requests (oha -n N -c 10) with instrumentation on.
# Needs what run.sh installs, plus valgrind. Writes callgrind.out files to OUT (kept).
# Usage: e2e/bench/callgrind.sh [N (default 5000)] [OUT (default a temp dir)]; BUILD=0 uses the binaries already built
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=$PWD/e2e/bench
n=${1:-5000}
scenario=${SCENARIO:-one}
out=${2:-$(mktemp -d /tmp/tollgate-callgrind.XXXXXX)}
mkdir -p "$out"
# shellcheck source=e2e/bench/callgrind-lib.sh
. "$bench/callgrind-lib.sh"
callgrind_setup
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
  -subj /CN=bench.example.test -keyout "$out/key.pem" -out "$out/cert.pem" 2>/dev/null
python3 "$bench/gen.py" configs "$scenario" "$out/cfg" --cert "$out/cert.pem" --key "$out/key.pem" >/dev/null
# The request the scenario's load sends: Host, path (and a header this script does not use).
IFS=$'\t' read -r host path _ <"$out/cfg/request"
"$bin/tollgate" compile "$out/cfg/manifests" --out "$out/cfg/table" >/dev/null
# valgrind follows one process: nginx without a master.
sed -i 's/^daemon off;/daemon off;\nmaster_process off;/' "$out/cfg/nginx.conf"

measure() { # name port command...
  local name=$1 port=$2 pid ir
  shift 2
  taskset -c 0 valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out/callgrind.out.$name" "$@" >"$out/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 600); do
    curl -s -o /dev/null -H "Host: $host" "http://127.0.0.1:$port$path" && break
    sleep 0.1
  done
  taskset -c 1 "$oha" --no-tui -n 500 -c 10 -H "Host: $host" "http://127.0.0.1:$port$path" >/dev/null
  callgrind_control -i on "$pid" >/dev/null
  taskset -c 1 "$oha" --no-tui -n "$n" -c 10 -H "Host: $host" "http://127.0.0.1:$port$path" >/dev/null
  callgrind_control -i off "$pid" >/dev/null
  # tollgate-proxy stops on SIGINT; nginx and HAProxy under valgrind need SIGTERM.
  kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ir=$(awk '/^totals:/ {print $2; exit}' "$out/callgrind.out.$name")
  printf '%-8s %12s instructions per request (%s)\n' "$name" "$(awk -v i="$ir" -v n="$n" 'BEGIN {printf "%.0f", i / n}')" "$scenario"
}
measure tollgate 18080 "$bin/tollgate-proxy" --table "$out/cfg/table/default.bench.json" \
  --admin 127.0.0.1:19901 --access-log false --workers 1
measure nginx 18081 nginx -e "$out/cfg/nginx-error.log" -c "$out/cfg/nginx.conf"
measure haproxy 18082 haproxy -db -f "$out/cfg/haproxy.cfg"
echo "callgrind files in $out (callgrind_annotate FILE for the breakdown)"
