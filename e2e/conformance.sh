#!/usr/bin/env bash
# e2e/conformance.sh — the official Gateway API conformance suite
# (sigs.k8s.io/gateway-api/conformance, the version of our CRDs) against Tollgate
# installed with Helm on the loopback cluster (`e2e/cluster.sh up --full`: pods are
# local processes, each Gateway gets a proxy pod and a LoadBalancer address
# 127.0.1.N that the suite sends its requests to).
#
# `e2e/conformance.sh --build` only builds the suite's binary (test-all.sh does that while
# the unit tests run). What it does, from a fresh machine (root):
#   1. starts `e2e/cluster.sh up --full` unless one runs (and stops it at the end
#      only in that case);
#   2. builds tollgate and tollgate-proxy (debug; the node agent runs these for the
#      chart's images) and the suite's test binary from e2e/conformance (Go module,
#      cached under $TOLLGATE_CACHE_DIR/bin by the hash of its sources);
#   3. `helm install`s charts/tollgate into tollgate-conformance (GatewayClass
#      `tollgate`);
#   4. runs the suite once for the profiles and writes its ConformanceReport to
#      e2e/conformance/reports/tollgate-report.yaml (the committed report is the one
#      this script wrote) and the suite's output to reports/conformance.log.
#
# Usage: e2e/conformance.sh [PROFILE...]
#   default: GATEWAY-HTTP GATEWAY-GRPC GATEWAY-TLS GATEWAY-TCP GATEWAY-UDP
# Env:
#   CONFORMANCE_RUN_TEST   run only this test (its ShortName); no report is written
#   CONFORMANCE_SKIP_TESTS comma-separated ShortNames to skip (recorded in the report)
#   CONFORMANCE_REPORT_DIR default e2e/conformance/reports
#   CONFORMANCE_DEBUG=1    the suite's debug logs (requests and responses)
#   KEEP=1                 leave the release and the suite's namespaces for inspection
# The features each profile claims are listed below: only what Tollgate implements.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE_DIR/target}
SUITE_DIR=$E2E/conformance
REPORT_DIR=${CONFORMANCE_REPORT_DIR:-$SUITE_DIR/reports}
NS=tollgate-conformance
RELEASE=tollgate
CLASS=tollgate
TIMEOUT=${CONFORMANCE_INSTALL_TIMEOUT:-180}

log() { printf '[conformance %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

# Features claimed, by profile. A profile's core features are always tested; the rest are
# extended features, each implemented and passing (no test is skipped to get there). One run
# of the suite covers every profile asked for, so each test runs once and one report lists
# every profile.
# build_suite: the suite's test binary, cached in $BIN_DIR by version and a hash of its
# wrapper module; sets suite_bin.
build_suite() {
  local suite_version hash
  suite_version=$(grep -o 'sigs.k8s.io/gateway-api/conformance v[^ ]*' "$SUITE_DIR/go.mod" | awk '{print $2; exit}')
  [[ -n $suite_version ]] || die "no sigs.k8s.io/gateway-api/conformance version in $SUITE_DIR/go.mod"
  hash=$(cat "$SUITE_DIR"/go.mod "$SUITE_DIR"/go.sum "$SUITE_DIR"/*.go | sha256sum | cut -c1-10)
  suite_bin=$BIN_DIR/conformance-$suite_version-$hash.test
  if [[ ! -x $suite_bin ]]; then
    log "building the conformance suite $suite_version (go test -c; a few minutes the first time)"
    mkdir -p "$BIN_DIR"
    (cd "$SUITE_DIR" && GOFLAGS=-mod=readonly nice -n 19 go test -c -trimpath -o "$suite_bin.tmp" .)
    mv "$suite_bin.tmp" "$suite_bin"
  fi
}

# `--build`: only build (and cache) the suite, e.g. while other tests run.
if [[ ${1:-} == --build ]]; then
  build_suite
  exit 0
fi

http_features=(
  Gateway HTTPRoute ReferenceGrant
  GatewayPort8080 GatewayHTTPListenerIsolation GatewayInfrastructure GatewayAddressEmpty
  GatewayStaticAddresses GatewayHTTPSListenerDetectMisdirectedRequests ListenerSet
  GatewayFrontendClientCertificateValidation GatewayFrontendClientCertificateValidationInsecureFallback
  HTTPRouteQueryParamMatching HTTPRouteMethodMatching HTTPRouteResponseHeaderModification
  HTTPRouteBackendRequestHeaderModification HTTPRoutePortRedirect HTTPRouteSchemeRedirect
  HTTPRoutePathRedirect HTTPRouteHostRewrite HTTPRoutePathRewrite HTTPRouteRequestMirror
  HTTPRouteRequestMultipleMirrors HTTPRouteRequestPercentageMirror HTTPRouteRequestTimeout
  HTTPRouteBackendTimeout HTTPRouteParentRefPort HTTPRouteDestinationPortMatching HTTPRouteBackendProtocolH2C
  HTTPRouteBackendProtocolWebSocket HTTPRouteNamedRouteRule HTTPRouteCORS
  HTTPRoute303RedirectStatusCode HTTPRoute307RedirectStatusCode HTTPRoute308RedirectStatusCode
  BackendTLSPolicy BackendTLSPolicySANValidation GatewayBackendClientCertificate
  HTTPRouteRetry HTTPRouteRetryConnectionError HTTPRouteRetryBackendTimeout
)
grpc_features=(
  Gateway GRPCRoute ReferenceGrant GRPCRouteNamedRouteRule
)
tls_features=(
  Gateway TLSRoute ReferenceGrant TLSRouteModeTerminate TLSRouteModeMixed
)
tcp_features=(
  Gateway TCPRoute ReferenceGrant
)
udp_features=(
  Gateway UDPRoute ReferenceGrant
)

profiles=("$@")
((${#profiles[@]})) || profiles=(GATEWAY-HTTP GATEWAY-GRPC GATEWAY-TLS GATEWAY-TCP GATEWAY-UDP)
features=()
for p in "${profiles[@]}"; do
  case $p in
    GATEWAY-HTTP) features+=("${http_features[@]}") ;;
    GATEWAY-GRPC) features+=("${grpc_features[@]}") ;;
    GATEWAY-TLS) features+=("${tls_features[@]}") ;;
    GATEWAY-TCP) features+=("${tcp_features[@]}") ;;
    GATEWAY-UDP) features+=("${udp_features[@]}") ;;
    *) die "profile $p: not claimed by Tollgate (GATEWAY-HTTP, GATEWAY-GRPC, GATEWAY-TLS, GATEWAY-TCP, GATEWAY-UDP)" ;;
  esac
done
features_csv=$(printf '%s\n' "${features[@]}" | sort -u | paste -sd, -)
profiles_csv=$(IFS=,; echo "${profiles[*]}")

# --- the cluster -----------------------------------------------------------------------
started_cluster=0
status=$("$E2E/cluster.sh" status 2>&1 || true)
if [[ $status != *"node agent pid"* ]]; then
  "$E2E/cluster.sh" status >/dev/null 2>&1 && die "a cluster runs without --full; run e2e/cluster.sh down first"
  log "starting e2e/cluster.sh up --full"
  "$E2E/cluster.sh" up --full
  started_cluster=1
fi
eval "$("$E2E/cluster.sh" env)"

# --- builds ----------------------------------------------------------------------------
log "building tollgate and tollgate-proxy (debug) into $CARGO_TARGET_DIR"
(cd "$ROOT" && cargo build -q --locked -p tollgate -p tollgate-proxy)

build_suite

# --- Tollgate --------------------------------------------------------------------------
# shellcheck disable=SC2317 # called as an EXIT trap
cleanup() {
  local rc=$?
  if [[ ${KEEP:-} != 1 ]]; then
    "$E2E/helm.sh" uninstall "$RELEASE" -n "$NS" --wait --timeout 120s >/dev/null 2>&1 || true
    kubectl delete namespace "$NS" --timeout=120s >/dev/null 2>&1 || true
    ((started_cluster)) && "$E2E/cluster.sh" down >/dev/null 2>&1
  fi
  exit "$rc"
}
trap cleanup EXIT

# A namespace left terminating by an earlier run refuses new objects: wait until it is gone.
kubectl wait --for=delete "namespace/$NS" --timeout=180s >/dev/null 2>&1 || true
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "helm install charts/tollgate into $NS (GatewayClass $CLASS)"
"$E2E/helm.sh" upgrade --install "$RELEASE" "$ROOT/charts/tollgate" -n "$NS" \
  --set "gatewayClass.name=$CLASS" --wait --timeout "${TIMEOUT}s" >/dev/null
kubectl -n "$NS" rollout status deploy --timeout "${TIMEOUT}s" >/dev/null

# --- the suite -------------------------------------------------------------------------
version=$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)
mkdir -p "$REPORT_DIR"
args=(
  -test.run '^TestConformance$' -test.v -test.timeout 3h
  -gateway-class "$CLASS"
  -conformance-profiles "$profiles_csv"
  -supported-features "$features_csv"
  -organization tollgate -project tollgate -url https://github.com/tollgate-dev/tollgate
  -version "$version" -contact https://github.com/tollgate-dev/tollgate/issues
  -cleanup-base-resources=true
  # GatewayStaticAddresses: the loopback LoadBalancer assigns free addresses of its pool
  # 127.0.1.0/24 on request and refuses any other (TEST-NET-2 here, never contacted).
  -usable-address 127.0.1.250 -unusable-address 198.51.100.7
)
[[ -n ${CONFORMANCE_SKIP_TESTS:-} ]] && args+=(-skip-tests "$CONFORMANCE_SKIP_TESTS")
[[ ${CONFORMANCE_DEBUG:-} == 1 ]] && args+=(-debug)
report=""
if [[ -n ${CONFORMANCE_RUN_TEST:-} ]]; then
  args+=(-run-test "$CONFORMANCE_RUN_TEST")
else
  report=$REPORT_DIR/tollgate-report.yaml
  args+=(-report-output "$report.tmp")
fi
out=$REPORT_DIR/conformance.log
# The suite deletes its namespaces at the end of a run without waiting for them.
for ns in gateway-conformance-infra gateway-conformance-app-backend gateway-conformance-web-backend; do
  kubectl wait --for=delete "namespace/$ns" --timeout=300s >/dev/null 2>&1 || true
done
log "running $profiles_csv (features: $features_csv); output in $out"
start=$SECONDS
set +e
(cd "$SUITE_DIR" && "$suite_bin" "${args[@]}") >"$out" 2>&1
rc=$?
set -e
log "exit $rc after $((SECONDS - start)) s; $(grep -c -- '^    --- PASS' "$out") passed, $(grep -c -- '^    --- FAIL' "$out") failed, $(grep -c -- '^    --- SKIP' "$out") skipped (tests of features not claimed)"
grep -- '^    --- FAIL' "$out" >&2 || true
cluster_dir=${TOLLGATE_CLUSTER_DIR:-$CACHE_DIR/cluster}
# How the control plane held up under the run: the controller replicas renew their Lease
# every 2 s with a 6 s deadline, so a timed-out renewal means the API server answered late.
# Only this release's pods: the node agent keeps the logs of pods gone, such as the
# controllers of the tests that ran on this cluster before.
controller_logs=()
for uid in $(kubectl -n "$NS" get pods -o jsonpath='{.items[*].metadata.uid}' 2>/dev/null); do
  f=$cluster_dir/node/pods/$uid/logs/controller.log
  [[ -f $f ]] && controller_logs+=("$f")
done
if ((${#controller_logs[@]} > 0)); then
  all=$(cat "${controller_logs[@]}" | sed 's/\x1b\[[0-9;]*m//g') # without colours
  # Rounds slower than the 2 s renew period log their duration (took_ms); the slowest says how
  # close a renewal came to the 6 s deadline.
  # `|| true`: a run without a slow round has no match, which under pipefail ended the script
  # with 1 after a passing suite.
  slowest=$(grep -o 'took_ms[^0-9]*[0-9]*' <<<"$all" | grep -o '[0-9]*$' | sort -n | tail -1 || true)
  log "controller replicas in $NS: $(grep -c 'lease update timed out' <<<"$all") lease renewals timed out, $(grep -c 'slow lease round' <<<"$all") rounds slower than 2 s (slowest ${slowest:-none} ms), $(grep -c 'leadership changed' <<<"$all") leadership changes ($(grep 'leadership changed' <<<"$all" | grep -c 'leading.*false') lost)"
  # The lines themselves, for the cause: which round was slow, by how much, and what followed.
  grep -E 'slow lease round|lease update|leadership changed|taking over the lease' <<<"$all" | tail -20 >&2 || true
fi
if ((rc != 0)); then
  # What a failure needs to be understood, before the cleanup removes it (the cluster's state
  # dir goes with `cluster.sh down`): the objects, the events, the cluster's logs (the node
  # agent's forwarders and probes) and every pod's logs (proxies, controller), by pod UID.
  diag=$REPORT_DIR/diagnostics
  mkdir -p "$diag/pods"
  kubectl get pods,services,endpointslices,gateways,httproutes -A -o wide >"$diag/objects.txt" 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp >"$diag/events.txt" 2>&1 || true
  kubectl get pods -A --no-headers \
    -o custom-columns=UID:.metadata.uid,NAMESPACE:.metadata.namespace,NAME:.metadata.name \
    >"$diag/pods/uids.txt" 2>&1 || true
  cp "$cluster_dir"/*.log "$diag/" 2>/dev/null || true
  for d in "$cluster_dir"/node/pods/*/logs; do
    [[ -d $d ]] && cp -r "$d" "$diag/pods/$(basename "$(dirname "$d")")"
  done
  log "diagnostics (objects, events, cluster and pod logs): $diag"
fi
if [[ -n $report ]]; then
  if [[ -f $report.tmp ]]; then
    mv "$report.tmp" "$report"
    log "report: $report"
  else
    log "the suite wrote no report"
    rc=1
  fi
fi
exit "$rc"
