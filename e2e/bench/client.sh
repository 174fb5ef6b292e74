#!/usr/bin/env bash
# What finding the client's address costs (ClientPolicy `clientIP`): requests per proxy
# CPU-second of a port that trusts one X-Forwarded-For hop, and of a port that requires the
# PROXY protocol behind an L4 relay, as ratios to the bare route measured at the same time.
#
# The method is policies.sh's (side-by-side.sh): each variant runs in its own tollgate-proxy (one
# worker, access log off) beside the bare route's, both on CPU 0, each loaded by its own wrk
# (CONNS/2 connections) on CPU 1 with the backend; a round's ratio is the variant's requests per
# proxy CPU-second over the bare route's in the same seconds, the figure the median across
# rounds. Each round also measures the bare route alone, for what sharing the core costs, and
# the goals are judged with that added back when it is positive. Variants (`gen.py policies`
# client):
#   xff                   numTrustedHops: 1, beside the bare route; every request to every proxy
#                         carries X-Forwarded-For: 203.0.113.7, 198.51.100.9, so both parse the
#                         same bytes and the difference is the trust logic
#   proxy-protocol        proxyProtocol {required: true} behind HAProxy (mode tcp, send-proxy),
#                         beside the bare route behind the same HAProxy without send-proxy;
#                         keep-alive, as a balancer with pooled connections: one header per
#                         connection
#   proxy-protocol-close  the same with Connection: close, a new connection (and header) per
#                         request, the worst case; reported without a goal
#   twin, twin-relay      controls: the bare route in a second proxy, direct and behind HAProxy
# HAProxy (one thread) runs on CPU 1 with wrk and the backend. Before measuring, the script
# checks that the PROXY port is on: a direct connection without a header is closed unanswered
# (and counted by tollgate_proxy_protocol_refused_total), and through HAProxy a request from
# 127.0.0.5 reaches the backend with X-Forwarded-For 127.0.0.5 (the header's source), where the
# bare route behind the same HAProxy shows HAProxy's 127.0.0.1; after measuring, that no
# benchmark connection was refused. A goal also needs zero errors. Traffic stays on 127.0.0.1.
# Installs nginx, wrk and haproxy from apt when missing; builds Tollgate in release mode
# (PROFILE=debug: a debug build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/client-latest.md and a dated copy.
# Usage: e2e/bench/client.sh       env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                       PROFILE (release), PROXY_VERSION (1: send-proxy; 2: v2)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# The method: sbs_init, spawn, wait_200, load, alone, pair (and cpu.sh, backend.sh).
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init client
PROXY_VERSION=${PROXY_VERSION:-1}
case $PROXY_VERSION in
  1 | 2) ;;
  *) echo "PROXY_VERSION must be 1 or 2" >&2; exit 1 ;;
esac
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
command -v haproxy >/dev/null || apt_install haproxy
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
BACKEND_XFF_ECHO=1 sbs_backend

read -r -a variants <<<"$(python3 "$bench/gen.py" policies "$work/v" client "$PROXY_VERSION")"
declare -A proxy_pid proxy_port proxy_admin
admin=19950
while IFS=$'\t' read -r p port; do
  d=$work/v/proxies/$p
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  proxy_pid[$p]=$last_pid
  proxy_port[$p]=$port
  proxy_admin[$p]=$admin
  admin=$((admin + 1))
done <"$work/v/proxies.tsv"
# The tables carry what the variants measure, and nothing else: xff and proxy-protocol one
# setting each, the others none.
python3 - "$work/v/proxies" <<'EOF'
import json, sys
want = {"bare": None, "twin": None, "xff": {"forwardedFor": {"numTrustedHops": 1}},
        "proxy-protocol": {"proxyProtocol": {"required": True}}}
for name, client in want.items():
    ports = json.load(open(f"{sys.argv[1]}/{name}/table/default.bench.json"))["ports"]
    got = [p.get("client") for p in ports]
    if got != [client]:
        sys.exit(f"{name}: the table's client settings are {got}, not [{client}]")
EOF
spawn 1 haproxy -db -f "$work/v/haproxy.cfg"

while IFS=$'\t' read -r t p port partner hdr; do # hdr: the headers, tab-separated
  port_of[$t]=$port
  hdr_of[$t]=$hdr
  pid_of[$t]=${proxy_pid[$p]}
  [ "$partner" = - ] || partner_of[$t]=$partner
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port/" "${hs[@]}"
done <"$work/v/targets.tsv"

# PROXY protocol is on where it should be, and only there.
refused() { # proxy: connections its port closed for a missing or invalid PROXY header
  curl -s "http://127.0.0.1:${proxy_admin[$1]}/metrics" |
    awk '/^tollgate_proxy_protocol_refused_total/ {s += $NF} END {print s + 0}'
}
checks=$work/checks.md
pp=proxy-protocol
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:${proxy_port[$pp]}/" || true)
[ "$code" = 000 ] || { echo "$pp answered $code to a connection without a PROXY header" >&2; exit 1; }
refused_before=$(refused "$pp")
[ "$refused_before" -ge 1 ] || { echo "$pp did not count the connection it refused" >&2; exit 1; }
echo "- \`curl http://127.0.0.1:${proxy_port[$pp]}/\`, straight to the $pp proxy without a header:" \
  "no answer (curl's code $code); tollgate_proxy_protocol_refused_total $refused_before." >>"$checks"
for t in "$pp" bare-relay; do
  seen=$(curl -s --max-time 5 --interface 127.0.0.5 "http://127.0.0.1:${port_of[$t]}/xff" || true)
  want=127.0.0.1
  [ "$t" = "$pp" ] && want=127.0.0.5
  [ "$seen" = "$want" ] || { echo "$t: the backend saw X-Forwarded-For '$seen', not $want" >&2; exit 1; }
  echo "- \`curl --interface 127.0.0.5 http://127.0.0.1:${port_of[$t]}/xff\`, through HAProxy to" \
    "the ${t%-relay} proxy: the backend saw X-Forwarded-For \`$seen\`." >>"$checks"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
refused_after=$(refused "$pp")
echo "- After the rounds, tollgate_proxy_protocol_refused_total of the $pp proxy was" \
  "$refused_after: $((refused_after - refused_before)) benchmark connections refused." >>"$checks"
[ "$refused_after" = "$refused_before" ] || { echo "$pp refused connections while measured" >&2; exit 1; }

reproduce="ROUNDS=$ROUNDS SAT_SECS=$SAT_SECS CONNS=$CONNS"
[ "$PROXY_VERSION" = 1 ] || reproduce+=" PROXY_VERSION=$PROXY_VERSION"
[ "$PROFILE" = release ] || reproduce+=" PROFILE=$PROFILE"
reproduce+=" e2e/bench/client.sh"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit+=" (with uncommitted changes)"
[ "${BUILD:-1}" = 1 ] || commit+=", binaries built before the run (BUILD=0)"
haproxy_version=$(haproxy -v | awk 'NR == 1 {print $3}')

mkdir -p "$bench/results"
dated=$bench/results/client-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$checks" \
  "$reproduce" "$PROFILE" "$commit" "$PROXY_VERSION" "$haproxy_version" >"$dated" <<'EOF'
import sys
(raw, started, rounds, before, after, conns, bench, checks, reproduce, profile, commit, ppv,
 haproxy) = sys.argv[1:14]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
share = runs.share()
send = {"1": "send-proxy (v1, text)", "2": "send-proxy-v2 (binary)"}[ppv]
print(f"# Tollgate client-address benchmark ({started})\n")
if profile != "release":
    print(f"**{profile} build: a check that the script runs, not a measurement. Its figures mean nothing.**\n")
print(f"Tollgate {commit}, {profile} build; HAProxy {haproxy}.\n")
print(f"Rounds: {rounds}. Each variant is measured side by side with the bare route: both tollgate-proxy "
      f"processes (one worker each, access log off) serve at the same time on CPU 0, each loaded by its own wrk "
      f"({int(conns) // 2} connections) on CPU 1 with the backend and HAProxy, and a round's ratio is the variant's "
      "requests per proxy CPU-second (CPU time from schedstat) over the bare route's in the same seconds, so a "
      "change of the machine's speed that slows both alike cancels. The figure is the median across rounds.\n")
print("- `xff`: the port trusts one X-Forwarded-For hop (`numTrustedHops: 1`). Every request to every proxy "
      "carries `X-Forwarded-For: 203.0.113.7, 198.51.100.9`: the bare route gets the same bytes and no client "
      "settings, so the ratio is the cost of the trust logic (finding 198.51.100.9 and making it the client).\n"
      f"- `proxy-protocol`: the port requires the PROXY protocol. HAProxy (mode tcp, one thread) relays to it with "
      f"`{send}`, and relays to the bare route, its partner, the same way without it: both paths have the same "
      "relay. wrk keeps its connections open, as a balancer with pooled connections does: one header per "
      "connection.\n"
      "- `proxy-protocol-close`: the same pair with `Connection: close` on every request, so every request is a "
      "new connection with its own header: the worst case for a per-connection header. Both proxies also pay "
      "the accept and close of every connection, so its ratio is the header's share of that dearer request.\n")
print("Sharing a core adds work of its own to both proxies (switches, cache refills), which makes a variant's "
      "share of the whole smaller. Each round also measures the bare route alone on CPU 0 "
      f"({conns} connections, no relay); its CPU per request beside the twin was {share:+.1%} of that (median across "
      "rounds). The goals are judged on the side-by-side loss times (1 + that overhead) when the overhead is "
      "positive: the loss the same extra work would be of the bare route alone.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `{reproduce}`\n")
print("## PROXY protocol on\n")
print(open(checks).read())
print("## Goals\n")
print("The close variant has no goal: the issue's \"PROXY protocol on costs under 2% of throughput per core\" is "
      "read as the steady state of a balancer that pools its connections (the keep-alive variant). The close "
      "variant is shown against the same 2% for reference only.\n")
print("| goal | target | measured | result |\n| --- | --- | --- | --- |")
goals = [("trusted-hop parsing (`numTrustedHops: 1`): fewer requests per proxy CPU-second than the bare route",
          "xff", 0.01, True),
         ("PROXY protocol on, keep-alive through HAProxy: fewer requests per proxy CPU-second than the bare route "
          "through the same relay", "proxy-protocol", 0.02, True),
         ("PROXY protocol on, a new connection per request (worst case)", "proxy-protocol-close", 0.02, False)]
for text, var, budget, goal in goals:
    m, xs = ratio(var)
    loss = 1 - m
    judged = loss * (1 + max(share, 0.0))
    errs = errors(var)
    ok = judged < budget and errs == 0
    verdict = f"**{'PASS' if ok else 'FAIL'}**" if goal else f"reported ({'within' if ok else 'over'} 2%)"
    print(f"| {text} | {f'< {budget:.0%}' if goal else 'none'} | {judged:.1%} ({loss:.1%} side by side, ratios "
          f"{', '.join(f'{x:.3f}' for x in xs)}; errors {errs:.0f}) | {verdict} |")
print("\n## Per variant (medians across rounds)\n")
print("| variant | beside | requests per proxy CPU-second | the bare route beside it | ratio | wrk requests/s | "
      "non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- |")
beside = {"xff": "bare", "proxy-protocol": "bare via HAProxy", "proxy-protocol-close": "bare via HAProxy, close",
          "twin": "bare", "twin-relay": "bare via HAProxy"}
for var, b in beside.items():
    print(f"| {var} | {b} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{ratio(var)[0]:.3f} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| bare route alone | | {med('bare-alone', 'rps_per_core'):,.0f} | | | {med('bare-alone', 'rps'):,.0f} | "
      f"{runs.alone_errors():.0f} |")
controls = []
for var in ("twin", "twin-relay"):
    m, xs = ratio(var)
    controls.append(f"`{var}` {m:.3f} (rounds {', '.join(f'{x:.3f}' for x in xs)})")
print(f"\nControls: the bare route in a second proxy, measured beside the bare route like every variant, straight "
      f"and through HAProxy: {' and '.join(controls)}. They show that two equal proxies side by side, and two "
      "equal paths through the relay, are treated alike. They cannot show the sharing overhead above, which "
      "both pay.")
alone = runs.alone()
print(f"\nThe machine's speed: the bare route alone ranged from {min(alone):,.0f} to {max(alone):,.0f} requests per "
      f"proxy CPU-second across rounds ({max(alone) / min(alone) - 1:.0%} apart; the same binary and request every "
      "time). A slow machine makes every request dearer and a variant's share smaller: compare runs on a machine "
      "of the same speed. With HAProxy, two wrk and the backend on CPU 1, the relayed pairs may be held back by "
      "that core rather than by the proxies (wrk requests/s above); requests per proxy CPU-second still count "
      "each proxy's own work, but a proxy that is not saturated batches less and pays more per request, both "
      "proxies of a pair alike.")
EOF
cp "$dated" "$bench/results/client-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/client-latest.md"
