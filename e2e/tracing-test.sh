#!/usr/bin/env bash
# e2e/tracing-test.sh — OpenTelemetry tracing checked against a real OpenTelemetry
# Collector (e2e/otelcol.sh: the core collector with the OTLP receiver and the contrib file
# exporter, built from Go modules and cached), on loopback, for both OTLP protocols (gRPC,
# and HTTP with protobuf bodies): `tollgate run` on a Gateway with an AuthPolicy (API keys)
# and a RateLimitPolicy, requests with a sampled parent, an unsampled one, none, and none
# with a key; the spans the collector wrote are checked by e2e/tracing-check.py (its
# docstring lists the assertions: parent and child ids, attributes, policy events, the
# sampling ratio within its binomial bound, the trace id in the access log). Then the
# controller's reconcile spans: controller/tests/k8s_tracing.rs runs `tollgate controller`
# on the real kube-apiserver of e2e/cluster.sh, exporting to the same collector binary, and
# checks the `reconcile` span, its attributes and its phases' child spans.
#
# Needs python3 and Go (for the collector's first build; e2e/otelcol.sh gives the cold
# time). Builds tollgate (debug). KEEP=1 leaves the work directory for a look.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}

log() { printf '[tracing %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

command -v python3 >/dev/null || { log "FAIL: python3 is required"; exit 1; }
otelcol=$("$E2E/otelcol.sh" path)
log "building tollgate (debug)"
(cd "$ROOT" && cargo build --locked -p tollgate --bin tollgate)
WORK=$(mktemp -d /tmp/tollgate-tracing.XXXXXX)
cleanup() {
  if [[ ${KEEP:-0} == 1 ]]; then
    log "kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
python3 "$E2E/tracing-check.py" "$CARGO_TARGET_DIR/debug/tollgate" "$otelcol" "$WORK"
log "the controller's reconcile spans (real kube-apiserver, real collector)"
(cd "$ROOT" && cargo test --locked -p tollgate --test k8s_tracing)
log "PASS"
