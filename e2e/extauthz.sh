#!/usr/bin/env bash
# e2e/extauthz.sh — extauthz-grpc (e2e/extauthz), a small Envoy ext_authz gRPC
# service (envoy.service.auth.v3.Authorization/Check, on go-control-plane's
# published protos) for the socket tests and benchmarks of the AuthPolicy
# `external` gRPC method, built from its Go module and cached like
# e2e/kstatus.sh caches kstatus-check. It also serves grpc-go's standard health service
# (grpc.health.v1.Health: unary Check, server-streaming Watch; e2e/extauthz/health.go), the
# gRPC backend of e2e/grpc-web-test.sh.
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
# build. e2e/grpc-web-test.sh and e2e/bench/grpc-web.sh run `e2e/extauthz.sh build`.
# Builds run under `nice -n 19` with GOFLAGS="-p=$TOLLGATE_BUILD_JOBS -mod=readonly"
# (default 1 job), CGO off.
#
# Measured here (2 shared cores, two other engineers' cargo builds running): a
# cold build (empty Go module and build caches, modules fetched from the Go
# module proxy) took 34 s wall (38 s user, 0.3 GB peak RSS); with the modules
# cached 19 s. With TLS (crypto/tls, grpc/credentials) on 2026-12-07, beside a
# cargo build of the proxy: 85 s wall (42 s user, 0.3 GB peak RSS). With the health service
# (modules cached, two cargo builds running): 47 s wall (16 s user). The binary is 15 MB. A
# cached binary is used at once, without Go or the network.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR,
# TOLLGATE_BUILD_JOBS (as for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$SCRIPT_DIR/extauthz

log() { printf '[extauthz.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

GCP_VERSION=$(go_module_version "$MODULE_DIR/go.mod" github.com/envoyproxy/go-control-plane/envoy)
[[ -n $GCP_VERSION ]] || die "cannot read the go-control-plane version from $MODULE_DIR/go.mod"
BIN=$BIN_DIR/extauthz-grpc-$GCP_VERSION-$(go_key "$MODULE_DIR"/go.mod "$MODULE_DIR"/go.sum "$MODULE_DIR"/*.go)
LINK=$BIN_DIR/extauthz-grpc

# build: the binary, and the symlink the tests find it by pointed at it.
build() {
  go_cached extauthz-grpc "$BIN" "$MODULE_DIR" . "-s -w" "(go-control-plane $GCP_VERSION)"
  ln -sfn "$(basename "$BIN")" "$LINK"
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
