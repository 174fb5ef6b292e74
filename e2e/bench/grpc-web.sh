#!/usr/bin/env bash
# What translating gRPC-Web costs: requests per proxy CPU-second of a unary call through a
# GRPCRoute to a real gRPC server (extauthz-grpc, grpc-go: Authorization/Check with an empty
# request, answered with a small message and `grpc-status: 0`), for a browser's gRPC-Web
# call, as a ratio to the same call made in native gRPC, measured side by side in the same
# seconds (side-by-side.sh: both proxies on CPU 0, one worker each, each loaded by its own
# h2load on CPU 1 with the gRPC server). Variants: `web` (application/grpc-web over HTTP/2),
# `web-text-h1` (application/grpc-web-text over HTTP/1.1, as XHR-based browser clients send
# it) and the control `twin` (native gRPC again: two equal proxies come out equal). The bare
# route is native gRPC over HTTP/2 (h2c). The figure is the median across rounds. Traffic
# stays on 127.0.0.1.
# Installs h2load (nghttp2-client) from apt when missing; builds extauthz-grpc
# (e2e/extauthz.sh) when not cached; builds Tollgate in release mode (PROFILE=debug: a debug
# build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/grpc-web-latest.md and a dated copy.
# Usage: e2e/bench/grpc-web.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                       PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init grpc-web
command -v h2load >/dev/null || apt_install nghttp2-client
for t in curl python3 taskset base64; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
extauthz=$("$root/e2e/extauthz.sh" build)

spawn 1 "$extauthz" -listen 127.0.0.1:19191
sleep 0.5

METHOD=/envoy.service.auth.v3.Authorization/Check
# One empty message: flag 0, length 0.
printf '\0\0\0\0\0' >"$work/msg.bin"
printf 'AAAAAAA=' >"$work/msg.txt"

declare -A ct_of=() body_of=() h1_of=()
declare -A ports=([bare]=18890 [web]=18891 [web-text-h1]=18892 [twin]=18893)
variants=(web web-text-h1 twin)
for v in bare twin; do ct_of[$v]=application/grpc body_of[$v]=$work/msg.bin; done
ct_of[web]=application/grpc-web+proto body_of[web]=$work/msg.bin
ct_of[web-text-h1]=application/grpc-web-text body_of[web-text-h1]=$work/msg.txt h1_of[web-text-h1]=--h1
admin=19990
for v in bare "${variants[@]}"; do
  d=$work/v/$v
  mkdir -p "$d/manifests"
  cat >"$d/manifests/bench.yaml" <<YAML
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
  listeners: [{name: http, protocol: HTTP, port: ${ports[$v]}}]
---
apiVersion: v1
kind: Service
metadata: {name: authz, namespace: default}
spec: {ports: [{name: grpc, port: 80, appProtocol: grpc}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: authz-1, namespace: default, labels: {kubernetes.io/service-name: authz}}
addressType: IPv4
ports: [{name: grpc, port: 19191}]
endpoints: [{addresses: ["127.0.0.1"]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: bench, namespace: default}
spec:
  parentRefs: [{name: bench}]
  rules:
  - matches: [{method: {service: envoy.service.auth.v3.Authorization}}]
    backendRefs: [{name: authz, port: 80}]
YAML
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  port_of[$v]=${ports[$v]}
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
done

# h2load in place of wrk (wrk speaks HTTP/1.1 only): one unary call per request, no pipelining.
load() { # target seconds outfile connections: h2load on CPU 1
  local v=$1
  # shellcheck disable=SC2086 # h1_of is empty or one flag
  taskset -c 1 h2load ${h1_of[$v]:-} -t1 -c"$4" -m1 -D "$2" -d "${body_of[$v]}" \
    -H "content-type: ${ct_of[$v]}" -H "te: trailers" \
    "http://127.0.0.1:${port_of[$v]}$METHOD" >"$3" 2>&1
  # The figure pair() and alone() log, as wrk words it.
  echo "Requests/sec: $(awk '/^finished in/ {print $4}' "$3")" >>"$3"
}
record_run() { # round name outfile cpu_ns, from h2load's summary
  local n
  n=$(awk '/^requests:/ {print $8}' "$3")
  if ! { [ -n "$n" ] && [ "$n" -gt 0 ]; }; then
    echo "no requests succeeded for $2 (round $1): $(cat "$3")" >&2
    exit 1
  fi
  record "$1" "$2" rps "$(awk '/^finished in/ {print $4}' "$3")"
  record "$1" "$2" rps_per_core "$(awk -v ns="$4" -v n="$n" 'BEGIN {printf "%.0f", (ns > 0) ? n / (ns / 1e9) : 0}')"
  record "$1" "$2" errors "$(awk '/^requests:/ {s += $10 + $12} /^status codes:/ {s += $5 + $7 + $9} END {print s + 0}' "$3")"
  record "$1" "$2" requests "$n"
}

# Every variant must be a successful call of its own protocol before anything is measured.
for v in bare "${variants[@]}"; do
  h=(--http2-prior-knowledge)
  [ -z "${h1_of[$v]:-}" ] || h=(--http1.1)
  for _ in $(seq 1 100); do
    curl -s -o "$work/body.$v" -D "$work/head.$v" "${h[@]}" -X POST -H "content-type: ${ct_of[$v]}" \
      -H 'te: trailers' --data-binary @"${body_of[$v]}" "http://127.0.0.1:${ports[$v]}$METHOD" && break
    sleep 0.1
  done
  case $v in
    bare | twin) want="grpc-status: 0" file=$work/head.$v ;;
    web) want="grpc-status:0" file=$work/body.$v ;;
    web-text-h1) want="grpc-status:0" file=$work/body.dec
      # Each piece is base64 on its own (padded): decode them one by one.
      python3 -c 'import base64, re, sys
t = open(sys.argv[1], "rb").read()
sys.stdout.buffer.write(b"".join(base64.b64decode(p) for p in re.findall(rb"[^=]*=*", t) if p))' \
        "$work/body.$v" >"$file" ;;
  esac
  tr -d '\r ' <"$file" | grep -aq "${want// /}" ||
    { echo "$v: no '$want' in the answer: $(cat "$work/head.$v")" >&2; exit 1; }
  grep -qi "content-type: ${ct_of[$v]}" "$work/head.$v" ||
    { echo "$v answered another content type: $(cat "$work/head.$v")" >&2; exit 1; }
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/grpc-web-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$PROFILE" >"$dated" <<'EOF_PY'
import sys
raw, started, rounds, before, after, conns, bench, profile = sys.argv[1:9]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
print(f"# Tollgate gRPC-Web benchmark ({started})\n")
if profile != "release":
    print(f"**{profile} build: these figures check the script and mean nothing about speed.**\n")
print(f"Rounds: {rounds}. A unary call (extauthz-grpc's Authorization/Check, grpc-go) through a GRPCRoute. Each "
      f"variant is measured side by side with native gRPC over HTTP/2: both tollgate-proxy processes (one worker "
      f"each) serve at the same time on CPU 0, each loaded by its own h2load ({int(conns) // 2} connections, one "
      "call at a time on each) on CPU 1 with the gRPC server, and a round's ratio is the variant's calls per proxy "
      "CPU-second (CPU time from schedstat) over native gRPC's in the same seconds. The figure is the median "
      "across rounds.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/grpc-web.sh`\n")
print("| variant | calls per proxy CPU-second | native gRPC beside it | ratio | per-round ratios | "
      "h2load calls/s | failed + non-2xx |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for var in ["web", "web-text-h1", "twin"]:
    m, xs = ratio(var)
    print(f"| {var} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | {m:.3f} | "
          f"{', '.join(f'{x:.3f}' for x in xs)} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| native gRPC alone | {med('bare-alone', 'rps_per_core'):,.0f} | | | | {med('bare-alone', 'rps'):,.0f} | "
      f"{runs.alone_errors():.0f} |")
m, xs = ratio("twin")
print(f"\nControl: `twin` is native gRPC in a second proxy, measured beside native gRPC like every variant; "
      f"its ratio, {m:.3f}, shows that two equal proxies side by side are treated alike.")
EOF_PY
cp "$dated" "$bench/results/grpc-web-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/grpc-web-latest.md"
