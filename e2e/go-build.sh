# shellcheck shell=bash
# e2e/go-build.sh — sourced by the scripts that build a test component from a small wrapper Go
# module with pinned versions and cache the binary (e2e/kstatus.sh, e2e/helm.sh,
# e2e/extauthz.sh, e2e/oidc-provider.sh, e2e/flux.sh, e2e/opa-envoy.sh, e2e/prometheus.sh). In: the caller's `log` and `die`, and
# the environment (all optional) TOLLGATE_CACHE_DIR, TOLLGATE_BIN_DIR, TOLLGATE_BUILD_JOBS.
# Out: CACHE_DIR, BIN_DIR, BUILD_JOBS and the functions below.
#
# The cache: a binary is $BIN_DIR/<name>-<version>-<key>, <key> the first 10 hex digits of the
# SHA-256 of the wrapper module's files (go_key), so editing the module or bumping a version
# builds a new one and a cached one needs neither Go nor the network. Each use refreshes the
# binary's mtime; after a build, other builds of the same name unused for 7 days are deleted
# (another checkout may use a recent one). Builds run one at a time per name (flock on
# $BIN_DIR/.<name>.lock: parallel tests may all ask at once), under `nice -n 19` with
# GOFLAGS="-p=$BUILD_JOBS -mod=readonly", CGO off, `-trimpath`, into a temporary file renamed
# into place, so a failed or interrupted build leaves nothing a later call would take.

CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}

# go_module_version GO_MOD MODULE: the version GO_MOD requires MODULE at (empty when it does
# not).
go_module_version() {
  awk -v m="$2" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$1"
}

# go_key FILE...: the cache key of a build made from these files.
go_key() { cat "$@" | sha256sum | cut -c1-10; }

# go_lock NAME [WHAT]: waits for, then holds, the build lock of NAME (on fd 8) once go is found
# (else dies: "go is required to build WHAT", default NAME); go_unlock releases it.
go_lock() {
  command -v go >/dev/null || die "go is required to build ${2:-$1}"
  mkdir -p "$BIN_DIR"
  exec 8>"$BIN_DIR/.$1.lock"
  flock 8
}
go_unlock() { exec 8>&-; }

# go_build NAME BIN MODULE_DIR PACKAGE LDFLAGS WHAT [NOTE]: builds BIN when it is missing, with
# `go build PACKAGE` in MODULE_DIR; the caller holds the lock. WHAT follows NAME in the message
# (the version, e.g. "(cli-utils v0.37.2)"), NOTE precedes "nice -n 19" in it. GO_BUILD_TAGS
# (optional, comma-separated) is passed as -tags, e.g. to leave out code a test never runs.
go_build() {
  local name=$1 bin=$2 dir=$3 package=$4 ldflags=$5 what=$6 note=${7:-} start tmp
  [[ -x $bin ]] && return 0
  tmp=$bin.tmp.$$
  log "building $name $what -> $bin (${note}nice -n 19, -p=$BUILD_JOBS)"
  start=$SECONDS
  if ! (cd "$dir" && CGO_ENABLED=0 GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -tags "${GO_BUILD_TAGS:-}" -ldflags "$ldflags" -o "$tmp" "$package"); then
    rm -f "$tmp"
    die "building $name failed"
  fi
  mv -f "$tmp" "$bin"
  log "built $name in $((SECONDS - start))s"
}

# go_prune PATTERN KEEP...: deletes the builds matching PATTERN in $BIN_DIR unused for 7 days,
# except KEEP (files or directories).
go_prune() {
  local pattern=$1 keep=() k
  shift
  for k in "$@"; do keep+=(! -path "$k"); done
  find "$BIN_DIR" -maxdepth 1 -name "$pattern" ! -name '*.tmp.*' -mtime +7 "${keep[@]}" -exec rm -rf {} +
}

# go_cached NAME BIN MODULE_DIR PACKAGE LDFLAGS WHAT [NOTE]: the whole cache for one binary:
# BIN when it is there (its mtime refreshed), else built under NAME's lock (go_build), then the
# old builds NAME-* pruned.
go_cached() {
  local name=$1 bin=$2
  if [[ -x $bin ]]; then
    touch -c "$bin"
    return 0
  fi
  go_lock "$name"
  if [[ ! -x $bin ]]; then
    go_build "$@"
    go_prune "$name-*" "$bin"
  fi
  go_unlock
}
