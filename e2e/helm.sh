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
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

log() { printf '[helm.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# module_version MODULE: the version e2e/k8s/helm/go.mod requires MODULE at.
module_version() {
  awk -v m="$1" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$MODULE_DIR/go.mod"
}

HELM_VERSION=$(module_version helm.sh/helm/v3)
CLIENT_GO_VERSION=$(module_version k8s.io/client-go) # v0.X.Y, for Helm's default kube version
[[ -n $HELM_VERSION && -n $CLIENT_GO_VERSION ]] || die "cannot read versions from $MODULE_DIR/go.mod"
KEY=$(cat "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum" | sha256sum | cut -c1-10)
HELM_BIN=$BIN_DIR/helm-$HELM_VERSION-$KEY

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
  local start tmp
  if [[ -x $HELM_BIN ]]; then
    touch -c "$HELM_BIN" # mtime = last use, for the pruning below
    return 0
  fi
  command -v go >/dev/null || die "go is required to build helm"
  mkdir -p "$BIN_DIR"
  # One build at a time, even when several scripts need helm at once.
  exec 8>"$BIN_DIR/.helm.lock"
  flock 8
  if [[ -x $HELM_BIN ]]; then
    exec 8>&-
    return 0
  fi
  tmp=$HELM_BIN.tmp.$$
  log "building helm $HELM_VERSION -> $HELM_BIN (minutes if Go's build cache is cold; nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$MODULE_DIR" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "$(ldflags)" -o "$tmp" helm.sh/helm/v3/cmd/helm); then
    rm -f "$tmp"
    die "building helm failed"
  fi
  mv -f "$tmp" "$HELM_BIN"
  log "built helm in $((SECONDS - start))s"
  # Drop other helm builds not used for a week.
  find "$BIN_DIR" -maxdepth 1 -name 'helm-*' ! -path "$HELM_BIN" ! -name '*.tmp.*' -mtime +7 -delete
  exec 8>&-
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
