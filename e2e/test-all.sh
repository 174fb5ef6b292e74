#!/usr/bin/env bash
# Every test of Tollgate: formatting, lints, unit tests, socket-level proxy tests, the
# `tollgate run` end-to-end tests, and the controller tests on a real kube-apiserver
# (e2e/cluster.sh: etcd + kube-apiserver built from Go modules; ~9 min cold, seconds warm,
# stopped again on exit), and, as root, the node agent's tests on `e2e/cluster.sh up --full`
# (kube-controller-manager and pods run as local processes in network namespaces), the Helm
# test, every example served on that cluster, the docs run as written (Flux's walk-through with
# Flux's own controllers), and the Gateway API conformance suite
# (GATEWAY-HTTP, GATEWAY-GRPC and GATEWAY-TLS) there. Works on a fresh machine with Rust, Go and
# Node >= 20 with npm (the gRPC-Web test's client; Debian 12's nodejs is 18, too old) installed;
# builds are cached under $HOME/.cache/tollgate (never required).
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

step "controller/gateway-types/regen.sh --check (the generated Gateway API types match the CRDs; kopium cached, minutes the first time)"
controller/gateway-types/regen.sh --check

step "e2e/run check (every step of this script can be run alone through e2e/run)"
e2e/run check >/dev/null

if ! command -v redis-server >/dev/null 2>&1; then
  step "installing redis-server (Debian) for the rate-limit tests"
  if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q redis-server >/dev/null ||
    { $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q redis-server >/dev/null; }
fi
# The tests start their own redis-server on loopback; a system one is not needed.

if ! command -v lua5.1 >/dev/null 2>&1 && ! command -v lua >/dev/null 2>&1; then
  step "installing lua5.1 (Debian) for the Argo CD health-check tests"
  if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q lua5.1 >/dev/null ||
    { $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q lua5.1 >/dev/null; }
fi

step "e2e/cluster.sh up (real etcd + kube-apiserver for the k8s_* tests)"
PREBUILD_PID=""
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  [[ -n $PREBUILD_PID ]] && kill -- "-$PREBUILD_PID" 2>/dev/null
  e2e/cluster.sh down || true
}
trap cleanup EXIT
e2e/cluster.sh up
eval "$(e2e/cluster.sh env)"

step "e2e/kstatus.sh build (kstatus-check for k8s_kstatus; cached, minutes the first time)"
e2e/kstatus.sh build >/dev/null
step "e2e/extauthz.sh build (extauthz-grpc, Envoy ext_authz service for the policy tests; cached, ~35 s cold)"
e2e/extauthz.sh build >/dev/null

step "e2e/oidc-provider.sh build (the OpenID Provider of proxy/tests/oidc; cached, about 25 s the first time)"
e2e/oidc-provider.sh build >/dev/null

step "cargo test"
cargo test --workspace --locked

step "e2e/tracing-test.sh (OpenTelemetry tracing of tollgate run against a real OpenTelemetry Collector built from Go modules, both OTLP protocols; the collector cached, minutes the first time)"
e2e/tracing-test.sh

step "e2e/grpc-web-test.sh (gRPC-Web through tollgate run with real npm clients, connect-web and connect-node, to a grpc-go server; npm ci from the lock file, seconds)"
e2e/grpc-web-test.sh

if [[ $(id -u) -eq 0 ]]; then
  # The Go builds the loopback-cluster steps below need (kube-controller-manager, echo-basic,
  # CoreDNS, the node agent, Flux's controllers, the conformance suite, Prometheus and the
  # Prometheus Operator's CRDs for the dashboards test: about 25 minutes of one core on a fresh
  # machine plus Prometheus's (e2e/prometheus.sh), nothing once cached) run beside the fuzz
  # targets, which keep one core busy, and the chart test, instead of one after another later.
  PREBUILD_LOG=$(mktemp /tmp/tollgate-prebuild.XXXXXX)
  step "building the loopback cluster's parts in the background (log: $PREBUILD_LOG)"
  setsid bash -c 'e2e/cluster.sh build --full && e2e/flux.sh build && e2e/conformance.sh --build &&
    e2e/prometheus.sh build && e2e/prometheus.sh crds' >"$PREBUILD_LOG" 2>&1 &
  PREBUILD_PID=$!
fi

step "e2e/fuzz.sh 30 (every fuzz target 30 s from its seeds; docs/fuzzing.md)"
e2e/fuzz.sh 30

step "e2e/chart-test.sh (helm lint/template, server-side dry run, RBAC as the chart grants it)"
TOLLGATE_BIN="$CARGO_TARGET_DIR/debug/tollgate" e2e/chart-test.sh

# Last, so that the tests above keep running on the bare control plane they were written for.
if [[ $(id -u) -eq 0 ]]; then
  # A fresh control plane: the tests above leave their namespaces (Deployments, Gateways,
  # hundreds of routes) behind, which kube-controller-manager and the node agent would
  # otherwise turn into pods restarting for the rest of the run, loading the 2-core host
  # under the timing-sensitive tests below (the conformance run of 2026-12-02 that failed
  # had ten such pods restarting every two seconds and controller lease renewals timing out).
  step "waiting for the background builds"
  if ! wait "$PREBUILD_PID"; then
    cat "$PREBUILD_LOG" >&2
    echo "the background builds failed (above)" >&2
    exit 1
  fi
  PREBUILD_PID=""
  step "e2e/cluster.sh down, then up --full (a fresh control plane plus kube-controller-manager, the pod bridge and the node agent; minutes cold) and the node-agent tests"
  e2e/cluster.sh down
  e2e/cluster.sh up --full
  TOLLGATE_REQUIRE_FULL=1 cargo test -p tollgate-node-agent --locked --test cluster
  step "e2e/full-gateway-test.sh (helm install of the chart on the loopback cluster; a Gateway served through its provisioned proxy pod)"
  TOLLGATE_REQUIRE_FULL=1 e2e/full-gateway-test.sh
  step "e2e/examples-test.sh (every example applied with kubectl, served through its Gateway's address, kstatus Current)"
  TOLLGATE_REQUIRE_FULL=1 e2e/examples-test.sh
  step "e2e/dashboards-test.sh (the chart's ServiceMonitor, PodMonitor and Grafana dashboards: Prometheus, built from its Go module, scrapes the controller and a proxy pod; every panel query returns data)"
  TOLLGATE_REQUIRE_FULL=1 e2e/dashboards-test.sh
  step "e2e/docs-test.sh (the README's tour on this machine, docs/getting-started.md on the loopback cluster, as a user pastes them)"
  TOLLGATE_REQUIRE_FULL=1 e2e/docs-test.sh
  step "e2e/flux-test.sh (docs/gitops.md's Flux section: Flux's source-controller and kustomize-controller, built from Go modules, syncing a Git repository served on loopback; cached, about 8 minutes the first time)"
  TOLLGATE_REQUIRE_FULL=1 e2e/flux-test.sh
  step "e2e/conformance.sh (GATEWAY-HTTP, -GRPC, -TLS, -TCP and -UDP; the Gateway API conformance suite; reports to a temporary dir)"
  CONFORMANCE_REPORT_DIR=$(mktemp -d /tmp/tollgate-conformance.XXXXXX) e2e/conformance.sh
else
  step "skipping the node-agent tests: up --full needs root (network namespaces, a bridge)"
fi
