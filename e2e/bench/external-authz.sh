#!/usr/bin/env bash
# What the decision cache of AuthPolicy `external` authorization buys: the route asking an Envoy
# ext_authz gRPC service (extauthz-grpc, e2e/extauthz.sh) on every request, the same route with
# `cacheTTL` (every request after the first answered from the cache), and the bare route, side
# by side in the same seconds (e2e/bench/side-by-side.sh, as policies.sh): `cached` beside the
# bare route, `uncached` beside the bare route, and `uncached` beside `cached` (target
# `vs-cached`, the issue's comparison: cached at least 10x the requests per second of the
# uncached call). A control, twin, is the bare route again.
#
# Each variant runs in its own tollgate-proxy (one worker) on CPU 0; wrk, the nginx backend and
# extauthz-grpc share CPU 1. Every request carries `x-allow: yes`, which the service allows:
# the figures are the cost of asking (or not asking) it. Traffic stays on 127.0.0.1.
# Installs nginx and wrk from apt when missing; builds Tollgate in release mode (PROFILE=debug:
# a quick check of the script, whose figures mean nothing) and extauthz-grpc (e2e/extauthz.sh).
#
# Writes e2e/bench/results/external-authz-latest.md and a dated copy.
# Usage: e2e/bench/external-authz.sh   env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                           PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init external-authz
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
extauthz=$("$root/e2e/extauthz.sh" build)
# Another benchmark's backend on the same port would answer (and vanish) in ours: refuse.
for p in 19080 19191 19192 18590 18591 18592 18593; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "127.0.0.1:$p is in use (another benchmark running?); not measuring" >&2
    exit 1
  fi
done
sbs_binaries
sbs_backend

spawn 1 "$extauthz" -listen 127.0.0.1:19191 -count 127.0.0.1:19192
for _ in $(seq 1 200); do curl -sf http://127.0.0.1:19192/count >/dev/null && break; sleep 0.05; done
checks() { curl -sf http://127.0.0.1:19192/count; }

read -r -a variants <<<"$(python3 "$bench/gen.py" policies "$work/v" external)"
admin=19930
for v in "${variants[@]}"; do
  d=$work/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r port hdr <"$d/request"
  port_of[$v]=$port
  hdr_of[$v]=$hdr
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port/" "${hs[@]}"
done
# The uncached variant again, loaded beside the cached one.
port_of[vs-cached]=${port_of[uncached]}
hdr_of[vs-cached]=${hdr_of[uncached]}
pid_of[vs-cached]=${pid_of[uncached]}
partner_of[vs-cached]=cached
# Without `x-allow: yes` the service denies: the benchmark measures enforcement.
for v in cached uncached; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port_of[$v]}/")
  [ "$code" = 403 ] || { echo "$v answered $code without x-allow" >&2; exit 1; }
done

# Check calls per request of each variant, counted around its measured seconds.
sbs_measure_start() { k0=$(checks); }
sbs_measure_end() { k1=$(checks); }
sbs_record_extra() { # variant round
  local n p=${partner_of[$1]:-bare}
  n=$(awk '/requests in/ {print $1}' "$work/out.$1")
  [ "$p" = cached ] && n=$((n + $(awk '/requests in/ {print $1}' "$work/out.bare")))
  record "$2" "$1" checks_per_request "$(awk -v c=$((k1 - k0)) -v n="$n" 'BEGIN {printf "%.5f", c / n}')"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in cached uncached vs-cached twin; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/external-authz-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$SAT_SECS" >"$dated" <<'EOF'
import statistics
import sys
raw, started, rounds, before, after, conns, bench, secs = sys.argv[1:9]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
rps = lambda var: [runs.v[(r, var)]["rps"] for r in runs.rounds]
print(f"# Tollgate external authorization benchmark ({started})\n")
print(f"Rounds: {rounds}, {secs} s each. Each variant is measured side by side with its partner: both "
      f"tollgate-proxy processes (one worker each) serve at the same time on CPU 0, each loaded by its own wrk "
      f"({int(conns) // 2} connections) on CPU 1, where the nginx backend and the authorization service "
      "(extauthz-grpc: Envoy's ext_authz over gRPC, go-control-plane's published protos) run too. The figure is "
      "the median across rounds. Every request is allowed by the service.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/external-authz.sh`\n")
print("## Goal (issue 33)\n")
print("| goal | target | measured | result |\n| --- | --- | --- | --- |")
xs = [c / u for c, u in zip(rps("bare@vs-cached"), rps("vs-cached"))]
m = statistics.median(xs)
errs = errors("vs-cached")
ok = m >= 10 and errs == 0
print(f"| requests/s with the decision cache over without it, in the same seconds | >= 10x | {m:.1f}x "
      f"(rounds {', '.join(f'{x:.1f}' for x in xs)}; errors {errs:.0f}) | **{'PASS' if ok else 'FAIL'}** |")
print("\n## Per variant (medians across rounds)\n")
print("| variant | partner | wrk requests/s | partner's requests/s | requests per proxy CPU-second | ratio to the partner (per CPU-second) | Check calls per request | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for var, partner in [("cached", "bare"), ("uncached", "bare"), ("vs-cached", "cached"), ("twin", "bare")]:
    cpr = med(var, "checks_per_request")
    print(f"| {var if var != 'vs-cached' else 'uncached'} | {partner} | {med(var, 'rps'):,.0f} | "
          f"{med('bare@' + var, 'rps'):,.0f} | {med(var, 'rps_per_core'):,.0f} | {ratio(var)[0]:.3f} | "
          f"{cpr:.4f} | {errors(var):.0f} |")
print(f"| bare route alone | | {med('bare-alone', 'rps'):,.0f} | | {med('bare-alone', 'rps_per_core'):,.0f} | | | "
      f"{runs.alone_errors():.0f} |")
print("\nCheck calls per request count the service's answers over the pair's requests (for `uncached` beside "
      "`cached`, over both). Without the cache the request waits for the service, which shares CPU 1 with wrk "
      "and nginx: its requests per second are bound by the service's, and the proxy's CPU per request includes "
      "the gRPC client's work. With the cache the route costs about what the bare route does (the ratio to the "
      "bare route per CPU-second: the digest of the forwarded attributes and the cache lookup).")
m, xs = ratio("twin")
print(f"\nControl: `twin` is the bare route in a second proxy, beside the bare route; its ratio, {m:.3f} (rounds "
      f"{', '.join(f'{x:.3f}' for x in xs)}), shows that two equal proxies side by side are treated alike.")
EOF
cp "$dated" "$bench/results/external-authz-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/external-authz-latest.md"
