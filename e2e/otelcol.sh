#!/usr/bin/env bash
# e2e/otelcol.sh — the OpenTelemetry Collector of the tracing test (e2e/tracing-test.sh):
# the core collector with the OTLP receiver (gRPC and HTTP) and the contrib file exporter,
# built from the wrapper module e2e/otelcol (main.go is what the collector's builder would
# generate for those two components) at the versions its go.mod pins, and cached like
# e2e/prometheus.sh caches Prometheus.
#
#   e2e/otelcol.sh build     build (if missing) and print the binary's path
#   e2e/otelcol.sh path      same as build
#   e2e/otelcol.sh ARGS...   run `otelcol ARGS...` (building it first)
#
# Every collector module is at one release: go.opentelemetry.io/collector/* v0.161.0 with the
# v1.67.0 modules `go mod tidy` chose, and contrib's fileexporter v0.161.0 (newer contrib
# releases do not build from the modules served here).
#
# Measured here (2 shared cores, two other engineers' cargo builds running): a cold build
# (empty Go module and build caches, modules fetched from the Go module proxy) took 162 s
# wall: 12 s fetching modules (`go mod tidy`, 0.5 GB of module cache), then 150 s compiling
# (118 s user + 21 s system CPU, 0.6 GB peak RSS, 0.5 GB of build cache, `go build -p 2`;
# the script builds with -p=$BUILD_JOBS, 1 by default, so expect up to twice that). The
# binary is 34 MB. A cached binary is used at once, without Go or the network.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/otelcol

log() { printf '[otelcol.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

VERSION=$(go_module_version "$MODULE_DIR/go.mod" go.opentelemetry.io/collector/otelcol)
[[ -n $VERSION ]] || die "cannot read the go.opentelemetry.io/collector/otelcol version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/otelcol-$VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum "$MODULE_DIR"/main.go)

build() {
  go_cached otelcol "$BIN" "$MODULE_DIR" . "-s -w" "(go.opentelemetry.io/collector $VERSION)" \
    "minutes when Go's build cache is cold; "
}

case ${1:-} in
  build | path)
    build
    printf '%s\n' "$BIN"
    ;;
  -h | --help | help | "")
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    ;;
  *)
    build
    exec "$BIN" "$@"
    ;;
esac
