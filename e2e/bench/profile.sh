#!/usr/bin/env bash
# Where each contender's CPU goes at saturation: the profile behind run.sh's ratios.
#
# For one scenario of `gen.py configs` (default routes10k), each contender (tollgate, nginx,
# HAProxy) runs as in run.sh (CPU 0, one worker; wrk and the backend on CPU 1, 50 keep-alive
# connections, 127.0.0.1 only) for ROUNDS rounds, interleaved. Per round and contender:
#   - CPU time per request, user and system apart (utime and stime from /proc), and
#     requests per second of the proxy's own CPU time (run.sh's "per core");
#   - system calls per request (perf stat, tracepoint raw_syscalls:sys_enter);
#   - TCP segments sent per request, whole host (nstat's TcpOutSegs: the client's, the
#     proxy's and the backend's), when nstat (iproute2) is there;
# then, in the last round, a sampled profile (perf record -e cpu-clock, no call graphs):
# the share of samples in the kernel, in the proxy's binary and in each library, and the
# top symbols. Unlike callgrind.sh this includes the kernel and the cost of cache misses.
#
# Needs what run.sh installs, plus perf (Debian: linux-perf). Writes
# e2e/bench/results/profile-<end time>.md (and profile-latest.md).
# Usage: e2e/bench/profile.sh [SCENARIO]  env: ROUNDS (3), SECS (8), TOP (25), BUILD=0 uses
#                                              the binaries already built
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=$PWD/e2e/bench
scenario=${1:-routes10k}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-8}
TOP=${TOP:-25}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
bin=$CARGO_TARGET_DIR/release
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
for t in nginx haproxy wrk perf taskset openssl curl python3; do
  command -v $t >/dev/null || { echo "$t is not installed (run.sh installs the contenders; perf: apt-get install linux-perf)" >&2; exit 1; }
done
[ "${BUILD:-1}" = 1 ] && cargo build --release -q -p tollgate -p tollgate-proxy
work=$(mktemp -d /tmp/tollgate-profile.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
spawn() { # cpu command...: pid in last_pid
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  pids+=("$last_pid")
}

# shellcheck source=e2e/bench/backend.sh
. "$bench/backend.sh"
backend_conf "$work"
spawn 1 nginx -e "$work/backend.err" -c "$work/backend.conf"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
  -subj /CN=bench.example.test \
  -addext "subjectAltName=DNS:bench.example.test,DNS:*.example.test,DNS:*.example.com" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
python3 "$bench/gen.py" configs "$scenario" "$work/cfg" --cert "$work/cert.pem" --key "$work/key.pem" >/dev/null
"$bin/tollgate" compile "$work/cfg/manifests" --out "$work/cfg/table" >/dev/null
IFS=$'\t' read -r req_host req_path req_hdr <"$work/cfg/request"
scheme=http ports=(18080 18081 18082)
[ "$scenario" = https ] && scheme=https ports=(18443 18444 18445)
hdrs=(-H "Host: $req_host")
[ -n "${req_hdr:-}" ] && hdrs+=(-H "$req_hdr")

contenders=(tollgate nginx haproxy)
declare -A pid_of url_of
spawn 0 "$bin/tollgate-proxy" --table "$work/cfg/table/default.bench.json" \
  --admin 127.0.0.1:19901 --access-log false --workers 1
pid_of[tollgate]=$last_pid
spawn 0 nginx -e "$work/cfg/nginx-error.log" -c "$work/cfg/nginx.conf"
nginx_master=$last_pid
spawn 0 haproxy -db -f "$work/cfg/haproxy.cfg"
pid_of[haproxy]=$last_pid
for i in 0 1 2; do
  c=${contenders[$i]}
  url_of[$c]=$scheme://127.0.0.1:${ports[$i]}$req_path
  for _ in $(seq 1 300); do
    [ "$(curl -sk -o /dev/null -w '%{http_code}' "${hdrs[@]}" "${url_of[$c]}" || true)" = 200 ] && break
    sleep 0.05
  done
done
# nginx's CPU is its one worker's (the master only waits).
pid_of[nginx]=$(pgrep -P "$nginx_master" | head -1)

# utime and stime of a process in clock ticks.
times_of() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }
tck=$(getconf CLK_TCK)
nstat=$(command -v nstat || true)
raw=$work/raw.tsv
: >"$raw"
measure() { # contender round
  local c=$1 r=$2 p=${pid_of[$1]} u0 s0 u1 s1 out n perf_pid calls segs=0
  taskset -c 1 wrk -t1 -c50 -d1s "${hdrs[@]}" "${url_of[$c]}" >/dev/null
  [ -n "$nstat" ] && nstat -n
  read -r u0 s0 < <(times_of "$p")
  perf stat -x, -e raw_syscalls:sys_enter -p "$p" -o "$work/stat.$c" &
  perf_pid=$!
  out=$(taskset -c 1 wrk -t1 -c50 -d"${SECS}s" "${hdrs[@]}" "${url_of[$c]}")
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
  read -r u1 s1 < <(times_of "$p")
  [ -n "$nstat" ] && segs=$(nstat TcpOutSegs | awk '/TcpOutSegs/ {print $2}')
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  calls=$(awk -F, '/raw_syscalls/ {print $1}' "$work/stat.$c")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "$n" $((u1 - u0)) $((s1 - s0)) "${calls:-0}" "${segs:-0}" >>"$raw"
  log "round $r $c: $n requests"
}
record() { # contender: a sampled profile of one more saturation run
  local c=$1 perf_pid
  perf record -q -e cpu-clock -F 4999 -p "${pid_of[$c]}" -o "$work/perf.$c" 2>/dev/null &
  perf_pid=$!
  taskset -c 1 wrk -t1 -c50 -d"${SECS}s" "${hdrs[@]}" "${url_of[$c]}" >/dev/null
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
}
for r in $(seq 1 "$ROUNDS"); do
  for c in "${contenders[@]}"; do measure "$c" "$r"; done
done
for c in "${contenders[@]}"; do record "$c"; log "profiled $c"; done

# The first LINES lines of perf's report by KEYS (reading it all: no SIGPIPE under pipefail).
report() { # contender keys lines
  perf report -i "$work/perf.$1" --no-children --sort "$2" --stdio 2>/dev/null |
    awk -v n="$3" '/%/ && ++i <= n' || true
}
ended=$(date -u +%Y-%m-%dT%H%M%SZ)
results=$bench/results
mkdir -p "$results"
md=$results/profile-$ended.md
{
  echo "# Where the CPU goes at saturation: $scenario"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), \`e2e/bench/profile.sh $scenario\` (ROUNDS=$ROUNDS, SECS=$SECS);" \
    "tollgate $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- proxy controller 2>/dev/null || echo ' (uncommitted changes)');" \
    "load average before the report: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "The proxy on CPU 0 with one worker; wrk (50 connections) and the backend on CPU 1."
  echo
  echo "## CPU per request (median across rounds)"
  echo
  python3 - "$raw" "$tck" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
tck = float(sys.argv[2])
by = {}
for c, r, n, u, s, calls, segs in rows:
    n, u, s, calls, segs = int(n), int(u), int(s), int(calls), int(segs)
    if n == 0:
        continue
    by.setdefault(c, []).append((u / tck * 1e6 / n, s / tck * 1e6 / n, n / ((u + s) / tck) if u + s else 0, calls / n, segs / n))
med = {c: [statistics.median(v[i] for v in vals) for i in range(5)] for c, vals in by.items()}
print("| contender | user µs/req | system µs/req | system share | requests/s per core | vs nginx | system calls/req | TCP segments/req (host) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
ng = med.get("nginx", [0, 0, 0, 0, 0])[2]
for c in ("tollgate", "nginx", "haproxy"):
    if c not in med:
        continue
    u, s, rps, calls, segs = med[c]
    share = s / (u + s) * 100 if u + s else 0
    ratio = f"{rps / ng:.2f}x" if ng else "-"
    seg = f"{segs:.2f}" if segs else "-"
    print(f"| {c} | {u:.2f} | {s:.2f} | {share:.0f}% | {rps:,.0f} | {ratio} | {calls:.2f} | {seg} |")
print()
print("Per round (user µs, system µs per request): " + "; ".join(
    f"{c} " + ", ".join(f"{v[0]:.1f}/{v[1]:.1f}" for v in by[c]) for c in by))
PY
  for c in "${contenders[@]}"; do
    echo
    echo "## $c: samples by object"
    echo
    echo '```'
    report "$c" dso 8
    echo '```'
    echo
    echo "Top $TOP symbols:"
    echo
    echo '```'
    report "$c" dso,sym "$TOP"
    echo '```'
  done
} >"$md"
cp "$md" "$results/profile-latest.md"
log "wrote $md"
