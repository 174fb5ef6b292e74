#!/usr/bin/env bash
# What an OIDC session costs: requests per proxy CPU-second of a route behind an AuthPolicy
# `oidc` method, every request carrying a logged-in session cookie (opened with AES-256-GCM,
# its claims parsed, a success header set from them), as a ratio to the bare route measured
# in the same seconds. Same method as e2e/bench/policies.sh (side-by-side.sh): both proxies on
# CPU 0, each loaded by its own wrk on CPU 1 with the backend; `twin` (the bare route in a
# second proxy) is the control. The figure is the median across rounds.
#
# The session is real: the script starts the OpenID Provider of e2e/oidc-provider.sh (built
# when missing) on CPU 1, logs in through the proxy and the provider's login form once (a
# scripted browser in Python), and every request of every variant carries that cookie. The
# provider's access tokens live 5 minutes and the session expires with them, so the run must
# end before (the default 5 rounds take about 2 minutes); the oidc variant must refuse
# requests without the cookie (401) and admit every request with it (no non-2xx counted).
# Installs nginx and wrk from apt when missing; builds Tollgate in release mode.
#
# Writes e2e/bench/results/oidc-latest.md and a dated copy.
# Usage: e2e/bench/oidc.sh     env: ROUNDS (5), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                   PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
ROUNDS=${ROUNDS:-5}
sbs_init oidc
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
sbs_backend

op_port=18398 # gen.py's OIDC_ISSUER
provider=$("$root/e2e/oidc-provider.sh" path)
spawn 1 "$provider" -listen "127.0.0.1:$op_port" -client bench -secret bench-secret >"$work/op.out"
issuer=http://127.0.0.1:$op_port
wait_200 "$issuer/.well-known/openid-configuration"

# The manifests (gen.py policies DIR oidc): bare, oidc and twin, the policy's issuer the
# provider above.
read -r -a variants <<<"$(python3 "$bench/gen.py" policies "$work/v" oidc)"
admin=19990
for v in "${variants[@]}"; do
  d=$work/v/$v
  read -r "port_of[$v]" <"$d/request"
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
done
for v in bare twin; do wait_200 "http://127.0.0.1:${port_of[$v]}/"; done

# Without a session the oidc variant must refuse (an API client) or redirect (a browser).
for _ in $(seq 1 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port_of[oidc]}/") || true
  [ "$code" = 401 ] && break
  sleep 0.05
done
[ "$code" = 401 ] || { echo "oidc answered $code without a session" >&2; exit 1; }

# Log in once, as a browser would: the proxy's redirect, the provider's form, the callback.
cookie=$(python3 "$root/e2e/oidc-browser.py" session "http://127.0.0.1:${port_of[oidc]}/")
for v in "${variants[@]}"; do hdr_of[$v]="Cookie: $cookie"; done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Cookie: $cookie" "http://127.0.0.1:${port_of[oidc]}/")
[ "$code" = 200 ] || { echo "oidc answered $code with the session" >&2; exit 1; }
log "logged in; session cookie of ${#cookie} bytes"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  pair oidc "$r"
  pair twin "$r"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/oidc-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "${#cookie}" >"$dated" <<'EOF'
import sys
raw, started, rounds, before, after, conns, bench, cookie_len = sys.argv[1:9]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
share = runs.share()
print(f"# Tollgate OIDC session benchmark ({started})\n")
print(f"Rounds: {rounds}. The route behind an AuthPolicy `oidc` method, every request carrying a logged-in "
      f"session cookie ({cookie_len} bytes: opened with AES-256-GCM, the claims parsed, `x-user` set from "
      "`auth.identity.sub`), measured side by side with the bare route as in e2e/bench/policies.sh: both "
      f"tollgate-proxy processes (one worker each) on CPU 0, each loaded by its own wrk ({int(conns) // 2} "
      "connections) on CPU 1 with the backend; a round's ratio is the variant's requests per proxy CPU-second over "
      "the bare route's in the same seconds; the figure is the median across rounds. Every request carries the "
      "same cookie, the bare route's too.\n")
print(f"Sharing a core overhead (bare beside twin vs alone, median): {share:+.1%}.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/oidc.sh`\n")
print("| variant | requests per proxy CPU-second | the bare route beside it | ratio | wrk requests/s | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- |")
for var in ["oidc", "twin"]:
    m, xs = ratio(var)
    print(f"| {var} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{m:.3f} ({', '.join(f'{x:.3f}' for x in xs)}) | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| bare route alone | {med('bare-alone', 'rps_per_core'):,.0f} | | | {med('bare-alone', 'rps'):,.0f} | "
      f"{runs.alone_errors():.0f} |")
m, _ = ratio("oidc")
print(f"\nAn OIDC session costs {1 - m:.1%} of the bare route's requests per proxy CPU-second side by side "
      f"({(1 - m) * (1 + max(share, 0.0)):.1%} with the sharing overhead added back).")
EOF
cp "$dated" "$bench/results/oidc-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/oidc-latest.md"
