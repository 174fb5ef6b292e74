#!/usr/bin/env bash
# e2e/extauthz.sh — extauthz-grpc (e2e/extauthz), a small Envoy ext_authz gRPC
# service (envoy.service.auth.v3.Authorization/Check, on go-control-plane's
# published protos) for the socket tests and benchmarks of the AuthPolicy
# `external` gRPC method, built from its Go module and cached like
# e2e/kstatus.sh caches kstatus-check.
#
#   e2e/extauthz.sh build     build (if missing) and print the binary's path
#   e2e/extauthz.sh path      same as build
#   e2e/extauthz.sh current   print the path of this checkout's build, or exit 1
#                             when it is not built (never builds)
#   e2e/extauthz.sh ARGS...   run `extauthz-grpc ARGS...` (building it first if
#                             missing), e.g. e2e/extauthz.sh -listen 127.0.0.1:9191
#
# The binary is $TOLLGATE_BIN_DIR/extauthz-grpc-<go-control-plane version>-<hash
# of go.mod, go.sum and *.go>, and $TOLLGATE_BIN_DIR/extauthz-grpc a symlink to
# the last one built. The tests (proxy/tests/policy/external_grpc.rs, and
# external_tls.rs, which runs it with -tls-cert) take $TOLLGATE_EXTAUTHZ, else
# `e2e/extauthz.sh current`: the build of their own checkout's source, not the
# symlink, which another checkout sharing the cache may have moved to an older
# build. Builds run under `nice -n 19` with
# GOFLAGS="-p=$TOLLGATE_BUILD_JOBS -mod=readonly" (default 1 job), CGO off.
#
# Measured here (2 shared cores, two other engineers' cargo builds running): a
# cold build (empty Go module and build caches, modules fetched from the Go
# module proxy) took 34 s wall (38 s user, 0.3 GB peak RSS); with the modules
# cached 19 s. With TLS (crypto/tls, grpc/credentials) on 2026-12-07, beside a
# cargo build of the proxy: 85 s wall (42 s user, 0.3 GB peak RSS). The binary is 15 MB. A cached binary is used at once, without Go
# or the network.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/extauthz
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

log() { printf '[extauthz.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# module_version MODULE: the version e2e/extauthz/go.mod requires MODULE at.
module_version() {
  awk -v m="$1" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$MODULE_DIR/go.mod"
}

GCP_VERSION=$(module_version github.com/envoyproxy/go-control-plane/envoy)
[[ -n $GCP_VERSION ]] || die "cannot read the go-control-plane version from $MODULE_DIR/go.mod"
KEY=$(cd "$MODULE_DIR" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-10)
BIN=$BIN_DIR/extauthz-grpc-$GCP_VERSION-$KEY
LINK=$BIN_DIR/extauthz-grpc

build() {
  local start tmp
  if [[ -x $BIN ]]; then
    touch -c "$BIN" # mtime = last use, for the pruning below
    ln -sfn "$(basename "$BIN")" "$LINK"
    return 0
  fi
  command -v go >/dev/null || die "go is required to build extauthz-grpc"
  mkdir -p "$BIN_DIR"
  # One build at a time: parallel tests may all ask for the path at once.
  exec 8>"$BIN_DIR/.extauthz-grpc.lock"
  flock 8
  if [[ -x $BIN ]]; then
    ln -sfn "$(basename "$BIN")" "$LINK"
    exec 8>&-
    return 0
  fi
  tmp=$BIN.tmp.$$
  log "building extauthz-grpc (go-control-plane $GCP_VERSION) -> $BIN (nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$MODULE_DIR" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "-s -w" -o "$tmp" .); then
    rm -f "$tmp"
    die "building extauthz-grpc failed"
  fi
  mv -f "$tmp" "$BIN"
  ln -sfn "$(basename "$BIN")" "$LINK"
  log "built extauthz-grpc in $((SECONDS - start))s"
  # Drop other builds not used for a week (another checkout may use a recent one).
  find "$BIN_DIR" -maxdepth 1 -name 'extauthz-grpc-*' ! -path "$BIN" ! -name '*.tmp.*' -mtime +7 -delete
  exec 8>&-
}

case ${1:-} in
  build | path)
    build
    printf '%s\n' "$BIN"
    ;;
  current)
    [[ -x $BIN ]] || exit 1
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
