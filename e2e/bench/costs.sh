#!/usr/bin/env bash
# What cost and shadow rate limits cost: requests per proxy CPU-second of a route with the plain
# local limit of policies.sh, with the same limit counting a request cost (CEL on a request
# header), a response cost (CEL on the response's Content-Length, counted after each response),
# a body cost (a field of the response's JSON body, counted once the body ended) and in shadow
# mode, as ratios to the bare route measured in the same seconds.
#
# The method is policies.sh's (side-by-side.sh): each variant in its own tollgate-proxy (one
# worker) on CPU 0 beside the bare route, each loaded by its own wrk on CPU 1 with the backend
# (nginx answering a small fixed JSON body, `{"usage":{"total_tokens":1}}`), the ratio per round
# over the same seconds, the median
# across rounds; the bare route alone each round sizes the cost of sharing a core; `twin` is
# the control. Every request is admitted (the limits are never reached), memory storage, every
# variant gets the same request (with `x-cost: 1`). The plain limit's ratio is comparable with
# policies.sh's `rl` (the same limit and method): a regression of the plain path shows there.
# Installs nginx and wrk from apt when missing; builds Tollgate in release mode.
#
# Writes e2e/bench/results/costs-latest.md and a dated copy.
# Usage: e2e/bench/costs.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                    PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init costs
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
BACKEND_JSON_USAGE=1 sbs_backend

read -r -a variants <<<"$(python3 "$bench/gen.py" policies "$work/v" costs)"
admin=19960
declare -A admin_of=()
for v in "${variants[@]}"; do
  d=$work/v/$v
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  IFS=$'\t' read -r port hdr <"$d/request" # hdr: the headers, tab-separated
  port_of[$v]=$port
  hdr_of[$v]=$hdr
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin_of[$v]=$admin
  admin=$((admin + 1))
  IFS=$'\t' read -r -a hs <<<"$hdr"
  wait_200 "http://127.0.0.1:$port/" "${hs[@]}"
done
# Each limited variant must be deciding: its answers carry the limit's numbers (the shadow one
# none, but its decisions are counted).
for v in rl reqcost respcost bodycost; do
  curl -s -o /dev/null -D - -H 'x-cost: 1' "http://127.0.0.1:${port_of[$v]}/" | grep -qi '^x-ratelimit-limit:' ||
    { echo "$v answered without X-RateLimit-Limit" >&2; exit 1; }
done
# The body cost must read the body: no cost error (each would count 1 instead).
curl -s -o /dev/null -H 'x-cost: 1' "http://127.0.0.1:${port_of[bodycost]}/"
if curl -s "http://127.0.0.1:${admin_of[bodycost]}/metrics" | grep -q '^tollgate_ratelimit_cost_errors_total'; then
  echo "bodycost: the body was not read" >&2
  exit 1
fi
curl -s "http://127.0.0.1:${admin_of[shadow]}/metrics" | grep -q 'ratelimit_decisions_total{policy="default/bench-limit",outcome="allowed"}' ||
  { echo "shadow: no decisions counted" >&2; exit 1; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do
    [ "$v" = bare ] || pair "$v" "$r"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/costs-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" >"$dated" <<'EOF'
import sys
raw, started, rounds, before, after, conns, bench = sys.argv[1:8]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
share = runs.share()
print(f"# Tollgate cost and shadow limit benchmark ({started})\n")
print(f"Rounds: {rounds}. The method of policies.sh: each variant side by side with the bare route, both "
      f"tollgate-proxy processes (one worker each) on CPU 0, each loaded by its own wrk ({int(conns) // 2} "
      "connections) on CPU 1 with the backend; a round's ratio is the variant's requests per proxy CPU-second over "
      "the bare route's in the same seconds; the figure is the median across rounds. Every request is admitted "
      "(the limits are never reached), counters in memory: the figures are the cost of deciding and counting.\n")
print(f"Sharing a core costs both proxies extra work: the bare route's CPU per request beside the twin was "
      f"{share:+.1%} of the bare route alone (median across rounds); the losses below are judged with it added "
      "back when positive, as policies.sh does.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/costs.sh`\n")
print("| variant | what the limit counts | loss vs the bare route (judged) | ratio (rounds) | requests per proxy CPU-second | the bare route beside it | errors |")
print("| --- | --- | --- | --- | --- | --- | --- |")
what = {"rl": "1 per request (the plain limit, as policies.sh's `rl`)",
        "reqcost": "`cost.request`: `int(request.headers['x-cost'])`",
        "respcost": "`cost.response`: `int(response.headers['content-length'])`, after each response",
        "bodycost": "`cost.response`: `int(response.body.usage.total_tokens)`, once each body ended",
        "shadow": "1 per request, `mode: Shadow`",
        "twin": "(the bare route again: the control)"}
for var in ["rl", "reqcost", "respcost", "bodycost", "shadow", "twin"]:
    m, xs = ratio(var)
    loss = 1 - m
    judged = loss * (1 + max(share, 0.0))
    print(f"| {var} | {what[var]} | {judged:.1%} | {m:.3f} ({', '.join(f'{x:.3f}' for x in xs)}) | "
          f"{med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | {errors(var):.0f} |")
alone = runs.alone()
print(f"\nThe bare route alone: {med('bare-alone', 'rps_per_core'):,.0f} requests per proxy CPU-second (median; "
      f"{min(alone):,.0f} to {max(alone):,.0f} across rounds).")
EOF
cp "$dated" "$bench/results/costs-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/costs-latest.md"
