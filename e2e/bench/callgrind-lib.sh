# e2e/bench/callgrind-lib.sh — sourced by callgrind.sh and callgrind-policies.sh: what both
# need before measuring. Needs `bench` (this directory) and `out` (the output directory).
# shellcheck shell=bash disable=SC2034,SC2154 # bin, oha and pids are for the caller; bench and out come from it

# callgrind_setup: checks for valgrind, nginx and oha; builds tollgate and tollgate-proxy
# (release; not with BUILD=0); sets `bin` and `oha`; starts the shared nginx backend
# (backend.sh) on core 1. Every pid added to `pids` is killed on exit.
callgrind_setup() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
  bin=$CARGO_TARGET_DIR/release
  oha=$HOME/.cache/tollgate/cargo-bin/bin/oha
  command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
  command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
  [ -x "$oha" ] || { echo "oha missing: run e2e/bench/run.sh once" >&2; exit 1; }
  [ "${BUILD:-1}" = 1 ] && cargo build --release -q -p tollgate -p tollgate-proxy
  pids=()
  trap callgrind_cleanup EXIT
  # shellcheck source=e2e/bench/backend.sh
  . "$bench/backend.sh"
  backend_conf "$out"
  taskset -c 1 nginx -e "$out/backend.err" -c "$out/backend.conf" &
  pids+=($!)
}

# shellcheck disable=SC2317 # called as the EXIT trap
callgrind_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
