#!/usr/bin/env bash
# e2e/flux-test.sh — GitOps with the real thing: Flux's source-controller and
# kustomize-controller (built from their Go modules by e2e/flux.sh) sync a Git repository
# served over HTTP on loopback (`git http-backend`, e2e/git-http-server.py) into the loopback
# cluster (`e2e/cluster.sh up --full`) under the Helm-installed Tollgate, as the section
# "Flux, step by step" of docs/gitops.md tells a user: the test runs that section's shell
# blocks as written, in one shell, and compares the output blocks that follow them
# (e2e/doc-blocks.py, with the conventions of e2e/docs-test.sh).
# What the page walks through: a commit adding a route and a RateLimitPolicy is applied and
# served (the Kustomization Ready, its health check on the policy Current, the limit
# answering 429); a commit with a policy Tollgate rejects fails the health check (Ready=False
# naming the policy, the policy Stalled with its message) while the last valid version
# keeps serving; `git revert` recovers.
#
# The controllers run as processes on the host with the cluster's kubeconfig ($KUBECONFIG; not
# as pods): metrics and health on free 127.0.0.1 ports, source-controller's artifact server on
# another, which kustomize-controller fetches from. The Flux CRDs (every kind of
# source.toolkit.fluxcd.io and kustomize.toolkit.fluxcd.io) are applied server-side and left
# installed. Tollgate is release tg-flux in namespace tg-flux-system; the page's objects are
# in flux-system and shop, which must not exist beforehand (the test waits for ones an
# earlier run left terminating).
#
# Needs a running `up --full` cluster (skips, exit 0, without one; fails then under
# TOLLGATE_REQUIRE_FULL=1) and git. Builds tollgate and tollgate-proxy (debug) and Flux's two
# controllers (cached; about 8 minutes cold, see e2e/flux.sh). KEEP=1 leaves everything
# running for a look (the controllers' logs are in the work directory it prints).
# Measured here (2 cores shared with other builds; Flux and Tollgate built): 41 s, of which the
# page's blocks 25 s.
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}/target}
RELEASE=tg-flux
SYSTEM_NS=tg-flux-system
PAGE=$ROOT/docs/gitops.md
SECTION="Flux, step by step"
TIMEOUT=${TOLLGATE_FLUX_TIMEOUT:-180}

log() { printf '[flux-test %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

# shellcheck source=e2e/full-lib.sh
source "$E2E/full-lib.sh"
require_full_cluster
command -v git >/dev/null || die "git is required (apt-get install git)"
flux=$("$E2E/flux.sh" build) || die "e2e/flux.sh build failed"
mapfile -t flux <<<"$flux"
SOURCE_CONTROLLER=${flux[0]}
KUSTOMIZE_CONTROLLER=${flux[1]}
FLUX_CRDS=${flux[2]}

WORK=$(mktemp -d /tmp/tollgate-flux-test.XXXXXX)
started=0
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  local rc=$? pid
  if ((rc != 0)); then
    kubectl -n flux-system get gitrepository,kustomization -o wide >&2 2>/dev/null || true
    kubectl -n flux-system get kustomization shop -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 2>/dev/null || true
    kubectl -n shop get pods,gateway,httproute,ratelimitpolicy -o wide >&2 2>/dev/null || true
    for f in source-controller kustomize-controller git-http; do
      [[ -f $WORK/$f.log ]] && { log "last lines of $f.log:"; tail -n 15 "$WORK/$f.log" >&2; }
    done
    kubectl -n "$SYSTEM_NS" logs deploy/$RELEASE-tollgate-controller --tail 30 >&2 2>/dev/null || true
  fi
  if [[ ${KEEP:-} == 1 ]]; then
    log "KEEP=1: left running; logs and the repository in $WORK"
    exit "$rc"
  fi
  if ((started)); then
    # What the page's last block removes, when a block before it failed; while the
    # controllers still run, so that their finalizers are honoured (pruning included).
    kubectl -n flux-system delete kustomization shop --timeout=120s >/dev/null 2>&1 || true
    kubectl -n flux-system delete gitrepository shop --timeout=60s >/dev/null 2>&1 || true
  fi
  while read -r pid; do
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done < <(cat "$WORK/pids" 2>/dev/null)
  if ((started)); then
    # Finalizers left behind (a controller that died) would keep the namespace terminating.
    for kind in kustomization gitrepository; do
      kubectl -n flux-system patch "$kind" shop --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    done
    kubectl delete namespace shop flux-system --wait=false >/dev/null 2>&1 || true
    "$E2E/helm.sh" uninstall "$RELEASE" -n "$SYSTEM_NS" --wait --timeout 120s >/dev/null 2>&1 || true
    kubectl delete namespace "$SYSTEM_NS" --timeout=120s >/dev/null 2>&1 || true
    kubectl wait --for=delete namespace/shop namespace/flux-system --timeout=120s >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# free_port: a TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start NAME CMD...: CMD in a process group of its own, its output in $WORK/NAME.log.
start() {
  local name=$1
  shift
  setsid "$@" >"$WORK/$name.log" 2>&1 &
  echo $! >>"$WORK/pids"
}

# wait_http NAME URL: until URL answers 200 (the process started last is NAME's).
wait_http() {
  local name=$1 url=$2 pid deadline=$((SECONDS + 60))
  pid=$(tail -n 1 "$WORK/pids")
  until curl -fs -o /dev/null --max-time 2 "$url"; do
    kill -0 "$pid" 2>/dev/null || die "$name exited (its log is above)"
    ((SECONDS < deadline)) || die "$name: $url did not answer within 60 s"
    sleep 0.5
  done
}

# --- a cluster without the page's objects, Tollgate installed ---------------------------
for ns in shop flux-system "$SYSTEM_NS"; do
  kubectl wait --for=delete "namespace/$ns" --timeout=180s >/dev/null 2>&1 || true
  if kubectl get namespace "$ns" >/dev/null 2>&1; then
    die "namespace $ns exists: the page starts from a cluster without it (delete it first)"
  fi
done
started=1
kubectl create namespace "$SYSTEM_NS" >/dev/null
log "helm install charts/tollgate as $RELEASE into $SYSTEM_NS"
"$E2E/helm.sh" upgrade --install "$RELEASE" "$ROOT/charts/tollgate" -n "$SYSTEM_NS" \
  --set controller.replicas=1 --wait --timeout "${TIMEOUT}s" >/dev/null
kubectl wait --for=condition=Accepted gatewayclass/tollgate --timeout="${TIMEOUT}s" >/dev/null

# --- Flux: CRDs, flux-system, the two controllers --------------------------------------
log "Flux CRDs from $FLUX_CRDS"
kubectl apply --server-side --force-conflicts -f "$FLUX_CRDS" >/dev/null
kubectl wait --for=condition=Established --timeout=60s \
  crd/gitrepositories.source.toolkit.fluxcd.io crd/kustomizations.kustomize.toolkit.fluxcd.io >/dev/null
kubectl create namespace flux-system >/dev/null

mkdir -p "$WORK/artifacts"
storage=$(free_port)
health=$(free_port)
log "source-controller ($SOURCE_CONTROLLER), artifacts on 127.0.0.1:$storage"
start source-controller env RUNTIME_NAMESPACE=flux-system "$SOURCE_CONTROLLER" \
  --storage-path "$WORK/artifacts" \
  --storage-addr "127.0.0.1:$storage" \
  --storage-adv-addr "127.0.0.1:$storage" \
  --metrics-addr "127.0.0.1:$(free_port)" \
  --health-addr "127.0.0.1:$health" \
  --events-addr "" \
  --log-level info
wait_http source-controller "http://127.0.0.1:$health/readyz"

health=$(free_port)
log "kustomize-controller ($KUSTOMIZE_CONTROLLER)"
start kustomize-controller env RUNTIME_NAMESPACE=flux-system "$KUSTOMIZE_CONTROLLER" \
  --metrics-addr "127.0.0.1:$(free_port)" \
  --health-addr "127.0.0.1:$health" \
  --events-addr "" \
  --no-remote-bases \
  --log-level info
wait_http kustomize-controller "http://127.0.0.1:$health/readyz"

# --- the Git repository, served over HTTP on loopback -----------------------------------
mkdir -p "$WORK/git" "$WORK/user"
git init -q --bare -b main "$WORK/git/shop-config.git"
git -C "$WORK/git/shop-config.git" config http.receivepack true # push without a login
start git-http python3 "$E2E/git-http-server.py" "$WORK/git" --port-file "$WORK/git-port"
for _ in $(seq 1 100); do [[ -s $WORK/git-port ]] && break; sleep 0.1; done
[[ -s $WORK/git-port ]] || die "e2e/git-http-server.py did not start: $(cat "$WORK/git-http.log")"
GIT_URL=http://127.0.0.1:$(cat "$WORK/git-port")/shop-config.git
export GIT_URL
log "Git repository: $GIT_URL"
# The user's Git identity, and none of this machine's Git configuration.
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME="Flux test" GIT_AUTHOR_EMAIL=flux-test@tollgate.test
export GIT_COMMITTER_NAME="Flux test" GIT_COMMITTER_EMAIL=flux-test@tollgate.test

# --- the page's section, run as written ---------------------------------------------------
n=$(python3 "$E2E/doc-blocks.py" "$PAGE" "$SECTION" "$WORK/page.sh" "$WORK") ||
  die "cannot read the section '$SECTION' of $PAGE"

log "docs/gitops.md, section '$SECTION': $n blocks, run in $WORK/user"
start_page=$SECONDS
(cd "$WORK/user" && bash "$WORK/page.sh") || die "docs/gitops.md, section '$SECTION' (above)"
log "the page's blocks ran in $((SECONDS - start_page)) s"

# The page's last block deleted the Kustomization, and its pruning the namespace shop.
kubectl get namespace shop >/dev/null 2>&1 && die "namespace shop still exists after the page's clean-up"
log "PASS: a commit applied and served, a rejected policy failing the health check, the revert recovering"
