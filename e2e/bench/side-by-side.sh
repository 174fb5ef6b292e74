# e2e/bench/side-by-side.sh — sourced by policies.sh and client.sh: the side-by-side method.
# Each variant runs in its own tollgate-proxy (one worker) on CPU 0 and is loaded by its own
# wrk on CPU 1 at the same time as its partner (the bare route), which its own wrk loads; a
# round records each one's requests per proxy CPU-second over the same seconds, and the bare
# route alone (for the cost of sharing the core). side_by_side.py reads the records.
#
# The caller sets `bench` (this directory), sources this file, calls sbs_init, then fills the
# maps below for every load target (a name wrk loads):
#   port_of[T]     the port wrk connects to on 127.0.0.1
#   hdr_of[T]      the headers wrk sends, tab-separated
#   pid_of[T]      the tollgate-proxy whose CPU time counts for T
#   path_of[T]     the path wrk asks for (default: /)
#   script_of[T]   a wrk Lua script for T's requests (default: none)
#   partner_of[V]  the target loaded beside variant V (default: bare)
# Its hooks, no-ops unless it redefines them after sourcing: sbs_measure_start V (before the
# measured seconds), sbs_measure_end V (after them), sbs_record_extra V ROUND (after the pair's
# figures are recorded).
# shellcheck shell=bash disable=SC2034,SC2154 # the globals set here are the caller's; bench is its

# shellcheck source=e2e/bench/cpu.sh
. "$bench/cpu.sh"
# shellcheck source=e2e/bench/backend.sh
. "$bench/backend.sh"

declare -gA port_of=() hdr_of=() pid_of=() partner_of=() path_of=() script_of=()
pids=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# sbs_init NAME: ROUNDS (7), SAT_SECS (5), CONNS (50), CARGO_TARGET_DIR, a work directory
# /tmp/tollgate-bench-NAME.* (removed on exit unless KEEP=1), `raw` (the records), `started`;
# `per_proxy` (CONNS/2, each wrk's connections in a pair); every pid in `pids` is killed on exit.
sbs_init() {
  ROUNDS=${ROUNDS:-7}
  SAT_SECS=${SAT_SECS:-5}
  CONNS=${CONNS:-50}
  per_proxy=$((CONNS / 2))
  [ "$per_proxy" -ge 1 ] || { echo "CONNS must be at least 2" >&2; exit 1; }
  cache=$HOME/.cache/tollgate
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
  work=$(mktemp -d "/tmp/tollgate-bench-$1.XXXXXX")
  raw=$work/raw.tsv
  : >"$raw"
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  trap sbs_cleanup EXIT
}

# shellcheck disable=SC2317 # called as the EXIT trap
sbs_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}

sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
apt_install() {
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null; }
}

# sbs_binaries: builds tollgate and tollgate-proxy (not with BUILD=0) in PROFILE (release; debug
# for a quick check of the script, whose figures mean nothing) and copies them to `bin`.
sbs_binaries() {
  PROFILE=${PROFILE:-release}
  if [ "${BUILD:-1}" = 1 ]; then
    log "building Tollgate ($PROFILE)"
    case $PROFILE in
      release) cargo build --release -q -p tollgate -p tollgate-proxy ;;
      debug) cargo build -q -p tollgate -p tollgate-proxy ;;
      *) cargo build --profile "$PROFILE" -q -p tollgate -p tollgate-proxy ;;
    esac
  fi
  mkdir -p "$work/bin"
  cp "$CARGO_TARGET_DIR/$PROFILE/tollgate" "$CARGO_TARGET_DIR/$PROFILE/tollgate-proxy" "$work/bin/"
  bin=$work/bin
}

spawn() { # cpu command...
  local cpu=$1
  shift
  taskset -c "$cpu" "$@" &
  last_pid=$!
  pids+=("$last_pid")
}

wait_200() { # url [header...]
  local code h=() x
  for x in "${@:2}"; do h+=(-H "$x"); done
  for _ in $(seq 1 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "${h[@]}" "$1" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.05
  done
  echo "never answered 200: $1 (last $code)" >&2
  return 1
}

# sbs_backend: the backend (backend.sh) on CPU 1, answering.
sbs_backend() {
  backend_conf "$work"
  spawn 1 nginx -e "$work/backend.err" -c "$work/backend.conf"
  wait_200 http://127.0.0.1:19080/
}

record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$raw"; } # round variant metric value

load() { # target seconds outfile connections: wrk on CPU 1
  local v=$1 x hs h=()
  IFS=$'\t' read -r -a hs <<<"${hdr_of[$v]:-}"
  for x in "${hs[@]}"; do h+=(-H "$x"); done
  [ -n "${script_of[$v]:-}" ] && h+=(-s "${script_of[$v]}")
  taskset -c 1 wrk -t1 -c"$4" -d"$2s" "${h[@]}" "http://127.0.0.1:${port_of[$v]}${path_of[$v]:-/}" >"$3"
}

# record_run ROUND NAME OUTFILE CPU_NS: what one proxy did in one measurement.
record_run() {
  local n
  n=$(awk '/requests in/ {print $1}' "$3")
  if ! { [ -n "$n" ] && [ "$n" -gt 0 ]; }; then
    echo "no requests counted for $2 (round $1): $(cat "$3")" >&2
    exit 1
  fi
  record "$1" "$2" rps "$(awk '/^Requests\/sec/ {print $2}' "$3")"
  record "$1" "$2" rps_per_core "$(awk -v ns="$4" -v n="$n" 'BEGIN {printf "%.0f", (ns > 0) ? n / (ns / 1e9) : 0}')"
  record "$1" "$2" errors "$(awk '/Non-2xx/ {s += $NF} /Socket errors/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} END {print s + 0}' "$3")"
  record "$1" "$2" requests "$n"
}

sbs_measure_start() { :; }
sbs_measure_end() { :; }
sbs_record_extra() { :; }

alone() { # round: the bare route alone on CPU 0 (CONNS connections), for the sharing overhead
  local r=$1
  load bare 1 /dev/null "$CONNS"
  cpu_snap "${pid_of[bare]}" "$work/cpu.b0"
  load bare "$SAT_SECS" "$work/out.alone" "$CONNS"
  cpu_snap "${pid_of[bare]}" "$work/cpu.b1"
  record_run "$r" bare-alone "$work/out.alone" "$(cpu_ns "$work/cpu.b0" "$work/cpu.b1")"
  log "r$r bare alone: $(awk '/^Requests\/sec/ {print $2}' "$work/out.alone") req/s"
}

pair() { # variant round: the variant and its partner (the bare route), loaded at the same time
  local v=$1 r=$2 a b p=${partner_of[$1]:-bare}
  load "$p" 1 /dev/null "$per_proxy" &
  a=$!
  load "$v" 1 /dev/null "$per_proxy" &
  b=$!
  wait "$a"
  wait "$b"
  sbs_measure_start "$v"
  cpu_snap "${pid_of[$p]}" "$work/cpu.b0"
  cpu_snap "${pid_of[$v]}" "$work/cpu.v0"
  load "$p" "$SAT_SECS" "$work/out.bare" "$per_proxy" &
  a=$!
  load "$v" "$SAT_SECS" "$work/out.$v" "$per_proxy" &
  b=$!
  wait "$a"
  wait "$b"
  cpu_snap "${pid_of[$p]}" "$work/cpu.b1"
  cpu_snap "${pid_of[$v]}" "$work/cpu.v1"
  sbs_measure_end "$v"
  # The bare route's figures of this pair are recorded under "bare@VARIANT".
  record_run "$r" "bare@$v" "$work/out.bare" "$(cpu_ns "$work/cpu.b0" "$work/cpu.b1")"
  record_run "$r" "$v" "$work/out.$v" "$(cpu_ns "$work/cpu.v0" "$work/cpu.v1")"
  sbs_record_extra "$v" "$r"
  log "r$r $v beside bare: $(awk '/^Requests\/sec/ {print $2}' "$work/out.$v") and $(awk '/^Requests\/sec/ {print $2}' "$work/out.bare") req/s"
}
