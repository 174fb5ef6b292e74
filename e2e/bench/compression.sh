#!/usr/bin/env bash
# What response compression costs: requests per proxy CPU-second of a route answering a
# compressible JSON document (about 15 KiB, an API's list) with gzip, br and zstd
# (ClientPolicy `compression`, one algorithm per variant), as ratios to the same route without
# compression, measured side by side in the same seconds (side-by-side.sh: both proxies on
# CPU 0, each loaded by its own wrk on CPU 1 with the backend, nginx serving the document as a
# static file). Every request sends `Accept-Encoding: gzip, deflate, br, zstd`; the bare route
# ignores it. Also reports each coding's bytes on the wire for the document. A control, twin
# (the bare route again), shows that two equal proxies come out equal. `gzip-6` is gzip at
# level 6 (`gzipLevel: 6`) measured beside nginx compressing the same proxied document with
# `gzip_comp_level 6` (one worker on CPU 0, no access log): the ratio to nginx per core. The figure is the
# median across rounds. Traffic stays on 127.0.0.1.
# Installs nginx, wrk from apt when missing; builds Tollgate in release mode (PROFILE=debug: a
# debug build, to check the script quickly; its figures mean nothing).
#
# Writes e2e/bench/results/compression-latest.md and a dated copy.
# Usage: e2e/bench/compression.sh     env: ROUNDS (7), SAT_SECS (5), CONNS (50), BUILD=0, KEEP=1,
#                                          PROFILE (release)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/e2e/bench
# shellcheck source=e2e/bench/side-by-side.sh
. "$bench/side-by-side.sh"
sbs_init compression
command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
command -v nginx >/dev/null || apt_install nginx-light
command -v wrk >/dev/null || apt_install wrk
for t in curl python3 taskset; do command -v $t >/dev/null || { echo "$t unavailable" >&2; exit 1; }; done
sbs_binaries

# The document: 60 records of an API's list, about 15 KiB.
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); sys.dont_write_bytecode = True; import gen; gen.api_list(sys.argv[2])" \
  "$bench" "$work/doc.json"
# nginx's worker (nobody, when started as root) reads it from the work directory.
chmod 755 "$work"
chmod 644 "$work/doc.json"
BACKEND_JSON_FILE=$work/doc.json sbs_backend
doc_bytes=$(stat -c %s "$work/doc.json")

ACCEPT="Accept-Encoding: gzip, deflate, br, zstd"
declare -A ports=([bare]=18790 [gzip]=18791 [br]=18792 [zstd]=18793 [twin]=18794 [gzip-6]=18795)
variants=(gzip br zstd twin gzip-6)
admin=19960
for v in bare "${variants[@]}"; do
  d=$work/v/$v
  mkdir -p "$d/manifests"
  python3 - "$bench" "$v" "${ports[$v]}" >"$d/manifests/bench.yaml" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import gen
name, port = sys.argv[2], int(sys.argv[3])
out = gen.base(name, port)
if name in ("gzip", "br", "zstd", "gzip-6"):
    coding, level = name.split("-")[0], (", gzipLevel: 6" if name == "gzip-6" else "")
    out += f"""---
apiVersion: tollgate.dev/v1alpha1
kind: ClientPolicy
metadata: {{name: compress, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: bench}}]
  compression: {{algorithms: [{coding}], minBytes: 1024, contentTypes: [application/json]{level}}}
"""
print(out)
PY
  "$bin/tollgate" compile "$d/manifests" --out "$d/table" >/dev/null
  port_of[$v]=${ports[$v]}
  hdr_of[$v]=$ACCEPT
  spawn 0 "$bin/tollgate-proxy" --table "$d/table/default.bench.json" --admin "127.0.0.1:$admin" \
    --access-log false --workers 1
  pid_of[$v]=$last_pid
  admin=$((admin + 1))
  wait_200 "http://127.0.0.1:${ports[$v]}/" "$ACCEPT"
done
# nginx gzip at level 6 in front of the same backend, one worker on CPU 0.
ng=$work/nginx-gzip
mkdir -p "$ng"
cat >"$ng/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $ng/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  gzip on;
  gzip_comp_level 6;
  gzip_min_length 1024;
  gzip_types application/json;
  gzip_vary on;
  gzip_proxied any;
  upstream be { server 127.0.0.1:19080; keepalive 64; }
  server {
    listen 127.0.0.1:18796;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
spawn 0 nginx -e "$ng/err" -c "$ng/nginx.conf"
wait_200 http://127.0.0.1:18796/ "$ACCEPT"
port_of[nginx-gzip]=18796
hdr_of[nginx-gzip]=$ACCEPT
pid_of[nginx-gzip]=$(pgrep -P "$last_pid" | head -1)
[ -n "${pid_of[nginx-gzip]}" ] || { echo "no nginx worker" >&2; exit 1; }
partner_of[gzip-6]=nginx-gzip

# Each variant must answer in its coding (and the bare route not at all): the benchmark
# measures compression.
declare -A wire=()
for v in bare "${variants[@]}" nginx-gzip; do
  ce=$(curl -s -o "$work/body.$v" -D - -H "$ACCEPT" "http://127.0.0.1:${port_of[$v]}/" |
    awk -F': ' 'tolower($1) == "content-encoding" {gsub(/\r/, "", $2); print $2}')
  want=${v%-*}
  case $v in bare | twin) want= ;; nginx-gzip) want=gzip ;; esac
  [ "$ce" = "$want" ] || { echo "$v answered Content-Encoding '$ce', not '$want'" >&2; exit 1; }
  wire[$v]=$(stat -c %s "$work/body.$v")
  cmp -s <(gzip -dc <"$work/body.$v" 2>/dev/null || cat "$work/body.$v") "$work/doc.json" ||
    [ "$want" != gzip ] || { echo "$v: the gzip body does not decode to the document" >&2; exit 1; }
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  alone "$r"
  for v in "${variants[@]}"; do pair "$v" "$r"; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$bench/results"
dated=$bench/results/compression-$(date -u +%Y-%m-%dT%H%M%SZ).md
python3 - "$raw" "$started" "$ROUNDS" "$load_before" "$load_after" "$CONNS" "$bench" "$doc_bytes" \
  "${wire[gzip]}" "${wire[br]}" "${wire[zstd]}" "${wire[gzip-6]}" "${wire[nginx-gzip]}" >"$dated" <<'EOF_PY'
import sys
raw, started, rounds, before, after, conns, bench, doc = sys.argv[1:9]
sizes = dict(zip(["gzip", "br", "zstd"], map(int, sys.argv[9:12])))
doc = int(doc)
gzip6, nginx6 = map(int, sys.argv[12:14])
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
from side_by_side import Runs
runs = Runs(raw)
ratio, med, errors = runs.ratio, runs.med, runs.errors
print(f"# Tollgate compression benchmark ({started})\n")
print(f"Rounds: {rounds}. Each coding's route is measured side by side with the same route uncompressed: both "
      f"tollgate-proxy processes (one worker each) serve at the same time on CPU 0, each loaded by its own wrk "
      f"({int(conns) // 2} connections) on CPU 1 with the backend (nginx serving a {doc:,}-byte JSON document), "
      "and a round's ratio is the variant's requests per proxy CPU-second (CPU time from schedstat) over the bare "
      "route's in the same seconds. The figure is the median across rounds. Every request sends "
      "`Accept-Encoding: gzip, deflate, br, zstd`; each variant's ClientPolicy offers one coding "
      "(gzip level 5, brotli quality 4 with a 256 KiB window, zstd level 3 with a 256 KiB window).\n")
print(f"Load average before: {before}; after: {after} (shared machine: absolute figures are noisy, ratios count).\n")
print(f"Reproduce: `ROUNDS={rounds} e2e/bench/compression.sh`\n")
print("| variant | bytes on the wire (of %s) | requests per proxy CPU-second | the bare route beside it | ratio | "
      "per-round ratios | wrk requests/s | non-2xx + socket errors |" % f"{doc:,}")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for var in ["gzip", "br", "zstd", "twin"]:
    m, xs = ratio(var)
    size = f"{sizes[var]:,} ({sizes[var] / doc:.1%})" if var in sizes else f"{doc:,}"
    print(f"| {var} | {size} | {med(var, 'rps_per_core'):,.0f} | {med('bare@' + var, 'rps_per_core'):,.0f} | "
          f"{m:.3f} | {', '.join(f'{x:.3f}' for x in xs)} | {med(var, 'rps'):,.0f} | {errors(var):.0f} |")
print(f"| bare route alone | {doc:,} | {med('bare-alone', 'rps_per_core'):,.0f} | | | | "
      f"{med('bare-alone', 'rps'):,.0f} | {runs.alone_errors():.0f} |")
m, xs = ratio("gzip-6")
print(f"\n`gzip-6` beside nginx: Tollgate at `gzipLevel: 6` against nginx's gzip filter at `gzip_comp_level 6` in front "
      "of the same backend, both one worker on CPU 0 without an access log, each loaded by its own wrk in the same "
      "seconds.\n")
print("| variant | bytes on the wire | requests per CPU-second | nginx gzip level 6 beside it | ratio to nginx | goal | "
      "per-round ratios | non-2xx + socket errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
print(f"| gzip-6 | {gzip6:,} (nginx: {nginx6:,}) | {med('gzip-6', 'rps_per_core'):,.0f} | "
      f"{med('bare@gzip-6', 'rps_per_core'):,.0f} | {m:.3f} | >= 1.0 | {', '.join(f'{x:.3f}' for x in xs)} | "
      f"{errors('gzip-6'):.0f} |")
m, xs = ratio("twin")
print(f"\nControl: `twin` is the bare route in a second proxy, measured beside the bare route like every variant; "
      f"its ratio, {m:.3f}, shows that two equal proxies side by side are treated alike.")
EOF_PY
cp "$dated" "$bench/results/compression-latest.md"
cp "$raw" "${dated%.md}.tsv"
cat "$bench/results/compression-latest.md"
