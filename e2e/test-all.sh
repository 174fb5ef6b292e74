#!/usr/bin/env bash
# Every test of Tollgate: formatting, lints, unit tests, socket-level proxy tests, and the
# `tollgate run` end-to-end tests. Works on a fresh machine with Rust installed; builds are
# cached under $HOME/.cache/tollgate (never required).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"

step() { printf '\n==> %s\n' "$*"; }

for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    step "installing $component"
    rustup component add "$component"
  fi
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked
