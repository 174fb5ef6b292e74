#!/usr/bin/env bash
# e2e/oidc-provider.sh — oidc-provider (e2e/oidc-provider): zitadel/oidc's example OpenID
# Provider (its in-memory storage, login form and test users) with one confidential client
# for the OIDC login tests, built from its Go module and cached like e2e/kstatus.sh caches
# kstatus-check.
#
#   e2e/oidc-provider.sh build     build (if missing) and print the binary's path
#   e2e/oidc-provider.sh path      same as build
#   e2e/oidc-provider.sh ARGS...   run `oidc-provider ARGS...` (building it first if
#                                  missing), e.g.
#       e2e/oidc-provider.sh -listen 127.0.0.1:9998 -client shop -secret shop-secret
#
# proxy/tests/auth/oidc*.rs find the binary as $TOLLGATE_OIDC_PROVIDER or by its name under
# $TOLLGATE_BIN_DIR (newest first), and skip loudly when it was never built; e2e/test-all.sh
# builds it before `cargo test`.
#
# The binary is $TOLLGATE_BIN_DIR/oidc-provider-<zitadel/oidc version>-<hash of go.mod,
# go.sum and *.go>, so editing the module (or bumping a version) builds a new one, and a
# cached binary needs neither Go nor the network. Builds run under `nice -n 19` with
# GOFLAGS="-p=$TOLLGATE_BUILD_JOBS -mod=readonly" (default 1 job), CGO off.
#
# Measured here (2 shared cores under other builds): a cold build (empty Go module and
# build caches, modules fetched from the Go module proxy) took 25 s wall (30 s user, 0.3 GB
# peak RSS); a rebuild after editing main.go 1 s. The binary is 11 MB.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/oidc-provider
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

log() { printf '[oidc-provider.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# module_version MODULE: the version e2e/oidc-provider/go.mod requires MODULE at.
module_version() {
  awk -v m="$1" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$MODULE_DIR/go.mod"
}

OIDC_VERSION=$(module_version github.com/zitadel/oidc/v3)
[[ -n $OIDC_VERSION ]] || die "cannot read the github.com/zitadel/oidc/v3 version from $MODULE_DIR/go.mod"
KEY=$(cd "$MODULE_DIR" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-10)
BIN=$BIN_DIR/oidc-provider-$OIDC_VERSION-$KEY

build() {
  local start tmp
  if [[ -x $BIN ]]; then
    touch -c "$BIN" # mtime = last use, for the pruning below
    return 0
  fi
  command -v go >/dev/null || die "go is required to build oidc-provider"
  mkdir -p "$BIN_DIR"
  # One build at a time: parallel tests may all ask for the path at once.
  exec 8>"$BIN_DIR/.oidc-provider.lock"
  flock 8
  if [[ -x $BIN ]]; then
    exec 8>&-
    return 0
  fi
  tmp=$BIN.tmp.$$
  log "building oidc-provider (zitadel/oidc $OIDC_VERSION) -> $BIN (nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$MODULE_DIR" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "-s -w" -o "$tmp" .); then
    rm -f "$tmp"
    die "building oidc-provider failed"
  fi
  mv -f "$tmp" "$BIN"
  log "built oidc-provider in $((SECONDS - start))s"
  # Drop other builds not used for a week (another checkout may use a recent one).
  find "$BIN_DIR" -maxdepth 1 -name 'oidc-provider-*' ! -path "$BIN" ! -name '*.tmp.*' -mtime +7 -delete
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
