#!/usr/bin/env bash
# Runs every fuzz target of fuzz/Cargo.toml for SECONDS each (default 30), from its committed
# seed corpus (fuzz/seeds/<target>/) copied to a scratch corpus, so the committed seeds never
# grow. Fails, naming the target and the crash file, if any target crashes (a panic, a
# timeout of one input, or memory past the limit). See docs/fuzzing.md.
#
#   e2e/fuzz.sh [SECONDS] [TARGET...]
#
# Environment: FUZZ_SANITIZER (none, the default: the code is safe Rust and the checks are
# panics and assertions; `address` for deeper runs), FUZZ_RSS_MB (memory limit per target,
# default 2048), FUZZ_TIMEOUT (seconds one input may take, default 10), FUZZ_WORK (scratch
# corpora and crash files, default $HOME/.cache/tollgate/fuzz-work).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
# The build is cached apart from the workspace's (other flags, another toolchain).
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/tollgate/fuzz-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
sanitizer="${FUZZ_SANITIZER:-none}"
rss_mb="${FUZZ_RSS_MB:-2048}"
timeout="${FUZZ_TIMEOUT:-10}"
work="${FUZZ_WORK:-$HOME/.cache/tollgate/fuzz-work}"

step() { printf '\n==> %s\n' "$*"; }

if ! rustup toolchain list | grep -q '^nightly'; then
  step "installing the nightly toolchain (libFuzzer's instrumentation needs it)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  step "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

# --debug-assertions: integer overflow and debug_assert! panic, as in tests; -O (release) as
# the proxy runs.
flags=(--sanitizer "$sanitizer" --debug-assertions)
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

step "building ${#targets[@]} fuzz targets (sanitizer: $sanitizer)"
start=$SECONDS
cargo +nightly fuzz build "${flags[@]}"
echo "built in $((SECONDS - start)) s"

failed=()
for t in "${targets[@]}"; do
  corpus="$work/$t/corpus"
  artifacts="$work/$t/artifacts/"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$artifacts"
  if [[ -d "fuzz/seeds/$t" ]]; then
    cp fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true
  fi
  step "fuzzing $t for ${seconds}s"
  log="$work/$t/log"
  if cargo +nightly fuzz run "${flags[@]}" "$t" "$corpus" -- \
    -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout" \
    -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
    echo "$t: ok, $runs executions, coverage $cov"
  else
    crash=$(grep -o 'Test unit written to .*' "$log" | tail -1 | sed 's/Test unit written to //' || true)
    tail -n 40 "$log"
    echo "$t: FAILED; crash file: ${crash:-none written (see $log)}"
    failed+=("$t ${crash:-$log}")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  step "fuzz targets that crashed"
  printf '  %s\n' "${failed[@]}"
  echo "Reproduce: cargo +nightly fuzz run --sanitizer $sanitizer --debug-assertions TARGET CRASH_FILE (docs/fuzzing.md)"
  exit 1
fi
