# e2e/bench/cpu.sh — sourced by the benchmark scripts: a process's CPU time, precisely.
# shellcheck shell=bash

# cpu_snap PID FILE: one "tid nanoseconds" line per thread of PID and of its children (nginx
# workers) into FILE: schedstat's time on a CPU. /proc/PID/stat's utime+stime count 10 ms
# ticks: at 10k requests/s for 5 s a tick was 0.2 µs of a 12 µs request, 2% of a ratio.
cpu_snap() {
  local p
  for p in $1 $(pgrep -P "$1" || true); do
    awk '{n = split(FILENAME, f, "/"); print f[n - 1], $1}' /proc/"$p"/task/*/schedstat 2>/dev/null || true
  done >"$2"
}

# cpu_ns BEFORE AFTER: nanoseconds on a CPU between two snapshots of cpu_snap. Per thread, so a
# thread that ended in between (an idle runtime thread retiring) does not subtract its whole
# lifetime, as a difference of two sums would.
cpu_ns() {
  awk 'NR == FNR {a[$1] = $2; next} {s += $2 - (($1 in a) ? a[$1] : 0)} END {printf "%.0f", s}' "$1" "$2"
}
