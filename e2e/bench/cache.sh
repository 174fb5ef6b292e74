#!/usr/bin/env bash
# What the response cache (CachePolicy) serves per core, against nginx's proxy_cache in the
# same seconds, and what it costs on a miss (side-by-side.sh: two proxies on CPU 0 at the same
# time, each loaded by its own wrk on CPU 1 with the backend):
#   hit        Tollgate answering every request from its cache, beside nginx answering the same
#              request from its proxy_cache (one worker, `proxy_cache_valid 200 1h`, the cache
#              on tmpfs or disk: the page cache holds it); the goal is 1.2x nginx per core;
#   hit-15k    the same with a 15 KiB JSON answer (compression.sh's document) instead of "ok";
#   miss       Tollgate with the CachePolicy, every request a new key (a query parameter that
#              wrk's Lua script makes unique), so each one is looked up, forwarded and stored,
#              beside the same route without a CachePolicy getting the same requests; the goal
#              is within 3% of the bare route;
#   twin       the bare route in a second proxy beside the bare route (the control).
# Both gateways run without access logs. The figure is the median across rounds. Traffic stays
# on 127.0.0.1. Installs nginx, wrk from apt when missing; builds Tollgate in release mode
# (PROFILE=debug: a debug build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/cache-latest.md and a dated copy.
# Usage: e2e/bench/cache.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                    PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init cache
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset pgrep; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries
sbs_backend

# The 15 KiB answer: a second backend on 19081 serving gen.api_list's document.
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); sys.dont_write_bytecode = True; import gen; gen.api_list(sys.argv[2])" \
  "$bench" "$work/doc.json"
chmod 755 "$work"
chmod 644 "$work/doc.json"
mkdir -p "$work/doc-backend"
(BACKEND_JSON_FILE=$work/doc.json backend_conf "$work/doc-backend" 19081)
spawn 1 nginx -e "$work/doc-backend/err" -c "$work/doc-backend/backend.conf"
wait_200 http://127.0.0.1:19081/
doc_bytes=$(stat -c %s "$work/doc.json")

# Tollgate: bare (no cache), miss (cache, unique keys), hit and hit-15k (cache, one key), twin.
declare -A ports=([bare]=18990 [miss]=18991 [hit]=18992 [hit-15k]=18993 [twin]=18994)
admin=19990
for v in bare miss hit hit-15k twin; do
  d=$work/v/$v
  mkdir -p "$d/manifests"
  python3 - "$bench" "$v" "${ports[$v]}" >"$d/manifests/bench.yaml" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import gen
name, port = sys.argv[2], int(sys.argv[3])
out = gen.base("bench", port)
if name == "hit-15k":
    out = out.replace("port: 19080", "port: 19081")
if name in ("miss", "hit", "hit-15k"):
    out += """---
apiVersion: tollgate.dev/v1alpha1
kind: CachePolicy
metadata: {name: cache, namespace: default}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: bench}]
  defaultTTL: 1h
"""
print(out)
PY
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  port_of[$v]=${ports[$v]}
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
  wait_200 "http://127.0.0.1:${ports[$v]}/"
done

# nginx with proxy_cache, one worker on CPU 0, in front of each backend.
declare -A nginx_ports=([nginx-hit]=18995 [nginx-hit-15k]=18996)
declare -A nginx_upstream=([nginx-hit]=19080 [nginx-hit-15k]=19081)
for n in nginx-hit nginx-hit-15k; do
  d=$work/$n
  mkdir -p "$d/cache"
  cat >"$d/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $d/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  proxy_cache_path $d/cache levels=1:2 keys_zone=c:16m max_size=1g inactive=1h use_temp_path=off;
  upstream be { server 127.0.0.1:${nginx_upstream[$n]}; keepalive 64; }
  server {
    listen 127.0.0.1:${nginx_ports[$n]};
    location / {
      proxy_pass http://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache c;
      proxy_cache_valid 200 1h;
      proxy_cache_lock on;
      add_header X-Cache \$upstream_cache_status;
    }
  }
}
CONF
  chown -R nobody "$d/cache" 2>/dev/null || true
  chmod 755 "$d"
  spawn 0 nginx -e "$d/err" -c "$d/nginx.conf"
  wait_200 "http://127.0.0.1:${nginx_ports[$n]}/"
  # The worker serves; the master only watches it.
  worker=$(pgrep -P "$last_pid" | head -1)
  [ -n "$worker" ] || { echo "$n: no nginx worker" >&2; exit 1; }
  port_of[$n]=${nginx_ports[$n]}
  pid_of[$n]=$worker
done

partner_of[hit]=nginx-hit
partner_of[hit-15k]=nginx-hit-15k
script_of[miss]=$bench/unique-keys.lua
script_of[bare]=$bench/unique-keys.lua
script_of[twin]=$bench/unique-keys.lua
variants=(hit hit-15k miss twin)

# Each cached target must answer from its cache (and the uncached ones must not), the right
# body, before anything is measured: the benchmark measures hits.
x_cache() { curl -s -o "$work/body" -D - "$1" | awk -F': ' 'tolower($1) == "x-cache" {gsub(/\r/, "", $2); print $2}'; }
for t in hit hit-15k nginx-hit nginx-hit-15k; do
  x_cache "http://127.0.0.1:${port_of[$t]}/" >/dev/null
  got=$(x_cache "http://127.0.0.1:${port_of[$t]}/")
  [ "$got" = HIT ] || { echo "$t answered X-Cache '$got', not HIT" >&2; exit 1; }
  want=3
  case $t in *15k) want=$doc_bytes ;; esac
  [ "$(stat -c %s "$work/body")" = "$want" ] || { echo "$t answered $(stat -c %s "$work/body") bytes, not $want" >&2; exit 1; }
done
got=$(x_cache "http://127.0.0.1:${port_of[miss]}/?k=first")
[ "$got" = MISS ] || { echo "miss answered X-Cache '$got' to a new key, not MISS" >&2; exit 1; }
got=$(x_cache "http://127.0.0.1:${port_of[bare]}/")
[ -z "$got" ] || { echo "bare answered X-Cache '$got': it has a cache" >&2; exit 1; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
# The miss variant's answers were all misses: its counters say so.
metrics=$(curl -s "http://127.0.0.1:19991/metrics")
count() { awk -v o="outcome=\"$1\"" 'index($0, "tollgate_cache_requests_total{") == 1 && index($0, o) {s += $NF} END {print s + 0}' <<<"$metrics"; }
hits=$(count hit)
misses=$(count miss)

mkdir -p "$bench/results"
dated=$bench/results/cache-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$doc_bytes" "$hits" "$misses" >"$dated" <<'EOF_PY'
import sys
raw, started, rounds, before, after, conns, bench, doc, hits, misses = sys.argv[1:11]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
print(f"# Tollgate cache benchmark ({started})\n")
print(f"Rounds: {rounds}. Two gateways serve at the same time on CPU 0 (one worker each, no access log), each "
      f"loaded by its own wrk ({int(conns) // 2} connections) on CPU 1 with the backend (nginx answering "
      f"\"ok\" or a {int(doc):,}-byte JSON document); a round's ratio is the first one's requests per CPU-second "
      "(CPU time from schedstat) over its partner's in the same seconds. The figure is the median across rounds.\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/cache.sh`\n")
print("| variant | beside | requests per CPU-second | its partner's | ratio | goal | per-round ratios | "
      "wrk requests/s | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
rows = [("hit", "nginx proxy_cache hit (\"ok\")", ">= 1.2"),
        ("hit-15k", f"nginx proxy_cache hit ({int(doc):,} bytes)", ">= 1.2"),
        ("miss", "the route without a cache, same unique requests", ">= 0.97"),
        ("twin", "the bare route (control)", "1.0")]
for var, beside, goal in rows:
    m, xs = ratio(var)
    print(f"| {var} | {beside} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{m:.3f} | {goal} | {', '.join(f'{x:.3f}' for x in xs)} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| bare route alone | | {med('bare-alone', 'rps_per_core'):,.0f} | | | | | "
      f"{med('bare-alone', 'rps'):,.0f} | {runs.alone_errors():.0f} |")
print(f"\nThe miss variant's proxy counted {int(float(misses)):,} misses and {int(float(hits)):,} hits over the run "
      "(every request asked for a new key).")
EOF_PY
cp "$dated" "$bench/results/cache-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/cache-latest.md"
