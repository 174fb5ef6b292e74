#!/usr/bin/env bash
# e2e/opa-envoy.sh — opa-envoy-grpc (e2e/opa-envoy): Open Policy Agent's Rego engine
# (github.com/open-policy-agent/opa, pinned) behind Envoy's ext_authz gRPC protocol, doing per
# Check call what OPA-Envoy's gRPC server does (the CheckRequest as the policy's input, a query
# prepared once), with OPA-Envoy's tutorial policy built in (a JWT bearer token's `role` claim
# against the method and path). A benchmark-only component: the external authorization
# benchmark (e2e/bench/external-authz.sh, SERVICES=opa) measures the decision cache against it.
# OPA-Envoy's own module (github.com/open-policy-agent/opa-envoy-plugin) is not served by the Go
# module proxy this project reaches; see e2e/opa-envoy/main.go. Built from its Go module and
# cached by e2e/go-build.sh as the other test components are; not built by e2e/test-all.sh.
#
#   e2e/opa-envoy.sh build     build (if missing) and print the binary's path
#   e2e/opa-envoy.sh path      same as build
#   e2e/opa-envoy.sh ARGS...   run `opa-envoy-grpc ARGS...` (building it first if
#                              missing), e.g. e2e/opa-envoy.sh -listen 127.0.0.1:9191
#
# The binary is $TOLLGATE_BIN_DIR/opa-envoy-grpc-<OPA version>-<hash of go.mod, go.sum,
# *.go and policy.rego>, also linked as $TOLLGATE_BIN_DIR/opa-envoy-grpc.
#
# Measured here (2 shared cores, other engineers' cargo builds running): a cold build
# (empty Go module and build caches, modules fetched from the Go module proxy) took 108 s wall
# (66 s user, 0.43 GB peak RSS); with the modules cached 113 s (load average 6.5 then: the
# compile dominates, the download takes seconds). The binary is 31 MB.
# A cached binary is used at once, without Go or the network.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/opa-envoy

log() { printf '[opa-envoy.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

OPA_VERSION=$(go_module_version "$MODULE_DIR/go.mod" github.com/open-policy-agent/opa)
[[ -n $OPA_VERSION ]] || die "cannot read the OPA version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/opa-envoy-grpc-$OPA_VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum "$MODULE_DIR"/*.go "$MODULE_DIR"/policy.rego)
LINK=$BIN_DIR/opa-envoy-grpc

# build: the binary, and the symlink pointed at it.
build() {
  go_cached opa-envoy-grpc "$BIN" "$MODULE_DIR" . "-s -w" "(OPA $OPA_VERSION)"
  ln -sfn "$(basename "$BIN")" "$LINK"
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
