#!/usr/bin/env bash
# e2e/chart-test.sh — test the Helm chart charts/tollgate:
#
#   1. e2e/check-crds.sh: the chart's crds/ equals the repository's crds/
#   2. `helm lint --strict`, with the default values and each variant below
#   3. `helm template` renders each variant with the expected kinds
#   4. values.schema.json rejects bad values
#   5. the controller accepts every flag the chart passes (when a built
#      `tollgate` binary is found: $TOLLGATE_BIN, or $CARGO_TARGET_DIR/debug)
#   6. `helm template | kubectl apply --dry-run=server -f -` against the real
#      kube-apiserver of e2e/cluster.sh: the API server validates every object
#      (schemas, RBAC escalation checks, the GatewayClass against its CRD), and
#      must not warn (the namespace warns on the restricted Pod Security level).
#      A running cluster is used as it is; otherwise one is started and
#      stopped again at the end.
#   7. RBAC: the default render's ServiceAccount and RBAC objects are applied
#      for real (release tollgate-chart-test), then `kubectl auth can-i --as`
#      the controller's ServiceAccount checks what it may and may not do.
#   8. provisioning with only that RBAC: the Rust test
#      provision_works_with_only_the_charts_rbac (controller/tests/k8s_provision.rs)
#      impersonates the ServiceAccount (cargo; TOLLGATE_CHART_TEST_CARGO=0 skips).
#   9. the real controller with only that RBAC (when a built `tollgate` binary
#      is found, as in 5): `tollgate controller` with a kubeconfig that
#      impersonates the ServiceAccount must take its Lease, accept a Gateway of
#      its own GatewayClass, provision it and report an address, and log no
#      "forbidden".
#
# Helm comes from e2e/helm.sh (built from its Go module on first use, ~3 min).
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
CHART=$ROOT/charts/tollgate
NS=tollgate-chart-test
SCOPED_NS=("$NS-a" "$NS-b")
WORK=$(mktemp -d)
STARTED_CLUSTER=0
CONTROLLER_PID=""

log() { printf '[chart-test] %s\n' "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

cleanup() {
  if [[ -n $CONTROLLER_PID ]]; then
    kill "$CONTROLLER_PID" 2>/dev/null || true
    wait "$CONTROLLER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  if ((STARTED_CLUSTER)); then
    "$E2E/cluster.sh" down >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

helm() { "$E2E/helm.sh" "$@"; }

# Values variants: name, then `helm --set` arguments.
declare -A VARIANTS=(
  [default]=""
  [scoped]="--set rbac.gatewayNamespaces={${SCOPED_NS[0]},${SCOPED_NS[1]}} --set gatewayClass.create=false --set controller.replicas=1 --set proxy.serviceType=ClusterIP"
  [minimal]="--set metrics.dashboards.enabled=true --set provision.enabled=false --set controller.push.enabled=false --set gatewayClass.name=tollgate-chart-test --set controller.podDisruptionBudget.enabled=false --set controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=kubernetes.io/os --set controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=In --set controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]=linux"
)
# Kinds each variant renders (sorted, with repeats).
declare -A KINDS=(
  [default]="ClusterRole ClusterRoleBinding Deployment GatewayClass PodDisruptionBudget Role RoleBinding Service ServiceAccount"
  [scoped]="ClusterRole ClusterRole ClusterRoleBinding Deployment Role RoleBinding RoleBinding RoleBinding Service ServiceAccount"
  [minimal]="ClusterRole ClusterRoleBinding ConfigMap ConfigMap Deployment GatewayClass Role RoleBinding Service ServiceAccount"
)

render() { # render VARIANT: helm template into $WORK/VARIANT.yaml
  local args
  read -r -a args <<<"${VARIANTS[$1]}"
  helm template tollgate "$CHART" --namespace "$NS" "${args[@]}" >"$WORK/$1.yaml"
}

# --- 1. CRD copy ---------------------------------------------------------------
"$E2E/check-crds.sh"

# --- 2, 3. lint and render ------------------------------------------------------
for v in default scoped minimal; do
  read -r -a args <<<"${VARIANTS[$v]}"
  helm lint --strict --namespace "$NS" "$CHART" "${args[@]}" >"$WORK/lint.txt" 2>&1 ||
    { cat "$WORK/lint.txt" >&2; fail "helm lint ($v)"; }
  render "$v"
  kinds=$(awk '/^kind:/ { print $2 }' "$WORK/$v.yaml" | LC_ALL=C sort | xargs)
  [[ $kinds == "${KINDS[$v]}" ]] || fail "variant $v rendered kinds '$kinds', expected '${KINDS[$v]}'"
  log "lint and render ok: $v ($kinds)"
done
grep -q -- '--proxy-image=ghcr.io/tollgate-dev/tollgate-proxy:' "$WORK/default.yaml" || fail "no --proxy-image"
grep -q -- '--controller-url=https://tollgate-controller.tollgate-chart-test.svc:9443' "$WORK/default.yaml" ||
  fail "unexpected --controller-url"
if grep -q 'kind: PodDisruptionBudget' "$WORK/scoped.yaml"; then fail "PDB with 1 replica"; fi
# The monitors render (their CRDs are not on this cluster; e2e/dashboards-test.sh installs
# them with the CRDs and checks what they select).
helm template tollgate "$CHART" --namespace "$NS" --set metrics.serviceMonitor.enabled=true \
  --set metrics.podMonitor.enabled=true >"$WORK/monitors.yaml"
kinds=$(awk '/^kind: [A-Za-z]*Monitor/ { print $2 }' "$WORK/monitors.yaml" | LC_ALL=C sort | xargs)
[[ $kinds == "PodMonitor ServiceMonitor" ]] || fail "the monitors rendered '$kinds'"
# The controller's tracing flags: none without an endpoint, all three with one.
if grep -q -- '--otlp-endpoint' "$WORK/default.yaml"; then fail "tracing flags without an endpoint"; fi
helm template tollgate "$CHART" --namespace "$NS" \
  --set controller.tracing.otlpEndpoint=http://otel.observability:4318 \
  --set controller.tracing.otlpProtocol=http --set-json controller.tracing.sampling=0.25 >"$WORK/traced.yaml"
for flag in --otlp-endpoint=http://otel.observability:4318 --otlp-protocol=http --trace-sampling=0.25; do
  grep -q -- "- $flag\$" "$WORK/traced.yaml" || fail "controller tracing: no $flag"
done

# --- 4. schema rejections -------------------------------------------------------
for bad in controller.replicas=0 controller.unknown=1 proxy.serviceType=External \
  controller.metricsPort=70000 'rbac.gatewayNamespaces={Not_A_Namespace}' \
  controller.image.pullPolicy=Sometimes metrics.podMonitor.interval=soon 'metrics.podMonitor.gatewayClasses={Bad_Class}' gatewayClass.description="$(printf 'x%.0s' {1..65})" \
  controller.tracing.otlpEndpoint=https://otel:4317 controller.tracing.otlpProtocol=udp \
  'controller.tracing.otlpEndpoint=http://otel:4317 --leader-elect=false'; do
  if helm template tollgate "$CHART" --namespace "$NS" --set "$bad" >/dev/null 2>"$WORK/err.txt"; then
    fail "the schema accepted --set $bad"
  fi
  grep -q "schema" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "--set $bad failed, but not on the schema"; }
done
log "schema rejects bad values ok"

# --- 5. flags the controller knows ---------------------------------------------
bin=${TOLLGATE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/tollgate}
if [[ -x $bin ]]; then
  help=$("$bin" controller --help)
  while read -r flag; do
    grep -q -- "$flag" <<<"$help" || fail "tollgate controller has no $flag (binary $bin)"
  done < <(grep -ho -- ' - --[a-z-]*' "$WORK/default.yaml" "$WORK/traced.yaml" | awk '{ print $2 }' | sort -u)
  log "every controller flag is known to $bin"
else
  log "skip: no tollgate binary at $bin (set TOLLGATE_BIN) to check the controller flags"
fi

# --- 6. server-side validation ---------------------------------------------------
if ! "$E2E/cluster.sh" status >/dev/null 2>&1; then
  log "no cluster running: starting one (stopped at the end)"
  STARTED_CLUSTER=1
  "$E2E/cluster.sh" up
fi
kc() { "$E2E/cluster.sh" kubectl "$@"; }
for ns in "$NS" "${SCOPED_NS[@]}"; do
  kc create namespace "$ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
done
# The restricted Pod Security Standard warns about a violating pod template.
kc label namespace "$NS" --overwrite pod-security.kubernetes.io/warn=restricted >/dev/null
for v in default scoped minimal; do
  kc apply --dry-run=server -f "$WORK/$v.yaml" >"$WORK/apply.txt" 2>&1 ||
    { cat "$WORK/apply.txt" >&2; fail "kubectl apply --dry-run=server ($v)"; }
  if grep -i 'warning' "$WORK/apply.txt" >&2; then fail "warnings from the API server ($v)"; fi
  log "server-side dry run ok: $v ($(grep -c 'server dry run' "$WORK/apply.txt") objects)"
done

# --- 7. RBAC, as the controller ---------------------------------------------------
helm template tollgate-chart-test "$CHART" --namespace "$NS" \
  --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac.yaml"
kc apply --server-side --force-conflicts --field-manager tollgate-chart-test -f "$WORK/rbac.yaml" >/dev/null
SA=system:serviceaccount:$NS:tollgate-chart-test-controller
can() { # can yes|no VERB RESOURCE [kubectl auth can-i flags...]
  local want=$1 got
  shift
  got=$(kc auth can-i --as "$SA" "$@" 2>/dev/null || true)
  [[ $got == "$want" ]] || fail "can-i $* as the controller: got '$got', want '$want'"
}
GW=gateway.networking.k8s.io
for r in gatewayclasses gateways httproutes grpcroutes tlsroutes tcproutes udproutes listenersets referencegrants backendtlspolicies; do
  for verb in get list watch; do can yes "$verb" "$r.$GW" -A; done
  can no update "$r.$GW" -n apps
done
for r in gatewayclasses gateways httproutes grpcroutes tlsroutes tcproutes udproutes listenersets backendtlspolicies; do
  can yes patch "$r.$GW" --subresource=status -n apps
  can yes update "$r.$GW" --subresource=status -n apps
done
can no patch "referencegrants.$GW" --subresource=status -n apps
for verb in get list watch; do can yes "$verb" gatewayparameters.tollgate.dev -A; done
can no update gatewayparameters.tollgate.dev -n apps
for verb in get list watch; do can yes "$verb" xbackendtrafficpolicies.gateway.networking.x-k8s.io -A; done
can yes patch xbackendtrafficpolicies.gateway.networking.x-k8s.io --subresource=status -n apps
for r in ratelimitpolicies authpolicies clientpolicies backendpolicies; do
  for verb in get list watch; do can yes "$verb" "$r.tollgate.dev" -A; done
  can yes patch "$r.tollgate.dev" --subresource=status -n apps
  can no update "$r.tollgate.dev" -n apps
done
for r in secrets configmaps; do can yes get "$r" -A; done
# The optional kinds' CRDs, and no other (a 404 is confirmed against the CRD).
for crd in "tlsroutes.$GW" "tcproutes.$GW" "udproutes.$GW" "listenersets.$GW" "backendtlspolicies.$GW" ratelimitpolicies.tollgate.dev authpolicies.tollgate.dev clientpolicies.tollgate.dev backendpolicies.tollgate.dev gatewayparameters.tollgate.dev xbackendtrafficpolicies.gateway.networking.x-k8s.io; do
  can yes get "customresourcedefinitions.apiextensions.k8s.io/$crd"
done
can no get customresourcedefinitions.apiextensions.k8s.io/widgets.example.com
can no list customresourcedefinitions.apiextensions.k8s.io
can yes update "gateways.$GW" --subresource=finalizers -n apps
for r in services namespaces secrets endpointslices.discovery.k8s.io; do can yes watch "$r" -A; done
for r in serviceaccounts services deployments.apps horizontalpodautoscalers.autoscaling poddisruptionbudgets.policy; do
  for verb in get create patch update delete; do can yes "$verb" "$r" -n apps; done
done
can yes create secrets -n apps
can yes patch secrets -n apps
can no delete secrets -n apps
can yes create events -n apps
can yes create events.events.k8s.io -n apps
can yes create leases.coordination.k8s.io -n "$NS"
can yes update leases.coordination.k8s.io -n "$NS"
can no update leases.coordination.k8s.io -n apps
can no create pods -n apps
can no create clusterroles.rbac.authorization.k8s.io
can no create "gateways.$GW" -n apps
can no delete "httproutes.$GW" -n apps
log "RBAC as the controller ok"

# With rbac.gatewayNamespaces, writes only there (and the CA Secret at home).
helm template tollgate-chart-scoped "$CHART" --namespace "$NS" \
  --set "rbac.gatewayNamespaces={${SCOPED_NS[0]},${SCOPED_NS[1]}}" \
  --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$WORK/rbac-scoped.yaml"
kc apply --server-side --force-conflicts --field-manager tollgate-chart-test -f "$WORK/rbac-scoped.yaml" >/dev/null
SA=system:serviceaccount:$NS:tollgate-chart-scoped-controller
for ns in "${SCOPED_NS[@]}"; do
  can yes create deployments.apps -n "$ns"
  can yes patch services -n "$ns"
  can yes create secrets -n "$ns"
  can yes update "gateways.$GW" --subresource=finalizers -n "$ns"
done
can no create deployments.apps -n apps
can no create secrets -n apps
can no update "gateways.$GW" --subresource=finalizers -n apps
can yes create secrets -n "$NS"
can yes watch secrets -A
can yes watch deployments.apps -n "${SCOPED_NS[0]}"
log "scoped RBAC as the controller ok"

# --- 8. provisioning as the controller ----------------------------------------------
if [[ ${TOLLGATE_CHART_TEST_CARGO:-1} != 0 ]] && command -v cargo >/dev/null; then
  (cd "$ROOT" && KUBECONFIG=$("$E2E/cluster.sh" env | sed -n "s/^export KUBECONFIG=//p") \
    TOLLGATE_PROVISION_AS=system:serviceaccount:$NS:tollgate-chart-test-controller \
    nice cargo test --quiet -p tollgate --test k8s_provision provision_works_with_only_the_charts_rbac -- --ignored \
    >"$WORK/cargo.txt" 2>&1) || { tail -n 40 "$WORK/cargo.txt" >&2; fail "provisioning with the chart's RBAC"; }
  grep -q '1 passed' "$WORK/cargo.txt" || { cat "$WORK/cargo.txt" >&2; fail "the RBAC provisioning test did not run"; }
  log "provisioning with only the chart's RBAC ok"
else
  log "skip: provisioning with the chart's RBAC (no cargo, or TOLLGATE_CHART_TEST_CARGO=0)"
fi

# --- 9. the controller with only the chart's RBAC ------------------------------------
if [[ -x $bin ]]; then
  kubeconfig=$("$E2E/cluster.sh" env | sed -n "s/^export KUBECONFIG=//p")
  # The cluster's admin user, acting as the controller's ServiceAccount.
  awk -v as="system:serviceaccount:$NS:tollgate-chart-test-controller" \
    '{ print } /^    client-key:/ { print "    as: " as }' "$kubeconfig" >"$WORK/kubeconfig"
  grep -q '^    as: system:serviceaccount:' "$WORK/kubeconfig" || fail "could not write an impersonating kubeconfig"
  run=ct$RANDOM
  cat >"$WORK/gateway.yaml" <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: chart-test-$run}
spec: {controllerName: tollgate.dev/chart-test-$run}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: $run, namespace: ${SCOPED_NS[0]}}
spec:
  gatewayClassName: chart-test-$run
  listeners: [{name: http, port: 80, protocol: HTTP}]
YAML
  kc apply -f "$WORK/gateway.yaml" >/dev/null
  RUST_LOG=info "$bin" controller --kubeconfig "$WORK/kubeconfig" --namespace "$NS" \
    --lease-name "chart-test-$run" --metrics-addr 127.0.0.1:0 --provision=true \
    --controller-name "tollgate.dev/chart-test-$run" --proxy-image example.com/tollgate-proxy:test \
    >"$WORK/controller.log" 2>&1 &
  CONTROLLER_PID=$!
  ok=0
  for _ in $(seq 1 60); do
    accepted=$(kc get gateway -n "${SCOPED_NS[0]}" "$run" \
      -o jsonpath='{.status.conditions[?(@.type=="Accepted")].status} {.status.addresses[0].value}' 2>/dev/null || true)
    if [[ $accepted == "True "?* ]] && kc get deployment -n "${SCOPED_NS[0]}" "$run-tollgate" >/dev/null 2>&1; then
      ok=1
      break
    fi
    kill -0 "$CONTROLLER_PID" 2>/dev/null || break
    sleep 0.5
  done
  if ((!ok)); then
    tail -n 30 "$WORK/controller.log" >&2
    fail "the controller with the chart's RBAC did not accept and provision Gateway ${SCOPED_NS[0]}/$run"
  fi
  if grep -i 'forbidden' "$WORK/controller.log" >&2; then fail "the controller was forbidden something"; fi
  kill "$CONTROLLER_PID" 2>/dev/null || true
  wait "$CONTROLLER_PID" 2>/dev/null || true
  CONTROLLER_PID=""
  kc delete -f "$WORK/gateway.yaml" --wait=false >/dev/null
  log "the controller with only the chart's RBAC accepted and provisioned a Gateway"
else
  log "skip: no tollgate binary at $bin to run the controller with the chart's RBAC"
fi
log "PASS"
