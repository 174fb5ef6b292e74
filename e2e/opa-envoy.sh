#!/usr/bin/env bash
# e2e/opa-envoy.sh — opa-envoy-grpc (e2e/opa-envoy): Open Policy Agent's Rego engine
# (github.com/open-policy-agent/opa, pinned) behind Envoy's ext_authz gRPC protocol, doing per
# Check call what OPA-Envoy's gRPC server does (the CheckRequest as the policy's input, a query
# prepared once), with OPA-Envoy's tutorial policy built in (a JWT bearer token's `role` claim
# against the method and path). A benchmark-only component: the external authorization
# benchmark (e2e/bench/external-authz.sh, SERVICES=opa) measures the decision cache against it.
# OPA-Envoy's own module (github.com/open-policy-agent/opa-envoy-plugin) is not served by the Go
# module proxy this project reaches; see e2e/opa-envoy/main.go. Built from its Go module and
# cached like e2e/extauthz.sh caches extauthz-grpc; not built by e2e/test-all.sh.
#
#   e2e/opa-envoy.sh build     build (if missing) and print the binary's path
#   e2e/opa-envoy.sh path      same as build
#   e2e/opa-envoy.sh ARGS...   run `opa-envoy-grpc ARGS...` (building it first if
#                              missing), e.g. e2e/opa-envoy.sh -listen 127.0.0.1:9191
#
# The binary is $TOLLGATE_BIN_DIR/opa-envoy-grpc-<OPA version>-<hash of go.mod, go.sum,
# *.go and policy.rego>, also linked as $TOLLGATE_BIN_DIR/opa-envoy-grpc. Builds run under
# `nice -n 19` with GOFLAGS="-p=$TOLLGATE_BUILD_JOBS -mod=readonly" (default 1 job), CGO off.
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
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

log() { printf '[opa-envoy.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# module_version MODULE: the version e2e/opa-envoy/go.mod requires MODULE at.
module_version() {
  awk -v m="$1" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$MODULE_DIR/go.mod"
}

OPA_VERSION=$(module_version github.com/open-policy-agent/opa)
[[ -n $OPA_VERSION ]] || die "cannot read the OPA version from $MODULE_DIR/go.mod"
KEY=$(cd "$MODULE_DIR" && cat go.mod go.sum ./*.go policy.rego | sha256sum | cut -c1-10)
BIN=$BIN_DIR/opa-envoy-grpc-$OPA_VERSION-$KEY
LINK=$BIN_DIR/opa-envoy-grpc

build() {
  local start tmp
  if [[ -x $BIN ]]; then
    touch -c "$BIN" # mtime = last use, for the pruning below
    ln -sfn "$(basename "$BIN")" "$LINK"
    return 0
  fi
  command -v go >/dev/null || die "go is required to build opa-envoy-grpc"
  mkdir -p "$BIN_DIR"
  # One build at a time: parallel tests may all ask for the path at once.
  exec 8>"$BIN_DIR/.opa-envoy-grpc.lock"
  flock 8
  if [[ -x $BIN ]]; then
    ln -sfn "$(basename "$BIN")" "$LINK"
    exec 8>&-
    return 0
  fi
  tmp=$BIN.tmp.$$
  log "building opa-envoy-grpc (OPA $OPA_VERSION) -> $BIN (nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$MODULE_DIR" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "-s -w" -o "$tmp" .); then
    rm -f "$tmp"
    die "building opa-envoy-grpc failed"
  fi
  mv -f "$tmp" "$BIN"
  ln -sfn "$(basename "$BIN")" "$LINK"
  log "built opa-envoy-grpc in $((SECONDS - start))s"
  # Drop other builds not used for a week (another checkout may use a recent one).
  find "$BIN_DIR" -maxdepth 1 -name 'opa-envoy-grpc-*' ! -path "$BIN" ! -name '*.tmp.*' -mtime +7 -delete
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
