#!/usr/bin/env bash
# What the decision cache of AuthPolicy `external` authorization buys, against two Envoy ext_authz
# gRPC services: extauthz-grpc (e2e/extauthz.sh), a trivial service that answers without work,
# and opa-envoy-grpc (e2e/opa-envoy.sh), Open Policy Agent evaluating OPA-Envoy's tutorial
# policy (an HS256 JWT bearer token decoded and verified, its `role` claim checked against the
# method and path) as OPA-Envoy does. For each service: the route asking it on every request
# (`uncached`), the same route with `cacheTTL` (`cached`: every request after the first answered
# from the cache), and the bare route, side by side in the same seconds (e2e/bench/side-by-side.sh,
# as policies.sh): `cached` beside the bare route, `uncached` beside the bare route, and
# `uncached` beside `cached` (target `vs-cached`, the issue's comparison: cached at least 10x the
# requests per second of the uncached call). A control, twin, is the bare route again. The OPA
# variants' names end in `-opa`.
#
# Each variant runs in its own tollgate-proxy (one worker) on CPU 0; wrk, the nginx backend and
# the authorization services share CPU 1. Every request is one the service allows (`x-allow:
# yes` for extauthz-grpc, a valid `role: guest` token on GET /people/alice for OPA): the figures
# are the cost of asking (or not asking) it. Check calls are counted by the services themselves,
# and their CPU time over the same seconds, so the report also gives the CPU per request of proxy
# plus service with and without the cache, which does not move with how the two cores are shared.
# Traffic stays on 127.0.0.1. No delay is added anywhere.
# Installs nginx and wrk from apt when missing; builds Tollgate in release mode (PROFILE=debug:
# a quick check of the script, whose figures mean nothing) and the services (their scripts).
#
# Writes e2e/bench/results/external-authz-latest.md and a dated copy.
# Usage: e2e/bench/external-authz.sh   env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                           PROFILE (release), SERVICES ("extauthz opa")
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init external-authz
SERVICES=${SERVICES:-extauthz opa}
read -r -a services <<<"$SERVICES"
declare -A suffix_of=([extauthz]="" [opa]=-opa) grpc_port_of=([extauthz]=19191 [opa]=19193)
declare -A count_port_of=([extauthz]=19192 [opa]=19194) svc_of=() svc_pid_of=()
for s in "${services[@]}"; do
  [[ -v "suffix_of[$s]" ]] || { echo "SERVICES: unknown service $s (extauthz, opa)" >&2; exit 1; }
done
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
declare -A service_bin=()
for s in "${services[@]}"; do
  case $s in
    extauthz) service_bin[$s]=$("$root/e2e/extauthz.sh" build) ;;
    opa) service_bin[$s]=$("$root/e2e/opa-envoy.sh" build) ;;
  esac
done
# Another benchmark's backend on the same port would answer (and vanish) in ours: refuse.
for p in 19080 19191 19192 19193 19194 18590 18591 18592 18593 18594 18595; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "127.0.0.1:$p is in use (another benchmark running?); not measuring" >&2
    exit 1
  fi
done
sbs_binaries
sbs_backend

for s in "${services[@]}"; do
  spawn 1 "${service_bin[$s]}" -listen "127.0.0.1:${grpc_port_of[$s]}" -count "127.0.0.1:${count_port_of[$s]}"
  svc_pid_of[$s]=$last_pid
  for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:${count_port_of[$s]}/count" >/dev/null && break; sleep 0.05; done
done
checks() { curl -sf "http://127.0.0.1:${count_port_of[$1]}/count"; } # service

# OPA-Envoy's tutorial policy allows a guest GET /people/*; every target asks for the same path.
path=/people/alice
read -r -a all <<<"$(python3 "$bench/gen.py" policies "$work/v" external)"
variants=(bare twin)
for s in "${services[@]}"; do
  variants+=("cached${suffix_of[$s]}" "uncached${suffix_of[$s]}")
  svc_of["cached${suffix_of[$s]}"]=$s
  svc_of["uncached${suffix_of[$s]}"]=$s
  svc_of["vs-cached${suffix_of[$s]}"]=$s
done
admin=19930
for v in "${all[@]}"; do
  [[ " ${variants[*]} " == *" $v "* ]] || continue
  d=$work/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r port hdr <"$d/request"
  port_of[$v]=$port
  hdr_of[$v]=$hdr
  path_of[$v]=$path
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port$path" "${hs[@]}"
done
for s in "${services[@]}"; do
  x=${suffix_of[$s]}
  # The uncached variant again, loaded beside the cached one.
  port_of["vs-cached$x"]=${port_of[uncached$x]}
  hdr_of["vs-cached$x"]=${hdr_of[uncached$x]}
  path_of["vs-cached$x"]=$path
  pid_of["vs-cached$x"]=${pid_of[uncached$x]}
  partner_of["vs-cached$x"]=cached$x
  # Without the header or token the service allows, it denies: the benchmark measures enforcement.
  for v in cached$x uncached$x; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port_of[$v]}$path")
    [ "$code" = 403 ] || { echo "$v answered $code without the allowed credentials" >&2; exit 1; }
    if [ "$s" = opa ]; then # the token, but a path the policy does not grant
      IFS=$'\t' read -r -a hs <<<"${hdr_of[$v]}"
      code=$(curl -s -o /dev/null -w '%{http_code}' -H "${hs[0]}" "http://127.0.0.1:${port_of[$v]}/admin")
      [ "$code" = 403 ] || { echo "$v answered $code for GET /admin" >&2; exit 1; }
    fi
  done
done

# Check calls per request of each variant, counted by its service around its measured seconds,
# and the service's CPU time over them (Check calls per service CPU-second: its capacity).
sbs_measure_start() {
  local s=${svc_of[$1]:-}
  [ -n "$s" ] || return 0
  k0=$(checks "$s")
  cpu_snap "${svc_pid_of[$s]}" "$work/cpu.s0"
}
sbs_measure_end() {
  local s=${svc_of[$1]:-}
  [ -n "$s" ] || return 0
  k1=$(checks "$s")
  cpu_snap "${svc_pid_of[$s]}" "$work/cpu.s1"
}
sbs_record_extra() { # variant round
  local n p=${partner_of[$1]:-bare} ns
  [ -n "${svc_of[$1]:-}" ] || return 0
  n=$(awk '/requests in/ {print $1}' "$work/out.$1")
  [[ $p == cached* ]] && n=$((n + $(awk '/requests in/ {print $1}' "$work/out.bare")))
  record "$2" "$1" checks_per_request "$(awk -v c=$((k1 - k0)) -v n="$n" 'BEGIN {printf "%.5f", c / n}')"
  ns=$(cpu_ns "$work/cpu.s0" "$work/cpu.s1")
  record "$2" "$1" checks_per_service_cpu_s "$(awk -v c=$((k1 - k0)) -v ns="$ns" 'BEGIN {printf "%.0f", (ns > 0) ? c / (ns / 1e9) : 0}')"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for s in "${services[@]}"; do
    x=${suffix_of[$s]}
    for v in cached$x uncached$x vs-cached$x; do pair "$v" "$r"; done
  done
  pair twin "$r"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/external-authz-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$SAT_SECS" \
  "${services[*]}" >"$dated" <<'EOF'
import statistics
import sys
raw, started, rounds, before, after, conns, bench, secs, services = sys.argv[1:10]
services = services.split()
sys.path.insert(0, bench)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
rps = lambda var: [runs.v[(r, var)]["rps"] for r in runs.rounds]
SUFFIX = {"extauthz": "", "opa": "-opa"}
NAME = {"extauthz": "extauthz-grpc (trivial: answers without work)",
        "opa": "opa-envoy-grpc (OPA v1.22.4, OPA-Envoy's tutorial JWT policy)"}
print(f"# Tollgate external authorization benchmark ({started})\n")
print(f"Rounds: {rounds}, {secs} s each. Each variant is measured side by side with its partner: both "
      f"tollgate-proxy processes (one worker each) serve at the same time on CPU 0, each loaded by its own wrk "
      f"({int(conns) // 2} connections) on CPU 1, where the nginx backend and the authorization services run "
      "too. The services speak Envoy's ext_authz over gRPC (go-control-plane's published protos): "
      "extauthz-grpc allows `x-allow: yes` without other work; opa-envoy-grpc (e2e/opa-envoy.sh) is OPA's Rego "
      "engine doing what OPA-Envoy's gRPC server does per Check call (the CheckRequest as input, a prepared "
      "query) with OPA-Envoy's tutorial policy: the bearer token, an HS256 JWT, decoded and verified, its "
      "`role` claim checked against the method and the path (GET /people/alice). The figure is the median "
      "across rounds. Every request is allowed by the service; no delay is added anywhere.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} SERVICES=\"{' '.join(services)}\" e2e/bench/external-authz.sh`\n")
print("## Goal (issue 33)\n")
print("| goal | service | target | measured | result |\n| --- | --- | --- | --- | --- |")
for s in services:
    x = SUFFIX[s]
    xs = [c / u for c, u in zip(rps("bare@vs-cached" + x), rps("vs-cached" + x))]
    m = statistics.median(xs)
    errs = errors("vs-cached" + x)
    ok = m >= 10 and errs == 0
    print(f"| requests/s with the decision cache over without it, in the same seconds | {NAME[s]} | >= 10x | "
          f"{m:.1f}x (rounds {', '.join(f'{v:.1f}' for v in xs)}; errors {errs:.0f}) | **{'PASS' if ok else 'FAIL'}** |")
print("\nThe goal compares requests per second served in the same seconds, so it measures this machine's "
      "split as much as the cache: the uncached route is bound by the service's share of CPU 1 (shared with "
      "both wrk and nginx, and with whatever else runs there), the cached route by its proxy's share of CPU 0. "
      "CPU time per request does not depend on that split: the row below counts the CPU the uncached request "
      "costs the proxy and the service together (proxy CPU-seconds per request plus the service's per Check "
      "call times Check calls per request, from `uncached` beside the bare route) over the cached request's "
      "proxy CPU (from `cached` beside the bare route), round by round.\n")
print("| service | CPU per request (proxy + service), uncached over cached | uncached: proxy µs + service µs per request | cached: proxy µs per request | the service's share of a core in `uncached` beside `cached` |")
print("| --- | --- | --- | --- | --- |")
verdicts = []
for s in services:
    x = SUFFIX[s]
    per = []
    for r in runs.rounds:
        u, c = runs.v[(r, "uncached" + x)], runs.v[(r, "cached" + x)]
        proxy_us, cached_us = 1e6 / u["rps_per_core"], 1e6 / c["rps_per_core"]
        svc_us = 1e6 * u["checks_per_request"] / u["checks_per_service_cpu_s"]
        per.append(((proxy_us + svc_us) / cached_us, proxy_us, svc_us, cached_us))
    m = statistics.median(p[0] for p in per)
    # One Check call per uncached request (the cached partner's are a handful): calls per second
    # over calls per CPU-second.
    share = med("vs-cached" + x, "rps") / med("vs-cached" + x, "checks_per_service_cpu_s")
    print(f"| {s} | {m:.1f}x (rounds {', '.join(f'{p[0]:.1f}' for p in per)}) | "
          f"{statistics.median(p[1] for p in per):.1f} + {statistics.median(p[2] for p in per):.1f} | "
          f"{statistics.median(p[3] for p in per):.1f} | {share:.0%} |")
    verdicts.append((s, m, share))
print()
for s, m, share in verdicts:
    same = statistics.median(c / u for c, u in zip(rps("bare@vs-cached" + SUFFIX[s]), rps("vs-cached" + SUFFIX[s])))
    print(f"- {s}: in CPU the cache saves {m:.1f}x per request; in requests per second over the same seconds "
          f"{same:.1f}x: the uncached route waits for each Check round trip (its service got {share:.0%} of "
          "CPU 1, shared with wrk and nginx) while the cached proxy shares CPU 0 with the uncached one (and, on a "
          "loaded machine, both cores with other processes). "
          + ("The goal is met." if same >= 10 else
             "The goal, as the issue words it (requests per second), is not met here."
             + (" Against a service that does real work the cache saves more than 10x the CPU per request."
                if m >= 10 else " The service does so little per call that the cache cannot save 10x.")))
print("\n## Per variant (medians across rounds)\n")
print("| variant | partner | wrk requests/s | partner's requests/s | requests per proxy CPU-second | ratio to the partner (per CPU-second) | Check calls per request | Check calls per service CPU-second | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
rows = []
for s in services:
    x = SUFFIX[s]
    rows += [("cached" + x, "bare"), ("uncached" + x, "bare"), ("vs-cached" + x, "cached" + x)]
rows.append(("twin", "bare"))
for var, partner in rows:
    has_svc = var != "twin"
    cpr = f"{med(var, 'checks_per_request'):.4f}" if has_svc else ""
    # A cached variant's service makes one call, then idles: no capacity to read from it.
    cps = med(var, "checks_per_service_cpu_s") if has_svc and not var.startswith("cached") else 0
    print(f"| {var.replace('vs-cached', 'uncached')} | {partner} | {med(var, 'rps'):,.0f} | "
          f"{med('bare@' + var, 'rps'):,.0f} | {med(var, 'rps_per_core'):,.0f} | {ratio(var)[0]:.3f} | "
          f"{cpr} | {f'{cps:,.0f}' if cps else ''} | {errors(var):.0f} |")
print(f"| bare route alone | | {med('bare-alone', 'rps'):,.0f} | | {med('bare-alone', 'rps_per_core'):,.0f} | | | | "
      f"{runs.alone_errors():.0f} |")
print("\nCheck calls per request count the service's answers over the pair's requests (for `uncached` beside "
      "`cached`, over both). Check calls per service CPU-second is the service's own capacity, measured from its "
      "threads' CPU time over the same seconds. Without the cache the request waits for the service, which "
      "shares CPU 1 with wrk and nginx: its requests per second are bound by the service's, and the proxy's CPU "
      "per request includes the gRPC client's work. With the cache the route costs a little more than the bare "
      "route (its ratio to the bare route per CPU-second; where that goes: below).")
print("\n## Where the cached path's cost goes\n")
print("Profiled apart from this run, on 2026-12-07 (load average about 9): `perf record -F 4000 -p PID` on the "
      "`cached` proxy and the bare route's proxy at the same time for 8 s, each loaded by wrk (25 connections) "
      "as here, samples over requests served. Per request the cached proxy spent 19.3 µs (12.3 in the kernel, "
      "7.0 in user space), the bare route 16.1 µs (10.9 + 5.2). Of the 1.8 µs more in user space: the SHA-256 "
      "digest of the forwarded attributes 0.24 µs (sha2's SHA-NI code; callgrind shows it as 38% of the "
      "instructions because valgrind hides SHA-NI and sha2 falls back to its portable code, so "
      "`SET=external e2e/bench/callgrind-policies.sh` overstates it), the cache lookup (quick_cache, a shard "
      "read lock and an `Arc` clone) 0.07 µs, the `cache_hit` counter (prometheus-client's label map) 0.06 µs, "
      "the AuthPolicy around the rule (identity-header strip, CEL activation, the empty authentication step) "
      "about 0.2 µs, and the service's answer applied again on every hit (extauthz-grpc's grant adds two "
      "upstream headers and one client header: cloning, inserting and encoding them) about 0.3 µs; the rest is "
      "spread thin over inlined request handling. The kernel's extra 1.4 µs is mostly socket wake-ups "
      "(`_raw_spin_unlock_irqrestore` under `sock_def_readable`), which move with the load, not with the policy. "
      "The digest, the lookup and the counter together are about 0.4 µs of 19 µs (2%): no cheaper hash or "
      "lock-free map would move the cached route's ratio to the bare route by more than that; the ratio's gap "
      "is mostly the policy framework and the headers the service asked for.")
m, xs = ratio("twin")
print(f"\nControl: `twin` is the bare route in a second proxy, beside the bare route; its ratio, {m:.3f} (rounds "
      f"{', '.join(f'{x:.3f}' for x in xs)}), shows that two equal proxies side by side are treated alike.")
EOF
cp "$dated" "$bench/results/external-authz-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/external-authz-latest.md"
