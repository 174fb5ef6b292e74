# shellcheck shell=bash
# e2e/full-lib.sh — sourced by the tests that run on `e2e/cluster.sh up --full`
# (full-gateway-test.sh, examples-test.sh). Needs E2E, ROOT and the functions log and die.

# require_full_cluster: exports KUBECONFIG for the running cluster; without a node agent
# exits 0 (a skip), or fails under TOLLGATE_REQUIRE_FULL=1 (e2e/test-all.sh). Then builds
# tollgate and tollgate-proxy (debug) into $CARGO_TARGET_DIR, always (a no-op when fresh):
# the pods run these binaries, so they must be this checkout's.
require_full_cluster() {
  local status
  eval "$("$E2E/cluster.sh" env)"
  status=$("$E2E/cluster.sh" status 2>&1 || true)
  if [[ $status != *"node agent pid"* ]]; then
    [[ ${TOLLGATE_REQUIRE_FULL:-} == 1 ]] && die "TOLLGATE_REQUIRE_FULL=1 but no node agent runs"
    log "skipping: no node agent (start the cluster with e2e/cluster.sh up --full)"
    exit 0
  fi
  log "building tollgate and tollgate-proxy (debug) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && cargo build -q --locked -p tollgate -p tollgate-proxy)
}

# lb_address NS GATEWAY TIMEOUT: waits until the Gateway is Programmed and lists a
# LoadBalancer address 127.0.1.N (status lists the ClusterIP until the load balancer has
# assigned one), and prints it.
lb_address() {
  local ns=$1 gw=$2 timeout=$3 a="" deadline
  kubectl -n "$ns" wait --for=condition=Programmed "gateway/$gw" --timeout "${timeout}s" >/dev/null ||
    die "Gateway $ns/$gw not Programmed: $(kubectl -n "$ns" get gateway "$gw" -o jsonpath='{.status.conditions}')"
  deadline=$((SECONDS + timeout))
  until a=$(kubectl -n "$ns" get gateway "$gw" -o jsonpath='{.status.addresses[0].value}') && [[ $a == 127.0.1.* ]]; do
    ((SECONDS < deadline)) || die "Gateway $ns/$gw has address '$a', not 127.0.1.N"
    sleep 0.2
  done
  echo "$a"
}
