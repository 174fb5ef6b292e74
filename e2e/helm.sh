#!/usr/bin/env bash
# e2e/helm.sh — Helm v3, built from its Go module (e2e/k8s/helm) and cached,
# like e2e/cluster.sh builds etcd and kube-apiserver. No downloads other than
# Go modules.
#
#   e2e/helm.sh build        build (if missing) and print the binary's path
#   e2e/helm.sh path         same as build
#   e2e/helm.sh ARGS...      run `helm ARGS...` (building it first if missing)
#
# The binary is $TOLLGATE_BIN_DIR/helm-<version>-<hash of go.mod+go.sum>, so a
# version bump in e2e/k8s/helm/go.mod builds a new one. Builds run under
# `nice -n 19` with GOFLAGS=-p=$TOLLGATE_BUILD_JOBS (default 1), CGO off, with
# the version ldflags of Helm's own Makefile.
#
# Measured here (2 cores shared with Rust builds, load ~3): a cold build, with
# an empty Go build cache and the modules already downloaded (`go mod tidy`
# fetched them in ~8 s), took 177 s wall (138 s user, 27 s sys, 0.9 GB peak
# RSS); the binary is 62 MB. Later calls reuse the cached binary at once.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/k8s/helm

log() { printf '[helm.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

HELM_VERSION=$(go_module_version "$MODULE_DIR/go.mod" helm.sh/helm/v3)
CLIENT_GO_VERSION=$(go_module_version "$MODULE_DIR/go.mod" k8s.io/client-go) # v0.X.Y, for Helm's default kube version
[[ -n $HELM_VERSION && -n $CLIENT_GO_VERSION ]] || die "cannot read versions from $MODULE_DIR/go.mod"
HELM_BIN=$BIN_DIR/helm-$HELM_VERSION-$(go_key "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum")

# ldflags: as Helm's Makefile (version stamping; the Kubernetes version Helm
# assumes for `template` and `lint` without a cluster = its client-go's).
ldflags() {
  local k8s_minor=${CLIENT_GO_VERSION#v0.} v=helm.sh/helm/v3
  k8s_minor=${k8s_minor%%.*}
  printf '%s' "-s -w -X $v/internal/version.version=$HELM_VERSION -X $v/internal/version.gitTreeState=clean" \
    " -X $v/pkg/lint/rules.k8sVersionMajor=1 -X $v/pkg/lint/rules.k8sVersionMinor=$k8s_minor" \
    " -X $v/pkg/chartutil.k8sVersionMajor=1 -X $v/pkg/chartutil.k8sVersionMinor=$k8s_minor"
}

build() {
  go_cached helm "$HELM_BIN" "$MODULE_DIR" helm.sh/helm/v3/cmd/helm "$(ldflags)" "$HELM_VERSION" \
    "minutes if Go's build cache is cold; "
}

case ${1:-} in
  build | path)
    build
    printf '%s\n' "$HELM_BIN"
    ;;
  -h | --help | help | "")
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    ;;
  *)
    build
    exec "$HELM_BIN" "$@"
    ;;
esac
