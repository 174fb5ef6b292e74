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

log() { printf '[oidc-provider.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

OIDC_VERSION=$(go_module_version "$MODULE_DIR/go.mod" github.com/zitadel/oidc/v3)
[[ -n $OIDC_VERSION ]] || die "cannot read the github.com/zitadel/oidc/v3 version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/oidc-provider-$OIDC_VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum "$MODULE_DIR"/*.go)

build() { go_cached oidc-provider "$BIN" "$MODULE_DIR" . "-s -w" "(zitadel/oidc $OIDC_VERSION)"; }

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
