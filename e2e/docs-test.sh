#!/usr/bin/env bash
# e2e/docs-test.sh — runs the documentation as a new user pastes it: every shell block of
# docs/getting-started.md on the loopback cluster (`e2e/cluster.sh up --full`), in order, in
# one shell (variables carry from block to block), then the shell blocks of the README's
# "Five-minute tour" section on this machine. Fails on the first command that fails.
#
# Conventions of the pages it runs (plain Markdown, rendered as usual):
#   ```sh                        a block to run, with `set -euo pipefail`
#   ```sh background PORT        a block that serves (`tollgate run`): started in the
#                                background and waited for until 127.0.0.1:PORT accepts
#                                connections; stopped at the end
#   ```text output               right after a block: what that block must print (compared
#                                line by line, exactly)
#   ```sh exit=N                a block whose last command must fail with status N (run in a
#                                subshell; its output block, if any, compares stdout and stderr)
#   ```sh no-test                shown, not run (none of the pages this script runs has one today)
# `kubectl` and `helm` run against the loopback cluster (`helm` is e2e/helm.sh, built from
# its Go module). Needs a running `up --full` cluster (skips, exit 0, without one; fails then
# under TOLLGATE_REQUIRE_FULL=1). `DOCS_TEST_ONLY=tour` or `=getting-started` runs one part.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}
ONLY=${DOCS_TEST_ONLY:-}

log() { printf '[docs-test %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

WORK=$(mktemp -d /tmp/tollgate-docs-test.XXXXXX)
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  local rc=$? pid
  for pid in $(cat "$WORK/pids" 2>/dev/null); do
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done
  if [[ -f $WORK/on-cluster ]]; then
    if ((rc != 0)); then
      kubectl -n demo get pods,gateway,httproute,ratelimitpolicy -o wide >&2 2>/dev/null || true
      kubectl -n tollgate-system logs deploy/tollgate-controller --tail 30 >&2 2>/dev/null || true
    fi
    # What the page's last block removes, when a block before it failed.
    "$E2E/helm.sh" uninstall tollgate -n tollgate-system --wait --timeout 60s >/dev/null 2>&1 || true
    kubectl delete namespace demo tollgate-system --wait=false >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# to_script MARKDOWN SECTION OUT: writes OUT, a bash script running every runnable block of
# MARKDOWN (only those under the `## SECTION` heading when SECTION is not empty), each
# announced with its file and line, background blocks started in their own process group,
# output blocks compared (e2e/doc-blocks.py).
to_script() {
  python3 "$E2E/doc-blocks.py" "$1" "$2" "$3" "$WORK"
}

if [[ $ONLY != getting-started ]]; then
  log "README.md, section 'Five-minute tour', on this machine"
  n=$(to_script "$ROOT/README.md" "Five-minute tour" "$WORK/tour.sh")
  log "$n blocks"
  (cd "$ROOT" && bash "$WORK/tour.sh") || die "the README's tour (above)"
  for pid in $(cat "$WORK/pids" 2>/dev/null); do kill -- "-$pid" 2>/dev/null || true; done
  : >"$WORK/pids"
  log "README tour: every block ran"
fi

if [[ $ONLY != tour ]]; then
  # shellcheck source=e2e/full-lib.sh
  source "$E2E/full-lib.sh"
  require_full_cluster
  mkdir -p "$WORK/bin"
  printf '#!/usr/bin/env bash\nexec %q "$@"\n' "$E2E/helm.sh" >"$WORK/bin/helm"
  chmod +x "$WORK/bin/helm"
  export PATH="$WORK/bin:$PATH"
  helm version >/dev/null # builds helm now, not inside a block
  for ns in demo tollgate-system; do
    if kubectl get namespace "$ns" >/dev/null 2>&1; then
      die "namespace $ns exists: the page starts from a cluster without it (delete it first)"
    fi
  done
  touch "$WORK/on-cluster"
  log "docs/getting-started.md on the loopback cluster"
  n=$(to_script "$ROOT/docs/getting-started.md" "" "$WORK/getting-started.sh")
  log "$n blocks"
  (cd "$ROOT" && bash "$WORK/getting-started.sh") || die "docs/getting-started.md (above)"
  log "docs/getting-started.md: every block ran"
fi
log "PASS"
