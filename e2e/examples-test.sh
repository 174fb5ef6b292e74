#!/usr/bin/env bash
# e2e/examples-test.sh — every example of examples/ applied with kubectl to the loopback
# cluster (`e2e/cluster.sh up --full`) under the Helm-installed controller, each in a
# namespace of its own, and requests through each Gateway's LoadBalancer address
# (127.0.1.N) answered as the example's README says; then kstatus (as Flux computes it)
# reads every applied Gateway API and policy object as Current.
#
# The examples are written for `tollgate run`. On a cluster, the test applies them as the
# docs/kubernetes.md tells users to (e2e/examples-to-cluster.py):
# without the GatewayClass (the chart creates `tollgate`), the EndpointSlices written by
# hand and the Gateways' pinned 127.0.0.1 address; the demo backend's Services select the
# demo backend pod (`tollgate demo-backend`), and the introspection endpoint is that
# Service instead of 127.0.0.1:9080.
#
# examples/oidc logs browsers in at an OpenID Provider: the test starts the one of
# e2e/oidc-provider.sh on the host, listening on the pod network's bridge address 10.244.0.1
# (the host as the pods see it: 127.0.0.1 in a pod is the pod's own loopback; nothing routes
# the bridge off the machine), and patches only the policy's issuer (the README's
# http://127.0.0.1:9998) to that provider's URL. e2e/oidc-browser.py then logs in through the
# Gateway's address as a browser would.
#
# Needs a running `up --full` cluster (skips, exit 0, without one; fails then under
# TOLLGATE_REQUIRE_FULL=1). Builds tollgate and tollgate-proxy (debug), kstatus-check and the
# OpenID Provider.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}
RELEASE=tg-examples
SYSTEM_NS=tg-examples-system
TIMEOUT=${TOLLGATE_EXAMPLES_TIMEOUT:-120}
EXAMPLES=(quickstart https tls tcp udp listenerset traffic-split grpc rate-limit llm-tokens api-key basic-auth jwt introspection ext-authz oidc mtls client-ip resilience backend-tls gateway-parameters gitops)

log() { printf '[examples %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

# shellcheck source=e2e/full-lib.sh
source "$E2E/full-lib.sh"
require_full_cluster
kstatus_bin=$("$E2E/kstatus.sh" path)
oidc_provider_bin=$("$E2E/oidc-provider.sh" path)
# The host's address on the pod network (e2e/full.sh's BRIDGE_IP): pods reach the host there.
HOST_FOR_PODS=10.244.0.1
# What examples/oidc names as its issuer; replaced by the provider started below.
OIDC_EXAMPLE_ISSUER=http://127.0.0.1:9998
oidc_pid=""

ns_of() { [[ $1 == gitops ]] && echo tollgate-demo || echo "tg-ex-$1"; }

# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  local rc=$? ex
  if ((rc != 0)); then
    for ex in "${EXAMPLES[@]}"; do
      kubectl -n "$(ns_of "$ex")" get gateway,listenerset,httproute,grpcroute,tlsroute,tcproute,udproute,pods -o wide >&2 2>/dev/null || true
    done
    kubectl -n "$SYSTEM_NS" logs deploy/$RELEASE-tollgate-controller --tail 30 >&2 || true
  fi
  [[ -z $oidc_pid ]] || kill "$oidc_pid" 2>/dev/null || true
  if [[ ${KEEP:-} != 1 ]]; then
    for ex in "${EXAMPLES[@]}"; do
      kubectl delete namespace "$(ns_of "$ex")" --wait=false >/dev/null 2>&1 || true
    done
    for ex in "${EXAMPLES[@]}"; do
      kubectl wait --for=delete "namespace/$(ns_of "$ex")" --timeout=120s >/dev/null 2>&1 || true
    done
    "$E2E/helm.sh" uninstall "$RELEASE" -n "$SYSTEM_NS" --wait --timeout 120s >/dev/null 2>&1 || true
    kubectl delete namespace "$SYSTEM_NS" --timeout=120s >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT

# Namespaces an earlier run left terminating refuse new objects: wait until they are gone.
for ex in "${EXAMPLES[@]}"; do
  kubectl wait --for=delete "namespace/$(ns_of "$ex")" --timeout=180s >/dev/null 2>&1 || true
done
kubectl wait --for=delete "namespace/$SYSTEM_NS" --timeout=180s >/dev/null 2>&1 || true
kubectl create namespace "$SYSTEM_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "helm install charts/tollgate into $SYSTEM_NS"
"$E2E/helm.sh" upgrade --install "$RELEASE" "$ROOT/charts/tollgate" -n "$SYSTEM_NS" \
  --set controller.replicas=1 --wait --timeout "${TIMEOUT}s" >/dev/null

applied=$(mktemp /tmp/tollgate-examples.XXXXXX)

# The OpenID Provider of examples/oidc, on a free port of the bridge address; it prints its
# issuer URL once it accepts connections.
"$oidc_provider_bin" -listen "$HOST_FOR_PODS:0" -client shop -secret shop-secret >"$applied.oidc.out" 2>&1 &
oidc_pid=$!
for _ in $(seq 1 100); do
  oidc_issuer=$(sed -n 's/^issuer //p' "$applied.oidc.out")
  [[ -n $oidc_issuer ]] && break
  kill -0 "$oidc_pid" 2>/dev/null || die "the OpenID Provider exited: $(cat "$applied.oidc.out")"
  sleep 0.1
done
[[ -n $oidc_issuer ]] || die "the OpenID Provider printed no issuer: $(cat "$applied.oidc.out")"
log "OpenID Provider for examples/oidc: $oidc_issuer"

for ex in "${EXAMPLES[@]}"; do
  ns=$(ns_of "$ex")
  dir=$ROOT/examples/$ex
  [[ $ex == gitops ]] && dir=$ROOT/examples/gitops/app
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  python3 "$E2E/examples-to-cluster.py" --namespace "$ns" "$dir" >"$applied.$ex.yaml"
  if [[ $ex == oidc ]]; then
    grep -q "issuer: $OIDC_EXAMPLE_ISSUER\$" "$applied.$ex.yaml" || die "examples/oidc names no issuer $OIDC_EXAMPLE_ISSUER"
    sed -i "s#issuer: $OIDC_EXAMPLE_ISSUER\$#issuer: $oidc_issuer#" "$applied.$ex.yaml"
  fi
  kubectl apply --server-side -f "$applied.$ex.yaml" >/dev/null
  log "applied examples/$ex into $ns ($(grep -c '^kind:' "$applied.$ex.yaml") objects)"
done

# addr EXAMPLE GATEWAY: the Gateway's LoadBalancer address, once it is Programmed.
addr() { lb_address "$(ns_of "$1")" "$2" "$TIMEOUT"; }

# expect WHAT WANT CMD...: runs CMD (a curl printing what is compared) until its output
# contains WANT, failing after TIMEOUT with the last output.
expect() {
  local what=$1 want=$2 got="" deadline=$((SECONDS + TIMEOUT))
  shift 2
  until got=$("$@" 2>&1) && [[ $got == *"$want"* ]]; do
    ((SECONDS < deadline)) || die "$what: wanted '$want', got: ${got:0:400}"
    sleep 0.5
  done
  log "ok: $what"
}
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@"; }
body() { curl -s --max-time 5 "$@"; }
heads() { curl -s -o /dev/null -D - --max-time 5 "$@"; }

# --- quickstart ------------------------------------------------------------------------
a=$(addr quickstart quickstart)
expect "quickstart: / answered by the demo backend" '"path": "/hello"' body "http://$a:8080/hello"
expect "quickstart: /old redirects to /v2" 'location: http://' heads "http://$a:8080/old"
expect "quickstart: /v2/x rewritten to /x with x-api-version" '"x-api-version": "2"' body "http://$a:8080/v2/x"
[[ $(body "http://$a:8080/v2/x") == *'"path": "/x"'* ]] || die "quickstart: /v2/x not rewritten to /x"

# --- https -----------------------------------------------------------------------------
a=$(addr https secure)
expect "https: TLS with the demo certificate" '"host": "app.example.test' body \
  --cacert "$ROOT/examples/https/demo-ca.pem" --resolve "app.example.test:8443:$a" https://app.example.test:8443/
expect "https: plain HTTP redirected to https" 'https://app.example.test:8443/x' heads \
  -H 'Host: app.example.test' "http://$a:8081/x"

# --- tls -------------------------------------------------------------------------------
a=$(addr tls tls)
tls_ca=(--cacert "$ROOT/examples/tls/demo-ca.pem")
expect "tls: terminated at the gateway, bytes copied to the echo backend" '"host": "terminate.example.test:9443"' body \
  "${tls_ca[@]}" --resolve "terminate.example.test:9443:$a" https://terminate.example.test:9443/hello
[[ $(body "${tls_ca[@]}" --resolve "terminate.example.test:9443:$a" https://terminate.example.test:9443/hello) != *x-forwarded-proto* ]] ||
  die "tls: the terminated stream went through HTTP processing (x-forwarded-proto present)"
expect "tls: passed through to the HTTPS listener of the proxy pod" '"x-forwarded-proto": "https"' body \
  "${tls_ca[@]}" --resolve "passthrough.example.test:9443:$a" https://passthrough.example.test:9443/hello
if body "${tls_ca[@]}" --resolve "other.example.test:9443:$a" https://other.example.test:9443/ >/dev/null; then
  die "tls: an SNI no route takes was answered"
fi
log "ok: tls: an SNI no route takes is closed"

# --- listenerset -----------------------------------------------------------------------
a=$(addr listenerset shared)
expect "listenerset: the Gateway's own listener" '"host": "www.example.test' body \
  -H 'Host: www.example.test' "http://$a:8080/"
expect "listenerset: team-a's listener on the Gateway's port" '"x-served-by": "team-a"' body \
  -H 'Host: api.example.test' "http://$a:8080/v1/items"
expect "listenerset: a port only team-a has, exposed by the Gateway's Service" '"x-served-by": "team-a"' body \
  "http://$a:8081/v1/items"
[[ $(code -H 'Host: api.example.test' "http://$a:8080/") == 404 ]] ||
  die "listenerset: the Gateway's route answered on team-a's listener"
sets=$(kubectl -n "$(ns_of listenerset)" get gateway shared -o jsonpath='{.status.attachedListenerSets}')
[[ $sets == 1 ]] || die "listenerset: Gateway status.attachedListenerSets is '$sets', want 1"
log "ok: listenerset: the Gateway counts 1 attached ListenerSet"

# --- tcp -------------------------------------------------------------------------------
a=$(addr tcp tcp)
expect "tcp: bytes copied to the echo backend" '"path": "/hello"' body "http://$a:9000/hello"
[[ $(body "http://$a:9000/hello") != *x-forwarded* ]] ||
  die "tcp: the stream went through HTTP processing (x-forwarded-* present)"
log "ok: tcp: no HTTP processing on a TCP listener"

# --- udp -------------------------------------------------------------------------------
# udp_ask ADDR PORT TEXT: one datagram, the answer printed (empty after 2 s without one).
udp_ask() {
  python3 - "$@" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recv(65536).decode())
except socket.timeout:
    pass
PY
}
a=$(addr udp udp)
expect "udp: a datagram answered by the demo backend through the gateway" '"text": "hello udp"' udp_ask "$a" 5300 "hello udp"

# --- traffic-split ---------------------------------------------------------------------
a=$(addr traffic-split split)
expect "traffic-split: x-canary: always goes to v2" '"x-version": "v2"' body -H 'x-canary: always' "http://$a:8082/"
expect "traffic-split: the split serves v1" '"x-version": "v1"' body "http://$a:8082/"

# --- grpc ------------------------------------------------------------------------------
a=$(addr grpc grpc)
expect "grpc: a call reaches the backend over HTTP/2" '"path": "/helloworld.Greeter/SayHello"' body \
  --http2-prior-knowledge -X POST -H 'content-type: application/grpc' "http://$a:8083/helloworld.Greeter/SayHello"
expect "grpc: a method without a route is UNIMPLEMENTED" 'grpc-status: 12' heads \
  --http2-prior-knowledge -X POST -H 'content-type: application/grpc' "http://$a:8083/helloworld.Greeter/SayGoodbye"
expect "grpc: a browser's preflight from the annotation's origin is answered" \
  'access-control-allow-origin: http://localhost:3000' heads -X OPTIONS -H 'origin: http://localhost:3000' \
  -H 'access-control-request-method: POST' "http://$a:8083/helloworld.Greeter/SayHello"

# --- rate-limit ------------------------------------------------------------------------
a=$(addr rate-limit rate-limit)
expect "rate-limit: /api answers under the policy" 'x-ratelimit-limit: 3' heads -H 'x-client-id: carol' "http://$a:8084/api"
# Counted once each, never retried: a retry would spend the counters it checks.
alice=$(for _ in 1 2 3 4; do code -H 'x-client-id: alice' "http://$a:8084/api"; echo -n ' '; done)
[[ $alice == '200 200 200 429 ' ]] || die "rate-limit: alice's 4 requests answered '$alice', not '200 200 200 429'"
log "ok: rate-limit: alice's 4th request is refused"
bob=$(heads -H 'x-client-id: bob' "http://$a:8084/api")
[[ $bob == *'x-ratelimit-remaining: 2'* ]] || die "rate-limit: bob's first request: ${bob:0:400}"
log "ok: rate-limit: bob has a counter of his own"

# --- llm-tokens ------------------------------------------------------------------------
a=$(addr llm-tokens llm-tokens)
expect "llm-tokens: /v1 answers with the tokens it used" 'x-tokens-used: 400' heads -H 'x-user: carol' "http://$a:8090/v1/chat/completions"
# 400 tokens an answer, 1,000 a minute: the third crosses the limit, the fourth is refused.
alice=$(for _ in 1 2 3 4; do code -H 'x-user: alice' "http://$a:8090/v1/chat/completions"; echo -n ' '; done)
[[ $alice == '200 200 200 429 ' ]] || die "llm-tokens: alice's 4 requests answered '$alice', not '200 200 200 429'"
log "ok: llm-tokens: the request after the one that crossed the budget is refused"
# The shadow limit on prompt bytes (1,000 a minute) never refuses.
bob=$(for _ in 1 2; do head -c 600 /dev/zero | tr '\0' x | code -H 'x-user: bob' --data-binary @- "http://$a:8090/v1/chat/completions"; echo -n ' '; done)
[[ $bob == '200 200 ' ]] || die "llm-tokens: bob's prompts over the shadow limit answered '$bob', not '200 200'"
log "ok: llm-tokens: the shadow limit never refuses"

# --- api-key ---------------------------------------------------------------------------
a=$(addr api-key api-key)
expect "api-key: no key is refused" '401' code "http://$a:8085/orders"
expect "api-key: carol's key (Secret without the credential label) is refused" '401' code -H 'X-API-Key: carol-demo-key' "http://$a:8085/orders"
expect "api-key: alice's key passes, X-User set" '"x-user": "alice"' body -H 'X-API-Key: alice-demo-key' "http://$a:8085/orders"
expect "api-key: bob may not call /admin" '403' code -H 'X-API-Key: bob-demo-key' "http://$a:8085/admin/stats"

# --- basic-auth ------------------------------------------------------------------------
a=$(addr basic-auth basic-auth)
expect "basic-auth: no password is refused with the Basic challenge" 'www-authenticate: Basic realm="tollgate"' heads "http://$a:8090/users"
expect "basic-auth: a wrong password is refused" '401' code -u alice:wrong "http://$a:8090/users"
expect "basic-auth: alice (bcrypt) passes, X-User set" '"x-user": "alice"' body -u alice:alice-password "http://$a:8090/users"
expect "basic-auth: carol (support) may not write" '403' code -u carol:carol-password -X DELETE "http://$a:8090/users/7"
expect "basic-auth: bob (SHA-512 crypt, ops) may" '200' code -u bob:bob-password -X DELETE "http://$a:8090/users/7"

# --- jwt -------------------------------------------------------------------------------
a=$(addr jwt jwt)
token=$(sed -n 's/^TOKEN=//p' "$ROOT/examples/jwt/README.md")
expired=$(sed -n 's/^EXPIRED=//p' "$ROOT/examples/jwt/README.md")
[[ -n $token && -n $expired ]] || die "no TOKEN/EXPIRED in examples/jwt/README.md"
expect "jwt: no token is refused" '401' code "http://$a:8086/me"
expect "jwt: the README's token passes, X-User from sub" '"x-user": "alice"' body -H "Authorization: Bearer $token" -H 'X-User: root' "http://$a:8086/me"
expect "jwt: the expired token is refused" '401' code -H "Authorization: Bearer $expired" "http://$a:8086/me"

# --- introspection ---------------------------------------------------------------------
a=$(addr introspection introspection)
expect "introspection: no token is refused" '401' code "http://$a:8087/accounts"
expect "introspection: an unknown token is refused" '401' code -H 'Authorization: Bearer not-a-token' "http://$a:8087/accounts"
expect "introspection: alice's token passes (answered by the demo endpoint in the cluster)" '"x-user": "alice"' body \
  -H 'Authorization: Bearer demo-token-alice' "http://$a:8087/accounts"
expect "introspection: only admins on /admin" '403' code -H 'Authorization: Bearer demo-token-alice' "http://$a:8087/admin/users"
expect "introspection: the admin token on /admin" '200' code -H 'Authorization: Bearer demo-token-admin' "http://$a:8087/admin/users"

# --- ext-authz -------------------------------------------------------------------------
a=$(addr ext-authz ext-authz)
expect "ext-authz: no token: the service's 401" '401' code "http://$a:8092/orders"
expect "ext-authz: alice passes, X-Auth-User from the service (the demo backend pod)" '"x-auth-user": "alice"' body \
  -H 'Authorization: Bearer demo-token-alice' "http://$a:8092/orders"
expect "ext-authz: the service's 403 on /admin" '403' code -H 'Authorization: Bearer demo-token-alice' "http://$a:8092/admin/users"
expect "ext-authz: the admin token on /admin" '200' code -H 'Authorization: Bearer demo-token-admin' "http://$a:8092/admin/users"

# --- oidc ------------------------------------------------------------------------------
# The route answers 401 to an API client once the policy is served (before, the backend
# answers 200); then one scripted login, not retried: any step failing fails the test.
a=$(addr oidc oidc)
expect "oidc: the policy is served (an API client without a session gets 401)" '401' code "http://$a:8090/orders"
python3 "$E2E/oidc-browser.py" example "http://$a:8090/orders" "$oidc_issuer" ||
  die "oidc: the login through $oidc_issuer failed (provider log: $(tail -5 "$applied.oidc.out"))"
log "ok: oidc: logged in through the provider, served with the identity, logged out"

# --- mtls ------------------------------------------------------------------------------
a=$(addr mtls mtls)
expect "mtls: the client certificate's identity goes upstream" '"x-client-cn": "alice"' body \
  --cacert "$ROOT/examples/mtls/demo-ca.pem" --cert "$ROOT/examples/mtls/client.crt" --key "$ROOT/examples/mtls/client.key" \
  --resolve "api.example.test:8444:$a" https://api.example.test:8444/whoami
# The README promises no HTTP answer at all (the handshake is refused): curl's code is 000.
out=$(curl -s --max-time 5 --cacert "$ROOT/examples/mtls/demo-ca.pem" --resolve "api.example.test:8444:$a" \
  -o /dev/null -w '%{http_code}' https://api.example.test:8444/whoami 2>/dev/null || true)
[[ $out == 000 ]] || die "mtls: a client without a certificate got an HTTP answer ($out)"
log "ok: mtls: no certificate, no answer"

# --- client-ip -------------------------------------------------------------------------
# The test plays the balancer the ClientPolicy trusts (its network, 127.0.0.0/8, in X-Forwarded-For). The 403
# waits for the AuthPolicy; then, until the ClientPolicy is served, the office address is
# not the client, so the 200 waits for it.
a=$(addr client-ip client-ip)
expect "client-ip: an address outside the office networks is refused on /admin" '403' code -H 'X-Forwarded-For: 203.0.113.7' "http://$a:8088/admin"
expect "client-ip: an office address behind the balancer reaches /admin" '200' code -H 'X-Forwarded-For: 10.1.2.3' "http://$a:8088/admin"
expect "client-ip: an office address claimed left of the balancer's entry is refused" '403' code \
  -H 'X-Forwarded-For: 10.1.2.3, 203.0.113.7' "http://$a:8088/admin"
expect "client-ip: answers compressed in the coding the client ranks highest" 'content-encoding: br' heads \
  -H 'Accept-Encoding: gzip, br' "http://$a:8088/"

# --- resilience ------------------------------------------------------------------------
# On a cluster the endpoints are the demo backend's pods (no dead one): the route with its
# retry rule, the BackendPolicy and the XBackendTrafficPolicy are served.
a=$(addr resilience resilience)
expect "resilience: orders answers through the retry rule and BackendPolicy" '200' code "http://$a:8089/orders/1"

# --- backend-tls -----------------------------------------------------------------------
# The TLS backend is the proxy pod's own HTTPS listener (9446), which admits only the
# gateway's client certificate and names its CN upstream.
a=$(addr backend-tls backend-tls)
expect "backend-tls: verified TLS to the backend, the gateway's certificate presented" '"x-client-cn": "alice"' body \
  "http://$a:8097/hello"
expect "backend-tls: a backend certificate for another name is refused" '502' code "http://$a:8097/wrong-name"

# --- gateway-parameters ----------------------------------------------------------------
# The proxy of Gateway `scaled` runs as its GatewayParameters say: an autoscaler, a budget,
# the memory limit on the container.
a=$(addr gateway-parameters scaled)
gp_ns=$(ns_of gateway-parameters)
expect "gateway-parameters: the route is served" '"path": "/params"' body "http://$a:8093/params"
expect "gateway-parameters: the autoscaler is provisioned (2 to 6 on CPU)" '2 6 70' kubectl -n "$gp_ns" get hpa scaled-tollgate \
  -o 'jsonpath={.spec.minReplicas} {.spec.maxReplicas} {.spec.metrics[0].resource.target.averageUtilization}'
expect "gateway-parameters: the disruption budget is provisioned" '1' kubectl -n "$gp_ns" get pdb scaled-tollgate \
  -o 'jsonpath={.spec.minAvailable}'
expect "gateway-parameters: the container has the parameters' memory limit" '256Mi' kubectl -n "$gp_ns" get deployment \
  scaled-tollgate -o 'jsonpath={.spec.template.spec.containers[0].resources.limits.memory}'

# --- gitops (the app the Argo CD Application and Flux Kustomization sync) ---------------
a=$(addr gitops shop)
expect "gitops: /orders without a key is refused" '401' code "http://$a/orders"
expect "gitops: /orders with the demo key reaches the backend" '200' code -H 'X-API-Key: demo-client-key' "http://$a/orders"
expect "gitops: the backend (agnhost netexec, a stand-in here) answers" 'NOW: ' body \
  -H 'X-API-Key: demo-client-key' "http://$a/orders"

# --- kstatus ---------------------------------------------------------------------------
# Every Gateway API and policy object applied reads Current, as Flux's health checks see it.
checked=0
for ex in "${EXAMPLES[@]}"; do
  ns=$(ns_of "$ex")
  while read -r kind api name; do
    [[ -n $kind ]] || continue
    "$kstatus_bin" --kubeconfig "$KUBECONFIG" --namespace "$ns" --name "$name" --kind "$kind" \
      --api-version "$api" --want Current --timeout 60s >/dev/null ||
      die "kstatus: $kind $ns/$name is not Current"
    checked=$((checked + 1))
  done < <(python3 "$E2E/examples-to-cluster.py" --namespace "$ns" --kstatus-resources "$applied.$ex.yaml")
done
log "ok: kstatus reads all $checked Gateways, routes and policies of the examples as Current"
log "PASS: every example served through its Gateway's address on the loopback cluster"
