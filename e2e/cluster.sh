#!/usr/bin/env bash
# e2e/cluster.sh — a real Kubernetes control plane (etcd + kube-apiserver) on
# 127.0.0.1 for Tollgate's integration tests. No Docker, no kind: both
# binaries are built from Go modules (e2e/k8s/*) and cached; the Gateway API
# CRDs come from the sigs.k8s.io/gateway-api module zip. See e2e/README.md.
#
#   e2e/cluster.sh up      build missing binaries, start etcd + kube-apiserver,
#                          install CRDs, wait until they are Established
#   e2e/cluster.sh up --full  the same, plus kube-controller-manager, a bridge
#                          (tgbr0, 10.244.0.0/24) and the Rust node agent
#                          (e2e/node-agent): pods run as local processes in
#                          network namespaces, Services and LoadBalancers work
#                          (root only)
#   e2e/cluster.sh down    stop everything it started and delete the state dir
#   e2e/cluster.sh env     print `export KUBECONFIG=...`
#   e2e/cluster.sh status  say whether the cluster is up (exit 1 if not)
#   e2e/cluster.sh build [--full]  only build/cache the binaries
#   e2e/cluster.sh logs    print the tails of the etcd and apiserver logs
#   e2e/cluster.sh kubectl ARGS...  kubectl against this cluster
#
# Environment (all optional):
#   TOLLGATE_CACHE_DIR          default ${XDG_CACHE_HOME:-$HOME/.cache}/tollgate
#   TOLLGATE_BIN_DIR            default $TOLLGATE_CACHE_DIR/bin
#   TOLLGATE_CLUSTER_DIR        state dir (pki, etcd data, logs, kubeconfig);
#                               default $TOLLGATE_CACHE_DIR/cluster
#   TOLLGATE_APISERVER_PORT     kube-apiserver secure port, default 6443
#   TOLLGATE_ETCD_PORT          etcd client port, default 2379
#   TOLLGATE_ETCD_PEER_PORT     etcd peer port, default 2380
#   TOLLGATE_GATEWAY_API_CHANNEL  experimental (default, a superset) | standard
#   TOLLGATE_BUILD_JOBS         go build -p, default 1 (builds run under nice 19)
#   CARGO_TARGET_DIR            where `up --full` builds the node agent; default
#                               $TOLLGATE_CACHE_DIR/target
#   TOLLGATE_UP_TIMEOUT         seconds to wait for etcd/apiserver/CRDs, default 120
#   TOLLGATE_APISERVER_ARGS     extra kube-apiserver flags (word-split), e.g.
#                               "--feature-gates=Foo=true --v=4"
#   KUBECTL                     kubectl binary the script uses; default: kubectl
#                               on PATH, or if there is none a kubectl of the
#                               API server's version built from e2e/k8s/kubectl
#   TOLLGATE_KUBECTL=build      use the built kubectl even if one is on PATH
set -euo pipefail
T0=$(date +%s.%N) # `up` reports its wall time from here
BUILT=""          # names of the binaries this run had to build
FULL=0            # `up --full` / `build --full`

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
K8S_DIR=$SCRIPT_DIR/k8s

CACHE_DIR=${TOLLGATE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate}
BIN_DIR=${TOLLGATE_BIN_DIR:-$CACHE_DIR/bin}
STATE_DIR=${TOLLGATE_CLUSTER_DIR:-$CACHE_DIR/cluster}
APISERVER_PORT=${TOLLGATE_APISERVER_PORT:-6443}
ETCD_PORT=${TOLLGATE_ETCD_PORT:-2379}
ETCD_PEER_PORT=${TOLLGATE_ETCD_PEER_PORT:-2380}
GATEWAY_API_CHANNEL=${TOLLGATE_GATEWAY_API_CHANNEL:-experimental}
BUILD_JOBS=${TOLLGATE_BUILD_JOBS:-1}
UP_TIMEOUT=${TOLLGATE_UP_TIMEOUT:-120}
KUBECTL=${KUBECTL:-}
read -r -a APISERVER_EXTRA_ARGS <<<"${TOLLGATE_APISERVER_ARGS:-}"
SERVICE_CIDR=10.96.0.0/16 # allocation range inside the apiserver only
SERVICE_IP=10.96.0.1      # first IP of SERVICE_CIDR: the `kubernetes` Service

PKI=$STATE_DIR/pki
KUBECONFIG_FILE=$STATE_DIR/kubeconfig
ETCD_PID=$STATE_DIR/etcd.pid
APISERVER_PID=$STATE_DIR/kube-apiserver.pid
ETCD_LOG=$STATE_DIR/etcd.log
APISERVER_LOG=$STATE_DIR/kube-apiserver.log
PORTS_FILE=$STATE_DIR/ports

# A running cluster keeps the ports it was started with, whatever the
# environment of later calls says.
REQUESTED_PORTS="$APISERVER_PORT $ETCD_PORT $ETCD_PEER_PORT"
if [[ -f $PORTS_FILE ]]; then
  read -r APISERVER_PORT ETCD_PORT ETCD_PEER_PORT <"$PORTS_FILE" || true
fi

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

now() { date +%s.%N; }
elapsed_since() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

# --- versions and binaries -------------------------------------------------

# module_version DIR MODULE: the version DIR/go.mod requires MODULE at.
module_version() {
  awk -v m="$2" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v/ { print $2; exit }
  ' "$1/go.mod"
}

# wrapper_key DIR: short hash of the wrapper module, so that editing go.mod,
# go.sum or main.go (e.g. a replace bump) rebuilds even at the same version.
wrapper_key() {
  (cd "$1" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-10)
}

ETCD_VERSION=$(module_version "$K8S_DIR/etcd" go.etcd.io/etcd/server/v3)
K8S_VERSION=$(module_version "$K8S_DIR/kube-apiserver" k8s.io/kubernetes)
[[ -n $ETCD_VERSION && -n $K8S_VERSION ]] || die "cannot read versions from $K8S_DIR/*/go.mod"
KUBECTL_VERSION=$(module_version "$K8S_DIR/kubectl" k8s.io/kubectl) # v0.X.Y
KUBECTL_VERSION=v1.${KUBECTL_VERSION#v0.}                            # v1.X.Y
ETCD_BIN=$BIN_DIR/etcd-$ETCD_VERSION-$(wrapper_key "$K8S_DIR/etcd")
APISERVER_BIN=$BIN_DIR/kube-apiserver-$K8S_VERSION-$(wrapper_key "$K8S_DIR/kube-apiserver")
KCM_BIN=$BIN_DIR/kube-controller-manager-$K8S_VERSION-$(wrapper_key "$K8S_DIR/kube-controller-manager")
ECHO_BASIC_BIN=$BIN_DIR/echo-basic-$(module_version "$K8S_DIR/echo-basic" sigs.k8s.io/gateway-api/conformance)-$(wrapper_key "$K8S_DIR/echo-basic")
KUBECTL_BIN=$BIN_DIR/kubectl-$KUBECTL_VERSION-$(wrapper_key "$K8S_DIR/kubectl")
COREDNS_BIN=$BIN_DIR/coredns-$(module_version "$K8S_DIR/coredns" github.com/coredns/coredns)-$(wrapper_key "$K8S_DIR/coredns")

# go_build NAME MODULE_DIR OUT LDFLAGS [PACKAGE]: PACKAGE defaults to the
# wrapper module itself (.).
go_build() {
  local name=$1 dir=$2 out=$3 ldflags=$4 pkg=${5:-.} start tmp
  if [[ -x $out ]]; then
    touch -c "$out" # mtime = last use, for the pruning below
    return 0
  fi
  command -v go >/dev/null || die "go is required to build $name"
  mkdir -p "$BIN_DIR"
  tmp=$out.tmp.$$
  log "building $name -> $out (minutes if Go's build cache is cold; nice -n 19, -p=$BUILD_JOBS)"
  start=$(now)
  if ! (cd "$dir" && GOFLAGS="-p=$BUILD_JOBS -mod=readonly" nice -n 19 \
      go build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg"); then
    rm -f "$tmp"
    die "building $name failed"
  fi
  mv -f "$tmp" "$out"
  log "built $name in $(elapsed_since "$start")s"
  BUILT+=" $name"
  # Drop other versions of the same component not used for a week (another
  # checkout sharing the cache may still use a recent one).
  find "$BIN_DIR" -maxdepth 1 -name "$name-*" ! -path "$out" -mtime +7 -delete
}

build_binaries() {
  go_build etcd "$K8S_DIR/etcd" "$ETCD_BIN" "-s -w"
  go_build kube-apiserver "$K8S_DIR/kube-apiserver" "$APISERVER_BIN" "$(k8s_ldflags "$K8S_VERSION")"
  resolve_kubectl
  if ((FULL)); then
    go_build kube-controller-manager "$K8S_DIR/kube-controller-manager" "$KCM_BIN" "$(k8s_ldflags "$K8S_VERSION")"
    go_build echo-basic "$K8S_DIR/echo-basic" "$ECHO_BASIC_BIN" "-s -w" sigs.k8s.io/gateway-api/conformance/echo-basic
    go_build coredns "$K8S_DIR/coredns" "$COREDNS_BIN" "-s -w" github.com/coredns/coredns
    build_node_agent
  fi
}

k8s_ldflags() { # k8s_ldflags VERSION: version stamping for k8s binaries
  local minor=${1#v1.} v x ldflags="-s -w"
  minor=${minor%%.*}
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for x in gitVersion="$1" gitMajor=1 gitMinor="$minor" gitTreeState=clean; do
      ldflags+=" -X $v.$x"
    done
  done
  printf '%s' "$ldflags"
}

# resolve_kubectl: set KUBECTL (see the header), building kubectl if needed.
resolve_kubectl() {
  [[ -n $KUBECTL ]] && return 0
  if [[ ${TOLLGATE_KUBECTL:-} != build ]] && command -v kubectl >/dev/null; then
    KUBECTL=kubectl
    return 0
  fi
  go_build kubectl "$K8S_DIR/kubectl" "$KUBECTL_BIN" "$(k8s_ldflags "$KUBECTL_VERSION")"
  KUBECTL=$KUBECTL_BIN
}

# gateway_api_dir: the sigs.k8s.io/gateway-api module dir in the module cache.
gateway_api_dir() {
  local dir
  dir=$(cd "$K8S_DIR/gateway-api" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api 2>/dev/null) || dir=""
  if [[ -z $dir || ! -d $dir ]]; then
    (cd "$K8S_DIR/gateway-api" && GOFLAGS=-mod=readonly go mod download sigs.k8s.io/gateway-api) >&2 ||
      die "go mod download sigs.k8s.io/gateway-api failed"
    dir=$(cd "$K8S_DIR/gateway-api" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
  fi
  printf '%s\n' "$dir"
}

# --- processes ---------------------------------------------------------------

# pid_alive PIDFILE NAME: the pid in PIDFILE is alive and runs one of our NAME-*
# binaries (guards against a recycled pid).
pid_alive() {
  local pid exe
  [[ -f $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ $(basename "$exe") == "$2"-* ]]
}

# proc_running PID: PID exists and is not a zombie (an exited daemon whose
# reaper has not collected it yet counts as stopped).
proc_running() {
  local state
  state=$(awk '$1 == "State:" { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# stop_pid PIDFILE NAME [TENTHS [ALIVE]]: TERM, wait up to TENTHS/10 s (default 15 s),
# then KILL; ALIVE (default pid_alive) tells whether PIDFILE still names NAME.
stop_pid() {
  local file=$1 name=$2 tenths=${3:-150} alive=${4:-pid_alive} pid i
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  if "$alive" "$file" "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < tenths; i++)); do
      proc_running "$pid" || break
      sleep 0.1
    done
    if proc_running "$pid"; then
      log "$name did not exit, killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

apiserver_url() { printf 'https://127.0.0.1:%s' "$APISERVER_PORT"; }

# shellcheck disable=SC2317 # also called through wait_for
apiserver_ready() {
  curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$(apiserver_url)/readyz" >/dev/null 2>&1
}

cluster_running() {
  pid_alive "$ETCD_PID" etcd && pid_alive "$APISERVER_PID" kube-apiserver && apiserver_ready
}

# runs_current_binaries: the running processes are the binaries this checkout
# builds (false after a version bump, which then restarts the cluster).
runs_current_binaries() {
  local etcd_exe api_exe
  etcd_exe=$(readlink "/proc/$(<"$ETCD_PID")/exe" 2>/dev/null) || return 1
  api_exe=$(readlink "/proc/$(<"$APISERVER_PID")/exe" 2>/dev/null) || return 1
  [[ $etcd_exe == "$ETCD_BIN" && $api_exe == "$APISERVER_BIN" ]]
}

print_logs() {
  local f
  for f in "$ETCD_LOG" "$APISERVER_LOG" "$STATE_DIR/kube-controller-manager.log" "$STATE_DIR/node-agent.log"; do
    [[ -f $f ]] || continue
    printf '\n===== tail -n 40 %s =====\n' "$f" >&2
    tail -n 40 "$f" >&2
  done
}

# wait_for WHAT CMD...: poll CMD every 0.1 s up to UP_TIMEOUT seconds.
wait_for() {
  local what=$1 deadline
  shift
  deadline=$((SECONDS + UP_TIMEOUT))
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after ${UP_TIMEOUT}s waiting for $what"
    pid_alive "$ETCD_PID" etcd || die "etcd exited while waiting for $what"
    if [[ -f $APISERVER_PID ]] && ! pid_alive "$APISERVER_PID" kube-apiserver; then
      die "kube-apiserver exited while waiting for $what"
    fi
    sleep 0.1
  done
}

# --- certificates --------------------------------------------------------------

# new_key FILE: a P-256 key in PKCS#8 PEM ("BEGIN PRIVATE KEY"), which Go,
# OpenSSL and rustls (kube-rs) all read. EC: key generation is instant.
new_key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

# issue NAME SUBJECT EXTENSIONS: a key and a cert signed by the CA.
issue() {
  local name=$1 subj=$2 ext=$3
  new_key "$PKI/$name.key"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

gen_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  new_key "$PKI/ca.key"
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=tollgate-e2e-ca" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$PKI/ca.crt" 2>/dev/null
  issue apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=tollgate-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  # Service-account token signing key pair.
  new_key "$PKI/sa.key"
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

write_kubeconfig() {
  cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tollgate-e2e
  cluster:
    server: $(apiserver_url)
    certificate-authority: $PKI/ca.crt
users:
- name: tollgate-admin
  user:
    client-certificate: $PKI/admin.crt
    client-key: $PKI/admin.key
contexts:
- name: tollgate-e2e
  context:
    cluster: tollgate-e2e
    user: tollgate-admin
    namespace: default
current-context: tollgate-e2e
EOF
  chmod 600 "$KUBECONFIG_FILE"
}

# shellcheck source=e2e/full.sh
source "$SCRIPT_DIR/full.sh"

# --- start ---------------------------------------------------------------------

start_etcd() {
  # setsid: own session, so the process outlives this script and a Ctrl-C in
  # the calling terminal. In a non-interactive shell the background child is
  # not a group leader, so setsid does not fork and $! is etcd's pid.
  setsid "$ETCD_BIN" \
    --name tollgate-e2e \
    --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "tollgate-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --quota-backend-bytes $((2 * 1024 * 1024 * 1024)) \
    --log-level warn \
    </dev/null >"$ETCD_LOG" 2>&1 9>&- &
  echo $! >"$ETCD_PID"
}

# shellcheck disable=SC2317 # called through wait_for
etcd_healthy() { curl -fsS --max-time 1 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }

start_apiserver() {
  setsid "$APISERVER_BIN" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 \
    --advertise-address 127.0.0.1 \
    --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" \
    --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode RBAC \
    --endpoint-reconciler-type none \
    --allow-privileged=true \
    --profiling=false \
    "${APISERVER_EXTRA_ARGS[@]}" \
    </dev/null >"$APISERVER_LOG" 2>&1 9>&- &
  echo $! >"$APISERVER_PID"
}

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# gateway_api_kustomization: the kustomization dir of the chosen channel. In
# config/crd/experimental has its own kustomization.yaml (v1.5.1, v1.6.3), while the
# standard channel's files are listed by config/crd/kustomization.yaml.
gateway_api_kustomization() {
  local gw
  gw=$(gateway_api_dir)
  case $GATEWAY_API_CHANNEL in
    experimental) [[ -f $gw/config/crd/experimental/kustomization.yaml ]] && echo "$gw/config/crd/experimental" ;;
    standard)
      if [[ -f $gw/config/crd/standard/kustomization.yaml ]]; then
        echo "$gw/config/crd/standard"
      elif [[ -f $gw/config/crd/kustomization.yaml ]]; then
        echo "$gw/config/crd"
      fi
      ;;
    *) die "TOLLGATE_GATEWAY_API_CHANNEL must be experimental or standard, not '$GATEWAY_API_CHANNEL'" ;;
  esac
}

install_crds() {
  local start files=() extra=""
  start=$(now)
  kc apply --server-side --force-conflicts --field-manager tollgate-e2e -k "$GATEWAY_API_KUSTOMIZATION" >/dev/null
  if [[ -d $REPO_ROOT/crds ]]; then
    mapfile -t files < <(find "$REPO_ROOT/crds" -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
    if ((${#files[@]})); then
      local args=() f
      for f in "${files[@]}"; do args+=(-f "$f"); done
      kc apply --server-side --force-conflicts --field-manager tollgate-e2e "${args[@]}" >/dev/null
      extra=", ${#files[@]} file(s) from crds/"
    fi
  fi
  # kubectl wait fails at once, rather than waiting, on a CRD the API server has not given a
  # status yet (".status.conditions accessor error: <nil> is of the type <nil>"; seen in CI
  # right after the apply): such failures are retried until the deadline.
  local deadline=$((SECONDS + UP_TIMEOUT)) err
  until err=$(kc wait --for condition=established --timeout "$((deadline > SECONDS ? deadline - SECONDS : 1))s" crd --all 2>&1 >/dev/null); do
    ((SECONDS < deadline)) || die "CRDs not Established within ${UP_TIMEOUT}s: $err"
    sleep 0.5
  done
  log "CRDs installed (Gateway API $(gateway_api_version) $GATEWAY_API_CHANNEL channel$extra) and Established in $(elapsed_since "$start")s"
}

gateway_api_version() { module_version "$K8S_DIR/gateway-api" sigs.k8s.io/gateway-api; }

# shellcheck disable=SC2317 # called as an EXIT trap
on_up_error() {
  local rc=$?
  trap - EXIT
  ((rc == 0)) && return 0
  log "up failed (exit $rc); logs are in $STATE_DIR"
  print_logs
  stop_full
  stop_pid "$APISERVER_PID" kube-apiserver
  stop_pid "$ETCD_PID" etcd
  exit "$rc"
}

# ready_message: the `up` summary line, with the wall time since the script
# started (and, on a cold run, a reminder that it includes building).
ready_message() {
  local extra=""
  [[ -z $BUILT ]] || extra=" (including building$BUILT)"
  log "ready in $(elapsed_since "$T0")s$extra — $(cmd_env)"
}

cmd_up() {
  local start
  command -v openssl >/dev/null || die "openssl not found"
  command -v curl >/dev/null || die "curl not found"
  build_binaries
  GATEWAY_API_KUSTOMIZATION=$(gateway_api_kustomization) || true
  [[ -n $GATEWAY_API_KUSTOMIZATION ]] ||
    die "no Gateway API $GATEWAY_API_CHANNEL channel in $(gateway_api_dir)/config/crd"
  start=$(now) # per-step times below count from here, after any build

  if cluster_running && ! runs_current_binaries; then
    log "the running cluster uses other binaries than $(basename "$ETCD_BIN") and $(basename "$APISERVER_BIN"): starting a new one"
  elif cluster_running; then
    log "cluster already running (etcd pid $(<"$ETCD_PID"), kube-apiserver pid $(<"$APISERVER_PID"))"
    if [[ "$APISERVER_PORT $ETCD_PORT $ETCD_PEER_PORT" != "$REQUESTED_PORTS" ]]; then
      log "note: it keeps its ports ($APISERVER_PORT $ETCD_PORT $ETCD_PEER_PORT); run down first to change them"
    fi
    install_crds
    if ((FULL)); then
      trap on_full_error EXIT
      start_full
      trap - EXIT
    fi
    ready_message
    return 0
  fi

  # Whatever is left of an earlier run (crashed, half started) is discarded.
  stop_full
  stop_pid "$APISERVER_PID" kube-apiserver
  stop_pid "$ETCD_PID" etcd
  rm -rf "$STATE_DIR"
  read -r APISERVER_PORT ETCD_PORT ETCD_PEER_PORT <<<"$REQUESTED_PORTS"

  local p
  for p in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    if port_in_use "$p"; then
      die "port 127.0.0.1:$p is in use (set TOLLGATE_APISERVER_PORT / TOLLGATE_ETCD_PORT / TOLLGATE_ETCD_PEER_PORT)"
    fi
  done

  mkdir -p "$STATE_DIR"
  echo "$APISERVER_PORT $ETCD_PORT $ETCD_PEER_PORT" >"$PORTS_FILE"
  trap on_up_error EXIT
  gen_pki
  write_kubeconfig

  start_etcd
  wait_for etcd etcd_healthy
  log "etcd $ETCD_VERSION healthy on 127.0.0.1:$ETCD_PORT ($(elapsed_since "$start")s)"

  start_apiserver
  wait_for "kube-apiserver /readyz" apiserver_ready
  log "kube-apiserver $K8S_VERSION ready on $(apiserver_url) ($(elapsed_since "$start")s)"

  install_crds
  ((FULL)) && start_full
  trap - EXIT
  ready_message
}

cmd_down() {
  stop_full
  stop_pid "$APISERVER_PID" kube-apiserver
  stop_pid "$ETCD_PID" etcd
  if [[ -d $STATE_DIR ]]; then
    rm -rf "$STATE_DIR"
    log "removed $STATE_DIR"
  fi
}

cmd_env() { printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_FILE"; }

cmd_status() {
  if cluster_running; then
    log "running: $(apiserver_url) (etcd pid $(<"$ETCD_PID"), kube-apiserver pid $(<"$APISERVER_PID"))"
    status_full
    cmd_env
  else
    log "not running"
    return 1
  fi
}

# parse_full ARGS...: `--full` (the only option of up and build) sets FULL=1.
parse_full() {
  local a
  for a in "$@"; do
    case $a in
      --full) FULL=1 ;;
      *) die "unknown option '$a' (only --full)" ;;
    esac
  done
}

# Serialise up/down so that two concurrent callers leave one cluster.
lock() {
  mkdir -p "$(dirname "$STATE_DIR")"
  exec 9>"$STATE_DIR.lock"
  flock 9
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# Everything runs from main, and `exit` follows on the same line, so once
# main starts bash has read the whole file: editing or checking out a new
# cluster.sh while `up` runs cannot make the running script misbehave.
main() {
  case ${1:-} in
    up)
      parse_full "${@:2}"
      lock && cmd_up
      ;;
    down) lock && cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    build)
      parse_full "${@:2}"
      build_binaries
      ;;
    logs) print_logs ;;
    kubectl)
      shift
      resolve_kubectl
      kc "$@"
      ;;
    -h | --help | help) usage ;;
    *)
      usage >&2
      exit 2
      ;;
  esac
}

main "$@"; exit
