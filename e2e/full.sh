# e2e/full.sh — sourced by e2e/cluster.sh: the parts of `up --full` beyond
# etcd + kube-apiserver: kube-controller-manager, the pod network (bridge
# tgbr0 on 10.244.0.0/24, a blackhole route for the service range) and the
# Rust node agent (e2e/node-agent). See e2e/README.md.
# shellcheck shell=bash

KCM_PID=$STATE_DIR/kube-controller-manager.pid
KCM_LOG=$STATE_DIR/kube-controller-manager.log
AGENT_PID=$STATE_DIR/node-agent.pid
AGENT_LOG=$STATE_DIR/node-agent.log
AGENT_CONFIG=$STATE_DIR/node-agent.yaml
NET_MARK=$STATE_DIR/network # present while this cluster owns the bridge
NODE_NAME=tollgate-node
BRIDGE=tgbr0
BRIDGE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
AGENT_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE_DIR/target}
# The agent runs from a copy in the state dir, so that a cargo build that
# replaces the target-dir binary while the cluster is up changes nothing.
AGENT_BIN=$STATE_DIR/tollgate-node-agent
# What the controller manager runs: what Deployments, Services and namespaces
# need (plus the ConfigMap kube-root-ca.crt that service-account volumes mount).
KCM_CONTROLLERS=deployment-controller,replicaset-controller,endpointslice-controller,endpoints-controller,namespace-controller,garbage-collector-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,pod-garbage-collector-controller

build_node_agent() {
  local start
  command -v cargo >/dev/null || die "cargo is required to build the node agent"
  start=$(now)
  log "building the node agent (cargo build -p tollgate-node-agent, CARGO_TARGET_DIR=$AGENT_TARGET_DIR)"
  (cd "$REPO_ROOT" && CARGO_TARGET_DIR=$AGENT_TARGET_DIR nice -n 19 cargo build -q --locked -p tollgate-node-agent --bins) ||
    die "building the node agent failed"
  log "node agent ready in $(elapsed_since "$start")s"
}

# pid_alive_exe PIDFILE BASENAME: like pid_alive, for a binary with a fixed name.
pid_alive_exe() {
  local pid exe
  [[ -f $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  [[ $(basename "$exe") == "$2" ]]
}

# stop_exe PIDFILE BASENAME: TERM, wait up to 40 s (the agent stops its pods
# first), then KILL.
stop_exe() { stop_pid "$1" "$2" 400 pid_alive_exe; }

api_get() { # api_get PATH: GET from the API server as admin (quiet)
  curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$(apiserver_url)$1" 2>/dev/null
}

# shellcheck disable=SC2317 # called through wait_for
default_sa_exists() { api_get /api/v1/namespaces/default/serviceaccounts/default >/dev/null; }
# shellcheck disable=SC2317 # called through wait_for
node_ready() {
  api_get "/api/v1/nodes/$NODE_NAME" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

start_kcm() {
  pid_alive "$KCM_PID" kube-controller-manager && return 0
  setsid "$KCM_BIN" \
    --kubeconfig "$KUBECONFIG_FILE" \
    --leader-elect=false \
    --use-service-account-credentials=false \
    --service-account-private-key-file "$PKI/sa.key" \
    --root-ca-file "$PKI/ca.crt" \
    --controllers "$KCM_CONTROLLERS" \
    --secure-port 0 \
    --kube-api-qps 100 --kube-api-burst 200 \
    --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 \
    </dev/null >"$KCM_LOG" 2>&1 9>&- &
  echo $! >"$KCM_PID"
}

# ensure_tools: the programs the node agent runs (ip, unshare, nsenter, and a
# kill binary: it cannot use the shell builtin), installed from Debian if missing.
ensure_tools() {
  local want=() tool pkg
  for tool in ip:iproute2 unshare:util-linux nsenter:util-linux kill:procps mount:mount; do
    pkg=${tool#*:}
    type -P "${tool%%:*}" >/dev/null || want+=("$pkg")
  done
  ((${#want[@]})) || return 0
  command -v apt-get >/dev/null || die "up --full needs: ${want[*]} (no apt-get to install them)"
  log "installing ${want[*]} (Debian) for the node agent"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${want[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${want[@]}" >/dev/null; } ||
    die "installing ${want[*]} failed"
}

net_up() {
  [[ $(id -u) -eq 0 ]] || die "up --full needs root (network namespaces, a bridge)"
  ensure_tools
  # One full cluster per machine: the bridge, the pod range and the tg-*
  # namespaces are global. A bridge this state dir did not create belongs to
  # another cluster (or to one whose state dir was deleted without down).
  if [[ ! -f $NET_MARK ]] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "$BRIDGE exists but this cluster ($STATE_DIR) did not create it: another 'up --full' cluster runs (run down with its TOLLGATE_CLUSTER_DIR), or remove a leftover with 'ip link delete $BRIDGE'"
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  # Service addresses that no Service owns go nowhere (never off the machine);
  # the agent adds the ones in use as /32s on the bridge (local, so they win).
  ip route replace blackhole "$SERVICE_CIDR"
  touch "$NET_MARK"
}

net_down() {
  local ns pid link
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^tg-/ { print $1 }'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep '^tgv' || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  ip route del blackhole "$SERVICE_CIDR" 2>/dev/null || true
  rm -f "$NET_MARK"
  log "removed the pod network ($BRIDGE, tg-* namespaces, blackhole $SERVICE_CIDR)"
}

write_agent_config() {
  local target=$AGENT_TARGET_DIR/debug py
  {
    echo "# Written by e2e/cluster.sh up --full: container image prefix -> local binary."
    echo "images:"
    # The suite's backends: registry.k8s.io's name since v1.6, the staging name before.
    echo "  - prefix: registry.k8s.io/gateway-api/echo-basic"
    echo "    binary: $ECHO_BASIC_BIN"
    echo "  - prefix: gcr.io/k8s-staging-gateway-api/echo-basic"
    echo "    binary: $ECHO_BASIC_BIN"
    echo "  - prefix: tollgate.test/http"
    echo "    binary: $target/tg-test-http"
    echo "  - prefix: ghcr.io/tollgate-dev/tollgate-proxy"
    echo "    binary: $target/tollgate-proxy"
    echo "  - prefix: ghcr.io/tollgate-dev/tollgate"
    echo "    binary: $target/tollgate"
    # A shell, for tests whose pods run a script (`command: [sh, -c, ...]`).
    echo "  - prefix: tollgate.test/sh"
    echo "    binary: /bin/sh"
    # The conformance suite's base manifests run CoreDNS, the backend of its UDPRoute test.
    echo "  - prefix: registry.k8s.io/coredns/coredns"
    echo "    binary: $COREDNS_BIN"
    py=$(command -v python3 2>/dev/null || true)
    [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
    if [[ -n $py ]]; then
      # examples/gitops/app's backend (agnhost netexec): a small Python stand-in.
      echo "  - prefix: registry.k8s.io/e2e-test-images/agnhost"
      echo "    binary: $py"
      echo "    entrypoint: [\"$K8S_DIR/stand-ins/agnhost-netexec.py\"]"
      echo "  - prefix: tollgate.test/python-http"
      echo "    binary: $py"
      echo "    entrypoint: [\"-m\", \"http.server\"]"
    fi
  } >"$AGENT_CONFIG"
}

start_agent() {
  pid_alive_exe "$AGENT_PID" tollgate-node-agent && return 0
  write_agent_config
  mkdir -p "$STATE_DIR/node"
  cp -f "$AGENT_TARGET_DIR/debug/tollgate-node-agent" "$AGENT_BIN"
  KUBECONFIG=$KUBECONFIG_FILE RUST_LOG=${RUST_LOG:-info} setsid "$AGENT_BIN" \
    --node-name "$NODE_NAME" \
    --config "$AGENT_CONFIG" \
    --state-dir "$STATE_DIR/node" \
    --bridge "$BRIDGE" \
    --gateway "$BRIDGE_IP" \
    --service-cidr "$SERVICE_CIDR" \
    --api-server "127.0.0.1:$APISERVER_PORT" \
    </dev/null >"$AGENT_LOG" 2>&1 9>&- &
  echo $! >"$AGENT_PID"
}

# wait_full WHAT CMD...: wait_for, also failing fast when KCM or the agent died.
wait_full() {
  local what=$1 deadline
  shift
  deadline=$((SECONDS + UP_TIMEOUT))
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after ${UP_TIMEOUT}s waiting for $what"
    pid_alive "$KCM_PID" kube-controller-manager || die "kube-controller-manager exited while waiting for $what"
    if [[ -f $AGENT_PID ]] && ! pid_alive_exe "$AGENT_PID" tollgate-node-agent; then
      die "the node agent exited while waiting for $what"
    fi
    sleep 0.1
  done
}

start_full() {
  local start
  start=$(now)
  net_up
  start_kcm
  wait_full "the controller manager (ServiceAccount default/default)" default_sa_exists
  log "kube-controller-manager $K8S_VERSION running ($(elapsed_since "$start")s)"
  start_agent
  wait_full "Node $NODE_NAME Ready" node_ready
  log "node agent running, Node $NODE_NAME Ready, pods on $POD_CIDR via $BRIDGE ($(elapsed_since "$start")s)"
}

# stop_full: stop the agent (it stops its pods), the controller manager, and
# remove the pod network. A no-op for a cluster started without --full.
stop_full() {
  stop_exe "$AGENT_PID" tollgate-node-agent
  stop_pid "$KCM_PID" kube-controller-manager
  [[ -f $NET_MARK ]] && net_down
  remove_mount_points
  return 0
}

# remove_mount_points: what an agent that did not stop cleanly left of the mount
# points it created on the host (empty directories and empty files only).
remove_mount_points() {
  local list=$STATE_DIR/node/created-mount-points p
  [[ -f $list ]] || return 0
  while IFS= read -r p; do
    [[ -n $p ]] || continue
    if [[ -f $p && ! -s $p ]]; then
      rm -f -- "$p"
    elif [[ -d $p ]]; then
      rmdir -- "$p" 2>/dev/null || true
    fi
  done < <(tac "$list")
  rm -f "$list"
}

# status_full: one line about the --full parts, when there are any.
status_full() {
  local kcm=stopped agent=stopped
  [[ -f $NET_MARK || -f $KCM_PID || -f $AGENT_PID ]] || return 0
  pid_alive "$KCM_PID" kube-controller-manager && kcm="pid $(<"$KCM_PID")"
  pid_alive_exe "$AGENT_PID" tollgate-node-agent && agent="pid $(<"$AGENT_PID")"
  log "full: kube-controller-manager $kcm, node agent $agent, pods on $POD_CIDR via $BRIDGE"
}

# shellcheck disable=SC2317 # called as an EXIT trap
on_full_error() {
  local rc=$?
  trap - EXIT
  ((rc == 0)) && return 0
  log "up --full failed (exit $rc); logs are in $STATE_DIR"
  print_logs
  stop_full
  exit "$rc"
}
