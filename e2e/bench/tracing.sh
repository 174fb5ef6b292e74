#!/usr/bin/env bash
# What OpenTelemetry tracing costs: requests per proxy CPU-second of one route with tracing
# on, exporting over OTLP/gRPC to a real OpenTelemetry Collector (e2e/otelcol.sh; its file
# exporter writes to /dev/null), at --trace-sampling 1.0 (`full`) and 0.01 (`one-percent`),
# and configured with the sampler dropping every new trace (`dropping`, ratio 0), as ratios
# to the same route with tracing off, measured side by side in the same seconds
# (side-by-side.sh: both proxies on CPU 0, each loaded by its own wrk on CPU 1 with the
# backend; the collector runs on CPU 1 too). Requests carry no `traceparent`: the ratio
# decides. A control, twin (tracing off again), shows that two equal proxies come out equal.
# The figure is the median across rounds. Traffic stays on 127.0.0.1. Also reports the
# spans each proxy dropped (`tollgate_trace_spans_dropped_total`: the collector fell behind).
# Installs nginx, wrk from apt when missing; builds Tollgate in release mode (PROFILE=debug: a
# debug build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/tracing-latest.md and a dated copy.
# Usage: e2e/bench/tracing.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                      PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init tracing
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
otelcol=$("$root/e2e/otelcol.sh" path)
sbs_binaries
sbs_backend

grpc=19417
cat >"$work/collector.yaml" <<YAML
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "127.0.0.1:$grpc"}
exporters:
  file: {path: /dev/null}
service:
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
YAML
spawn 1 "$otelcol" --config "$work/collector.yaml"
for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && break; sleep 0.1; done

declare -A ports=([bare]=18890 [full]=18891 [one-percent]=18892 [dropping]=18893 [twin]=18894)
declare -A ratio_of=([full]=1.0 [one-percent]=0.01 [dropping]=0)
declare -A admin_of=()
variants=(full one-percent dropping twin)
admin=19970
for v in bare "${variants[@]}"; do
  d=$work/v/$v
  mkdir -p "$d/manifests"
  python3 -c "import sys; sys.path.insert(0, sys.argv[1]); sys.dont_write_bytecode = True; import gen; print(gen.base('bench', int(sys.argv[2])))" \
    "$bench" "${ports[$v]}" >"$d/manifests/bench.yaml"
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  port_of[$v]=${ports[$v]}
  hdr_of[$v]=""
  extra=()
  [ -n "${ratio_of[$v]:-}" ] &&
    extra=(--otlp-endpoint "http://127.0.0.1:$grpc" --otlp-protocol grpc --trace-sampling "${ratio_of[$v]}")
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1 "${extra[@]}"
  pid_of[$v]=$last_pid
  admin_of[$v]=$admin
  admin=$((admin + 1))
  wait_200 "http://127.0.0.1:${ports[$v]}/"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
dropped=()
for v in full one-percent dropping; do
  n=$(curl -s "http://127.0.0.1:${admin_of[$v]}/metrics" | awk '/^tollgate_trace_spans_dropped_total/ {print $2}')
  dropped+=("$v=${n:-?}")
done

mkdir -p "$bench/results"
dated=$bench/results/tracing-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "${PROFILE:-release}" \
  "${dropped[*]}" >"$dated" <<'EOF_PY'
import sys
raw, started, rounds, before, after, conns, bench, profile, dropped = sys.argv[1:10]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
print(f"# Tollgate tracing benchmark ({started}, {profile} build)\n")
if profile != "release":
    print(f"**A {profile} build: these figures say nothing of a release build's costs.**\n")
print(f"Rounds: {rounds}. Each variant is measured side by side with the same route with tracing off: both "
      f"tollgate-proxy processes (one worker each) serve at the same time on CPU 0, each loaded by its own wrk "
      f"({int(conns) // 2} connections) on CPU 1 with the backend (nginx) and the OpenTelemetry Collector "
      "(OTLP/gRPC receiver, file exporter to /dev/null), and a round's ratio is the variant's requests per proxy "
      "CPU-second over the bare route's in the same seconds. The figure is the median across rounds.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} PROFILE={profile} e2e/bench/tracing.sh`\n")
print("| variant | --trace-sampling | requests per proxy CPU-second | tracing off beside it | ratio | per-round ratios | "
      "wrk requests/s | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for var, r in [("full", "1.0"), ("one-percent", "0.01"), ("dropping", "0"), ("twin", "off")]:
    m, xs = ratio(var)
    print(f"| {var} | {r} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{m:.3f} | {', '.join(f'{x:.3f}' for x in xs)} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| tracing off alone | off | {med('bare-alone', 'rps_per_core'):,.0f} | | | | "
      f"{med('bare-alone', 'rps'):,.0f} | {runs.alone_errors():.0f} |")
print(f"\nSpans dropped (export queue full): {dropped}.")
m, xs = ratio("twin")
print(f"\nControl: `twin` is the route with tracing off in a second proxy; its ratio, {m:.3f}, shows that two "
      "equal proxies side by side are treated alike.")
EOF_PY
cp "$dated" "$bench/results/tracing-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/tracing-latest.md"
