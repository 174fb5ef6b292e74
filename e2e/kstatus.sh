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
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

log() { printf '[kstatus.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# module_version MODULE: the version e2e/kstatus/go.mod requires MODULE at.
module_version() {
  awk -v m="$1" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$MODULE_DIR/go.mod"
}

CLI_UTILS_VERSION=$(module_version sigs.k8s.io/cli-utils)
[[ -n $CLI_UTILS_VERSION ]] || die "cannot read the sigs.k8s.io/cli-utils version from $MODULE_DIR/go.mod"
KEY=$(cd "$MODULE_DIR" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-10)
BIN=$BIN_DIR/kstatus-check-$CLI_UTILS_VERSION-$KEY

build() {
  local start tmp
  if [[ -x $BIN ]]; then
    touch -c "$BIN" # mtime = last use, for the pruning below
    return 0
  fi
  command -v go >/dev/null || die "go is required to build kstatus-check"
  mkdir -p "$BIN_DIR"
  # One build at a time: parallel tests may all ask for the path at once.
  exec 8>"$BIN_DIR/.kstatus-check.lock"
  flock 8
  if [[ -x $BIN ]]; then
    exec 8>&-
    return 0
  fi
  tmp=$BIN.tmp.$$
  log "building kstatus-check (cli-utils $CLI_UTILS_VERSION) -> $BIN (nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$MODULE_DIR" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "-s -w" -o "$tmp" .); then
    rm -f "$tmp"
    die "building kstatus-check failed"
  fi
  mv -f "$tmp" "$BIN"
  log "built kstatus-check in $((SECONDS - start))s"
  # Drop other builds not used for a week (another checkout may use a recent one).
  find "$BIN_DIR" -maxdepth 1 -name 'kstatus-check-*' ! -path "$BIN" ! -name '*.tmp.*' -mtime +7 -delete
  exec 8>&-
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
