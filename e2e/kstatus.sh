#!/usr/bin/env bash
# e2e/kstatus.sh — kstatus-check (e2e/kstatus), the kstatus verdict of a live
# object as Flux and other kstatus users compute it, built from its Go module
# and cached like e2e/cluster.sh and e2e/helm.sh cache their binaries.
#
#   e2e/kstatus.sh build     build (if missing) and print the binary's path
#   e2e/kstatus.sh path      same as build
#   e2e/kstatus.sh ARGS...   run `kstatus-check ARGS...` (building it first if
#                            missing), e.g.
#       e2e/kstatus.sh --kubeconfig "$KUBECONFIG" --namespace NS --name N \
#           --resource tollgate.dev/v1alpha1/ratelimitpolicies --want Current
#
# The binary is $TOLLGATE_BIN_DIR/kstatus-check-<cli-utils version>-<hash of
# go.mod, go.sum and *.go>, so editing the module (or bumping a version)
# builds a new one, and a cached binary needs neither Go nor the network.
# Builds run under `nice -n 19` with GOFLAGS="-p=$TOLLGATE_BUILD_JOBS
# -mod=readonly" (default 1 job), CGO off. With the modules in Go's module
# cache a build works offline (GOPROXY=off); a cold one needs only the Go
# module proxy.
#
# Measured here (2 shared cores, load ~7 from other builds): a cold build
# (empty Go module and build caches, modules fetched from proxy.golang.org)
# took 171 s wall (93 s user, 0.5 GB peak RSS); with the modules cached but an
# unrelated build cache 106 s; a rebuild after editing main.go 2 s. The binary
# is 28 MB. A cached binary is used at once, without Go or the network.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/kstatus

log() { printf '[kstatus.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

CLI_UTILS_VERSION=$(go_module_version "$MODULE_DIR/go.mod" sigs.k8s.io/cli-utils)
[[ -n $CLI_UTILS_VERSION ]] || die "cannot read the sigs.k8s.io/cli-utils version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/kstatus-check-$CLI_UTILS_VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum "$MODULE_DIR"/*.go)

build() { go_cached kstatus-check "$BIN" "$MODULE_DIR" . "-s -w" "(cli-utils $CLI_UTILS_VERSION)"; }

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
