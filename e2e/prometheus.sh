#!/usr/bin/env bash
# e2e/prometheus.sh — Prometheus (the server, cmd/prometheus of the Go module
# github.com/prometheus/prometheus at the version e2e/prometheus/go.mod pins),
# built from its Go module and cached like e2e/kstatus.sh and e2e/flux.sh cache
# theirs. e2e/dashboards-test.sh runs it on loopback to scrape the loopback
# cluster and to answer every dashboard query.
#
#   e2e/prometheus.sh build     build (if missing) and print the binary's path
#   e2e/prometheus.sh path      same as build
#   e2e/prometheus.sh crds      fetch (if missing) and print the directory holding
#                               the ServiceMonitor and PodMonitor CRDs of the
#                               Prometheus Operator (for a server-side dry run of the
#                               chart's monitors)
#   e2e/prometheus.sh ARGS...   run `prometheus ARGS...` (building it first)
#
# The binary is $TOLLGATE_BIN_DIR/prometheus-<module version>-<hash of go.mod,
# go.sum and the build tags>. It is built with the tag remove_all_sd: the test
# scrapes static targets only, and leaving out the cloud service discoveries
# (AWS, Azure, GCE, Kubernetes, ...) roughly halves what Go compiles. Without
# the tag builtinassets the web UI is not embedded (the assets are built with
# npm upstream); the HTTP API the test uses is all there.
#
# Measured here (2 shared cores, two other engineers' cargo builds and this
# session's running, load 10 to 12): a cold build (empty Go module and build
# caches, modules fetched from proxy.golang.org) took 39 min 48 s wall but only
# 213 s user + 28 s system CPU (0.95 GB peak RSS): on an idle core about 4
# minutes. The binary is 52 MB. A cached binary is used at once, without Go or
# the network.
#
# The CRDs come from the Go module github.com/prometheus-operator/prometheus-operator
# at OPERATOR_VERSION (its example/prometheus-operator-crd/, fetched through the Go
# module proxy and checked against the checksum database like any module), copied to
# $TOLLGATE_BIN_DIR/prometheus-operator-crds-<version>.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/prometheus
TAGS=remove_all_sd
OPERATOR_MODULE=github.com/prometheus-operator/prometheus-operator
OPERATOR_VERSION=v0.85.0

log() { printf '[prometheus.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

VERSION=$(go_module_version "$MODULE_DIR/go.mod" github.com/prometheus/prometheus)
[[ -n $VERSION ]] || die "cannot read the github.com/prometheus/prometheus version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/prometheus-$VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum <(printf 'tags=%s\n' "$TAGS"))

build() {
  GO_BUILD_TAGS=$TAGS go_cached prometheus "$BIN" "$MODULE_DIR" github.com/prometheus/prometheus/cmd/prometheus \
    "-s -w" "(github.com/prometheus/prometheus $VERSION, tags $TAGS)" "minutes when Go's build cache is cold; "
}

CRDS=$BIN_DIR/prometheus-operator-crds-$OPERATOR_VERSION

# crds: the two CRDs into $CRDS, from Go's module cache (downloaded when missing).
crds() {
  local dir tmp=$CRDS.tmp.$$ f
  if [[ -d $CRDS ]]; then
    touch -c "$CRDS"
    return 0
  fi
  command -v go >/dev/null || die "go is required to fetch the Prometheus Operator's CRDs"
  dir=$(cd "$MODULE_DIR" && go mod download -json "$OPERATOR_MODULE@$OPERATOR_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n $dir && -d $dir ]] || die "cannot download $OPERATOR_MODULE@$OPERATOR_VERSION"
  mkdir -p "$tmp"
  for f in servicemonitors podmonitors; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$f.yaml" "$tmp/" ||
      { rm -rf "$tmp"; die "$OPERATOR_MODULE@$OPERATOR_VERSION has no CRD for $f"; }
  done
  chmod -R u+w "$tmp"
  mv "$tmp" "$CRDS"
}

case ${1:-} in
  crds)
    crds
    printf '%s\n' "$CRDS"
    ;;
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
