#!/usr/bin/env bash
# e2e/flux.sh — Flux's source-controller and kustomize-controller, built from their Go
# modules (the wrapper modules e2e/k8s/flux-source-controller and
# e2e/k8s/flux-kustomize-controller) and cached like e2e/helm.sh and e2e/kstatus.sh cache
# theirs, with the CRDs of both copied next to them. e2e/flux-test.sh runs them as processes
# on the host against the loopback cluster.
#
#   e2e/flux.sh build        build what is missing; print the two binaries' paths and the
#                            CRD directory, one a line
#   e2e/flux.sh path [WHAT]  same as build, or only the path of WHAT: source-controller,
#                            kustomize-controller or crds
#   e2e/flux.sh test         e2e/flux-test.sh (on `e2e/cluster.sh up --full`)
#
# The binaries are $TOLLGATE_BIN_DIR/flux-source-controller-<version>-<hash of go.mod and
# go.sum> (and flux-kustomize-controller-...), the CRDs (every kind of
# source.toolkit.fluxcd.io and kustomize.toolkit.fluxcd.io, from the modules'
# config/crd/bases) are $TOLLGATE_BIN_DIR/flux-crds-<both versions>-<both hashes>/; editing a
# wrapper module (or bumping a version) builds new ones, and cached ones need neither Go nor
# the network. Builds run under `nice -n 19` with GOFLAGS="-p=$TOLLGATE_BUILD_JOBS
# -mod=readonly" (default 1 job), CGO off, as upstream's Dockerfiles build them.
#
# Measured here (2 cores, the modules already in Go's module cache: `go mod tidy` of the
# wrapper modules had fetched them in ~30 s):
# - with an empty Go build cache (GOCACHE=$(mktemp -d)), load ~1.5: 7 min 46 s wall for both
#   (source-controller 306 s, kustomize-controller 161 s, reusing what the first compiled:
#   client-go v0.36, controller-runtime, ...; 474 s user, 1.7 GB peak RSS, 2.9 GB of cache);
# - with the build cache of this machine (the other e2e tools' builds), under another
#   session's cargo builds and tests, load 3 to 5: 8 min 22 s (268 s + 234 s; 410 s user).
# A warm call (both binaries cached) takes 0.06 s. The binaries are 101 MB and 86 MB.
#
# Environment (all optional): TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR, TOLLGATE_BUILD_JOBS (as
# for e2e/cluster.sh).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONTROLLERS=(source-controller kustomize-controller)

log() { printf '[flux.sh] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# shellcheck source=e2e/go-build.sh
source "$SCRIPT_DIR/go-build.sh"

module_dir() { echo "$SCRIPT_DIR/k8s/flux-$1"; }

# version CONTROLLER: the version its wrapper module requires github.com/fluxcd/CONTROLLER at.
version() { go_module_version "$(module_dir "$1")/go.mod" "github.com/fluxcd/$1"; }

key() { go_key "$(module_dir "$1")/go.mod" "$(module_dir "$1")/go.sum"; }

declare -A BIN=()
for c in "${CONTROLLERS[@]}"; do
  v=$(version "$c")
  [[ -n $v ]] || die "cannot read the github.com/fluxcd/$c version from $(module_dir "$c")/go.mod"
  BIN[$c]=$BIN_DIR/flux-$c-$v-$(key "$c")
done
CRDS=$BIN_DIR/flux-crds-$(version source-controller)-$(version kustomize-controller)-$(
  key source-controller | cut -c1-5
)$(key kustomize-controller | cut -c1-5)

# copy_crds: the CRDs of both modules (from Go's module cache) into $CRDS.
copy_crds() {
  local c dir tmp=$CRDS.tmp.$$
  [[ -d $CRDS ]] && return 0
  mkdir -p "$tmp"
  for c in "${CONTROLLERS[@]}"; do
    dir=$(cd "$(module_dir "$c")" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' "github.com/fluxcd/$c")
    [[ -n $dir ]] || { rm -rf "$tmp"; die "github.com/fluxcd/$c is not in Go's module cache"; }
    cp "$dir"/config/crd/bases/*.yaml "$tmp/"
  done
  chmod -R u+w "$tmp"
  mv "$tmp" "$CRDS"
}

# build: both controllers and the CRDs under one lock (e2e/go-build.sh), as they go together.
build() {
  local c ready=1
  for c in "${CONTROLLERS[@]}"; do [[ -x ${BIN[$c]} ]] || ready=0; done
  [[ -d $CRDS ]] || ready=0
  if ((ready)); then
    touch -c "${BIN[@]}" "$CRDS" # mtime = last use, for the pruning below
    return 0
  fi
  go_lock flux "Flux's controllers"
  for c in "${CONTROLLERS[@]}"; do
    go_build "$c" "${BIN[$c]}" "$(module_dir "$c")" "github.com/fluxcd/$c" "-s -w" "$(version "$c")" \
      "minutes when Go's build cache is cold; "
  done
  copy_crds
  go_prune 'flux-*' "${BIN[source-controller]}" "${BIN[kustomize-controller]}" "$CRDS"
  go_unlock
}

case ${1:-} in
  build)
    build
    printf '%s\n' "${BIN[source-controller]}" "${BIN[kustomize-controller]}" "$CRDS"
    ;;
  path)
    build
    case ${2:-} in
      "") printf '%s\n' "${BIN[source-controller]}" "${BIN[kustomize-controller]}" "$CRDS" ;;
      source-controller | kustomize-controller) printf '%s\n' "${BIN[$2]}" ;;
      crds) printf '%s\n' "$CRDS" ;;
      *) die "path: unknown '$2' (source-controller, kustomize-controller or crds)" ;;
    esac
    ;;
  test)
    shift
    exec "$SCRIPT_DIR/flux-test.sh" "$@"
    ;;
  -h | --help | help | "")
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    ;;
  *)
    die "unknown subcommand '$1' (build, path or test)"
    ;;
esac
