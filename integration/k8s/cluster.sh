#!/usr/bin/env bash
# A throwaway Kubernetes cluster on this machine, for trying and testing
# podgate: the real kube-apiserver, controller-manager, scheduler, kubelets,
# kube-proxies and containerd, built by build.sh; each node a network
# namespace plus a mount namespace of its own.
#
#   integration/k8s/cluster.sh up [--containerd debian|2]   bring it up (3 nodes)
#   integration/k8s/cluster.sh down                         remove everything it made
#   integration/k8s/cluster.sh status                       what runs
#   integration/k8s/cluster.sh shell                        a shell where kubectl reaches it
#   integration/k8s/cluster.sh run CMD [ARGS...]            a command there (KUBECONFIG, PATH set)
#   integration/k8s/cluster.sh node NODE CMD [ARGS...]      a command on a node (its netns and mounts)
#   integration/k8s/cluster.sh load-image ARCHIVE           import an image into every node's containerd
#   integration/k8s/cluster.sh restart NODE kubelet|containerd|kube-proxy
#   integration/k8s/cluster.sh stop-node NODE | start-node NODE [--reboot]
#                                                           stop a node (kube-proxy, kubelet, containerd,
#                                                           its pods) and start it again; --reboot first
#                                                           does what a reboot takes away (mounts, netns,
#                                                           cgroups, /run; /var/lib stays)
#
# Layout (all under /var/tmp/$PODGATE_K8S_NAME, default /var/tmp/pg-k8s):
# * netns pg-k8s-fabric: a bridge, the underlay (192.168.200.254, no
#   forwarding); pg-k8s-cp: etcd, kube-apiserver (192.168.200.10:6443),
#   controller-manager, scheduler, and where kubectl runs (`shell`, `run`);
#   pg-k8s-node-1..3 (192.168.200.1-3): containerd, kubelet, kube-proxy
#   (nftables mode). Pod networks 10.244.N.0/24 by the bridge and host-local
#   plugins (Debian's), routed between nodes host-gw style; Services in
#   10.96.0.0/16.
# * each node's mount namespace (slave of the machine's, then shared, as a
#   systemd host's root is) has its own /run, /var/lib, /var/log, /opt,
#   /tmp and /etc/cni, so every hostPath a manifest names is the node's, and
#   plain files over the /proc/sys entries the kubelet writes at start
#   (the machine keeps its values).
# * the kubelets' cgroups under /sys/fs/cgroup/<controller>/pg-k8s/<node>
#   (cgroupRoot; cgroup v1 with the cgroupfs driver, failCgroupV1: false).
#
# Nothing of the machine's own networking, sysctls or cgroups is changed;
# `down` (also after an `up` killed half-way) removes every process,
# namespace, mount, cgroup and file the cluster made.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# One cluster per name on a machine: its netns prefix, cgroup root and
# directory ($PODGATE_K8S_NAME, default pg-k8s).
P="${PODGATE_K8S_NAME:-pg-k8s}"
case "$P" in pg-k8s | pg-k8s-[a-z0-9]*) ;; *) echo "cluster.sh: PODGATE_K8S_NAME is pg-k8s or pg-k8s-<letters, digits>" >&2 && exit 64 ;; esac
C="/var/tmp/$P"
NODES=(node-1 node-2 node-3)
FABRIC_NET=192.168.200
CP_IP=$FABRIC_NET.10
GATEWAY=$FABRIC_NET.254
SERVICE_CIDR=10.96.0.0/16
SERVICE_API_IP=10.96.0.1
CLUSTER_CIDR=10.244.0.0/16
CGROUP_ROOT=/$P
PAUSE_IMAGE=localhost/podgate/pause:3.10
# The files the kubelet writes at start (setupKernelTunables); the node's
# mount namespace covers each with a plain file.
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

say() { echo "cluster.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

node_index() {
    local i
    for i in "${!NODES[@]}"; do
        if [ "${NODES[$i]}" = "$1" ]; then
            echo $((i + 1))
            return
        fi
    done
    fail "no node '$1' (nodes: ${NODES[*]})"
}
node_ip() { echo "$FABRIC_NET.$(node_index "$1")"; }
pod_cidr() { echo "10.244.$(node_index "$1").0/24"; }

# ---- binaries ------------------------------------------------------------

load_bins() {
    [ -n "${K8S_BIN:-}" ] && return
    eval "$(bash "$here/build.sh" --env)"
    case "$(cat "$C/containerd" 2>/dev/null || echo "${containerd_gen:-debian}")" in
    2) CONTAINERD_BIN=$CONTAINERD2_BIN ;;
    *) CONTAINERD_BIN=/usr/bin ;;
    esac
}

# ---- processes -----------------------------------------------------------

# start NAME NETNS MOUNTNS|- CMD...: a daemon in its own session, its pid
# in $C/pids/NAME, its output in $C/logs/NAME.log.
start() {
    local name=$1 netns=$2 mnt=$3
    shift 3
    local enter=(--net="/run/netns/$P-$netns")
    [ "$mnt" = - ] || enter+=(--mount="$C/ns/$mnt")
    setsid nsenter "${enter[@]}" -- "$@" >>"$C/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$C/pids/$name"
}

# stop_pid NAME: SIGTERM, SIGKILL after 10 s.
stop_pid() {
    local f="$C/pids/$1" pid i
    [ -f "$f" ] || return 0
    pid="$(cat "$f")"
    if kill -TERM "$pid" 2>/dev/null; then
        for i in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
    local what=$1 secs=$2 i
    shift 2
    for i in $(seq $((secs * 5))); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    fail "$what not ready after ${secs}s (logs in $C/logs)"
}

in_cp() { nsenter --net="/run/netns/$P-cp" -- "$@"; }
on_node() {
    local n=$1
    shift
    nsenter --net="/run/netns/$P-$n" --mount="$C/ns/$n" -- "$@"
}

kubectl_() { in_cp "$K8S_BIN/kubectl" --kubeconfig "$C/pki/admin.kubeconfig" "$@"; }

# ---- certificates ----------------------------------------------------------

# cert NAME CN [O] [SANS] [EKU]: NAME.crt/.key signed by the cluster's CA.
cert() {
    local name=$1 cn=$2 org=${3:-} sans=${4:-} eku=${5:-clientAuth}
    local subj="/CN=$cn"
    [ -z "$org" ] || subj="/O=$org$subj"
    local ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku"
    [ -z "$sans" ] || ext="$ext
subjectAltName=$sans"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$C/pki/$name.key" -subj "$subj" -out "$C/pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$C/pki/$name.csr" -CA "$C/pki/ca.crt" -CAkey "$C/pki/ca.key" \
        -CAcreateserial -days 30 -extfile <(echo "$ext") -out "$C/pki/$name.crt" 2>/dev/null
    rm -f "$C/pki/$name.csr"
}

# kubeconfig NAME: NAME.kubeconfig with NAME's certificate, for the API
# server's address on the fabric.
kubeconfig() {
    local name=$1
    cat >"$C/pki/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: podgate-k8s
    cluster:
      server: https://$CP_IP:6443
      certificate-authority-data: $(base64 -w0 "$C/pki/ca.crt")
users:
  - name: $name
    user:
      client-certificate-data: $(base64 -w0 "$C/pki/$name.crt")
      client-key-data: $(base64 -w0 "$C/pki/$name.key")
contexts:
  - name: podgate-k8s
    context:
      cluster: podgate-k8s
      user: $name
current-context: podgate-k8s
EOF
}

make_pki() {
    mkdir -p "$C/pki"
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -keyout "$C/pki/ca.key" -out "$C/pki/ca.crt" -days 30 -subj "/CN=podgate-k8s-ca" 2>/dev/null
    openssl genrsa -out "$C/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$C/pki/sa.key" -pubout -out "$C/pki/sa.pub" 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:$CP_IP,IP:$SERVICE_API_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost" \
        serverAuth
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    cert admin kubernetes-admin system:masters
    cert controller-manager system:kube-controller-manager
    cert scheduler system:kube-scheduler
    cert kube-proxy system:kube-proxy
    local n
    for n in "${NODES[@]}"; do
        cert "kubelet-$n" "system:node:$n" system:nodes
        kubeconfig "kubelet-$n"
    done
    for n in admin controller-manager scheduler kube-proxy; do
        kubeconfig "$n"
    done
}

# The cluster's network namespaces that exist: exactly the names it makes
# (another cluster's name may start with this one's).
cluster_netns() {
    local n
    for n in fabric cp "${NODES[@]}"; do
        [ ! -e "/run/netns/$P-$n" ] || echo "$P-$n"
    done
}

# ---- networks ----------------------------------------------------------------

netns_add() {
    ip netns add "$P-$1"
    ip -n "$P-$1" link set lo up
}

# link_to_fabric NETNS IP: a veth from NETNS (uplink0) to the fabric bridge.
link_to_fabric() {
    local ns=$1 ip=$2
    ip -n "$P-fabric" link add "f-$ns" type veth peer name uplink0 netns "$P-$ns"
    ip -n "$P-fabric" link set "f-$ns" master fab0 up
    ip -n "$P-$ns" addr add "$ip/24" dev uplink0
    ip -n "$P-$ns" link set uplink0 up
    ip -n "$P-$ns" route add default via "$GATEWAY"
}

make_networks() {
    netns_add fabric
    # The underlay router (a VPC's): it routes the pod networks to their
    # nodes and nothing else, so what nobody routes (a reply to a VPN
    # client pool) is dropped here; strict pods' traffic crosses it.
    echo 1 | nsenter --net="/run/netns/$P-fabric" -- tee /proc/sys/net/ipv4/ip_forward >/dev/null
    ip -n "$P-fabric" link add fab0 type bridge
    ip -n "$P-fabric" addr add "$GATEWAY/24" dev fab0
    ip -n "$P-fabric" link set fab0 up
    netns_add cp
    link_to_fabric cp "$CP_IP"
    local n m
    for n in "${NODES[@]}"; do
        netns_add "$n"
        link_to_fabric "$n" "$(node_ip "$n")"
    done
    # host-gw: every node (and the underlay) routes the others' pod networks
    # via their address.
    for n in "${NODES[@]}"; do
        ip -n "$P-fabric" route add "$(pod_cidr "$n")" via "$(node_ip "$n")"
    done
    for n in "${NODES[@]}"; do
        for m in "${NODES[@]}"; do
            [ "$n" = "$m" ] || ip -n "$P-$n" route add "$(pod_cidr "$m")" via "$(node_ip "$m")"
        done
    done
}

# ---- control plane -------------------------------------------------------

start_control_plane() {
    mkdir -p "$C/etcd"
    start etcd cp - "$K8S_BIN/etcd" --name cp --data-dir "$C/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster cp=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
    wait_for etcd 60 in_cp curl -fsS http://127.0.0.1:2381/health
    local pki=$C/pki
    start kube-apiserver cp - "$K8S_BIN/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:2379 \
        --bind-address="$CP_IP" --advertise-address="$CP_IP" --secure-port=6443 \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --client-ca-file="$pki/ca.crt" \
        --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --allow-privileged=true --profiling=false --cert-dir="$C/apiserver"
    wait_for kube-apiserver 120 in_cp curl -fsS --cacert "$pki/ca.crt" \
        --cert "$pki/admin.crt" --key "$pki/admin.key" "https://$CP_IP:6443/readyz"
    start kube-controller-manager cp - "$K8S_BIN/kube-controller-manager" \
        --kubeconfig="$pki/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$pki/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$pki/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --allocate-node-cidrs=false --profiling=false
    start kube-scheduler cp - "$K8S_BIN/kube-scheduler" \
        --kubeconfig="$pki/scheduler.kubeconfig" \
        --authentication-kubeconfig="$pki/scheduler.kubeconfig" \
        --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

# ---- nodes -----------------------------------------------------------------

# The controllers the kubelets' cgroupRoot is made in: every mounted v1
# hierarchy (and the v2 one beside them, which runc also writes).
cgroup_hierarchies() {
    local d
    for d in /sys/fs/cgroup/*/; do
        d="${d%/}"
        mountpoint -q "$d" && echo "$d"
    done
}

make_cgroups() {
    local n=$1 h d
    while read -r h; do
        for d in "$h$CGROUP_ROOT" "$h$CGROUP_ROOT/$n"; do
            [ -d "$d" ] && continue
            mkdir "$d"
            # cpuset: a new v1 cgroup starts with no CPUs and no memory nodes.
            if [ -f "$d/cpuset.cpus" ]; then
                cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
                cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
            fi
        done
    done < <(cgroup_hierarchies)
}

# The node's own directories, bound over the machine's in its mount
# namespace (run inside it by make_mount_ns).
node_mounts() {
    local root=$1 p k
    for p in run var/lib var/log opt tmp etc/cni; do
        mkdir -p "$root/fs/$p"
        mount --bind "$root/fs/$p" "/$p"
    done
    mkdir -p /var/lib/kubelet /var/lib/containerd /var/lib/cni /opt/cni/bin \
        /etc/cni/net.d /run/netns /var/log/pods /var/log/containers
    mkdir -p "$root/sysctl"
    for k in "$@"; do
        [ -e "/proc/sys/$k" ] || continue
        cat "/proc/sys/$k" >"$root/sysctl/${k//\//.}"
        mount --bind "$root/sysctl/${k//\//.}" "/proc/sys/$k"
    done
    # As on a systemd host: the containers' HostToContainer mounts (rslave)
    # need their source shared or slave.
    mount --make-rshared /
}

make_mount_ns() {
    local n=$1
    touch "$C/ns/$n"
    unshare --mount="$C/ns/$n" --propagation slave -- \
        bash -c "set -euo pipefail; $(declare -f node_mounts); node_mounts \"\$@\"" \
        node_mounts "$C/nodes/$n" "${KUBELET_SYSCTLS[@]}"
}

# The primary CNI every node is provisioned with: bridge + host-local on
# the first nodes (Debian's reference plugins, spec 1.0.0), ptp + host-local
# (a routed primary, one /32 per pod, which strict routing needs) on the
# last, labelled podgate-k8s/primary=ptp. With containerd 2.x that node runs
# the reference plugins v1.10.0 at spec 1.1.0 (integration/go-tools.sh), so
# the runtime's STATUS and GC reach the chain; Debian's containerd 1.6
# (libcni 1.1) stops at spec 1.0.0, and so do Debian's plugins.
PTP_NODE=node-3
provision_cni() {
    local n=$1 root="$C/nodes/$1/fs" first plugins=/usr/lib/cni version=1.0.0
    if [ "$n" = "$PTP_NODE" ]; then
        first='"type": "ptp", "ipMasq": false'
        if [ "$(cat "$C/containerd")" = 2 ]; then
            plugins="$(bash "$here/../go-tools.sh" dir plugins)"
            version=1.1.0
        fi
    else
        first='"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true'
    fi
    cp "$plugins"/{bridge,ptp,host-local,loopback,portmap} "$root/opt/cni/bin/"
    cat >"$root/etc/cni/net.d/10-podnet.conflist" <<EOF
{
  "cniVersion": "$version",
  "name": "podnet",
  "plugins": [
    {
      $first,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(pod_cidr "$n")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
  ]
}
EOF
}

containerd_config() {
    local n=$1
    if [ "$(cat "$C/containerd")" = 2 ]; then
        cat <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  # No CAP_SYS_RESOURCE here.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
    else
        cat <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
EOF
    fi
}

kubelet_config() {
    local n=$1
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $C/pki/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT/$n
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
resolvConf: /etc/resolv.conf
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

kube_proxy_config() {
    local n=$1
    cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $C/pki/kube-proxy.kubeconfig
mode: nftables
hostnameOverride: $n
clusterCIDR: $CLUSTER_CIDR
detectLocalMode: ClusterCIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# nf_conntrack_max is the machine's (read-only in a netns): leave it, and
# the conntrack timeouts, alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
}

start_containerd() {
    local n=$1
    containerd_config "$n" >"$C/nodes/$n/containerd.toml"
    # Its shim (containerd-shim-runc-v2) is looked up on PATH: the one of
    # its own generation first.
    PATH="$CONTAINERD_BIN:$PATH" start "containerd-$n" "$n" "$n" "$CONTAINERD_BIN/containerd" \
        --config "$C/nodes/$n/containerd.toml"
    wait_for "containerd on $n" 60 on_node "$n" "$CONTAINERD_BIN/ctr" \
        --address /run/containerd/containerd.sock version
}

# import NODE ARCHIVE: an image (docker or OCI archive) into the node's CRI
# namespace.
import_image() {
    on_node "$1" "$CONTAINERD_BIN/ctr" --address /run/containerd/containerd.sock \
        -n k8s.io images import --no-unpack=false "$2" >/dev/null
}

start_kubelet() {
    local n=$1
    kubelet_config "$n" >"$C/nodes/$n/kubelet.yaml"
    local primary=bridge
    [ "$n" != "$PTP_NODE" ] || primary=ptp
    start "kubelet-$n" "$n" "$n" "$K8S_BIN/kubelet" --config="$C/nodes/$n/kubelet.yaml" \
        --kubeconfig="$C/pki/kubelet-$n.kubeconfig" --hostname-override="$n" \
        --node-ip="$(node_ip "$n")" --node-labels="podgate-k8s/primary=$primary" --v=2
}

start_kube_proxy() {
    local n=$1
    kube_proxy_config "$n" >"$C/nodes/$n/kube-proxy.yaml"
    start "kube-proxy-$n" "$n" "$n" "$K8S_BIN/kube-proxy" --config="$C/nodes/$n/kube-proxy.yaml"
}

start_node() {
    local n=$1
    start_containerd "$n"
    import_image "$n" "$C/images/pause.tar"
    start_kubelet "$n"
    start_kube_proxy "$n"
}

make_node() {
    local n=$1
    mkdir -p "$C/nodes/$n"
    make_cgroups "$n"
    make_mount_ns "$n"
    provision_cni "$n"
}

# stop_node NODE: what the node's shutdown stops: kube-proxy, the kubelet,
# containerd and every process of its pods (shims, sandboxes, containers).
stop_node() {
    local n=$1 h pids round
    stop_pid "kube-proxy-$n"
    stop_pid "kubelet-$n"
    stop_pid "containerd-$n"
    for round in $(seq 50); do
        pids="$({
            while read -r h; do
                [ -d "$h$CGROUP_ROOT/$n" ] && find "$h$CGROUP_ROOT/$n" -name cgroup.procs -exec cat {} + 2>/dev/null
            done < <(cgroup_hierarchies)
            find /proc/[0-9]*/ns -maxdepth 1 -name mnt -printf '%l %p\n' 2>/dev/null |
                grep -F "mnt:[$(stat -L -c %i "$C/ns/$n")] " | sed -E 's|.* /proc/([0-9]+)/ns/.*|\1|'
        } | sort -u | tr '\n' ' ' || true)"
        [ -n "${pids// /}" ] || return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    fail "stop-node $n: processes left: $pids"
}

# reboot_node NODE: the node stopped, then what a reboot takes away: every
# mount (its mount namespace made anew), its network namespace (made anew,
# linked to the fabric again), its cgroups and /run; /var/lib, /var/log,
# /opt and /etc/cni stay, as on a disk.
reboot_node() {
    local n=$1 m
    stop_node "$n"
    umount "$C/ns/$n"
    # The fabric's end of the node's uplink first: a deleted netns is torn
    # down by the kernel later, with its veth pair.
    ip -n "$P-fabric" link del "f-$n"
    ip netns del "$P-$n"
    netns_add "$n"
    link_to_fabric "$n" "$(node_ip "$n")"
    for m in "${NODES[@]}"; do
        [ "$n" = "$m" ] || ip -n "$P-$n" route add "$(pod_cidr "$m")" via "$(node_ip "$m")"
    done
    local h
    while read -r h; do
        [ -d "$h$CGROUP_ROOT/$n" ] && find "$h$CGROUP_ROOT/$n" -depth -type d -exec rmdir {} \;
    done < <(cgroup_hierarchies)
    rm -rf "${C:?}/nodes/$n/fs/run"
    make_cgroups "$n"
    make_mount_ns "$n"
}

# ---- images ----------------------------------------------------------------

pause_image() {
    bash "$here/images/build.sh" pause "$C/images/pause.tar"
}

# ---- up / down ---------------------------------------------------------------

up() {
    local gen=debian
    while [ "$#" -gt 0 ]; do
        case "$1" in
        --containerd) gen="${2:-}" && shift 2 ;;
        *) fail "up: unknown argument $1" ;;
        esac
    done
    case "$gen" in debian | 2) ;; *) fail "--containerd debian|2" ;; esac
    [ "$(id -u)" -eq 0 ] || fail "run as root"
    if [ -e "$C" ] || [ -n "$(cluster_netns)" ]; then
        fail "a cluster exists ($C, or netns $(cluster_netns)): run '$0 down' first"
    fi
    [ -d /etc/cni ] || fail "/etc/cni missing: the nodes' /etc/cni is bound over it (install-deps.sh makes it)"
    containerd_gen=$gen
    load_bins
    mkdir -p "$C"/{pids,logs,ns,images}
    echo "$gen" >"$C/containerd"
    # The nodes' mount namespaces are kept by files on a private mount.
    mount --bind "$C/ns" "$C/ns"
    mount --make-private "$C/ns"
    trap 'say "up failed; removing what it made"; down_all; exit 1' ERR
    make_pki
    make_networks
    pause_image
    start_control_plane
    local n
    for n in "${NODES[@]}"; do
        make_node "$n"
        start_node "$n"
    done
    for n in "${NODES[@]}"; do
        wait_for "node $n Ready" 180 kubectl_ wait --for=condition=Ready "node/$n" --timeout=1s
    done
    trap - ERR
    say "up: $(kubectl_ get nodes --no-headers | wc -l) nodes Ready; containerd $gen"
    say "use it with: $0 shell   (or $0 run kubectl get nodes)"
    echo "KUBECONFIG=$C/pki/admin.kubeconfig"
}

# Processes to stop: daemons by pid file, then whatever is left in the
# cluster's cgroups and namespaces (shims, containers, nsenter).
kill_everything() {
    local name
    for name in kubelet-node-1 kubelet-node-2 kubelet-node-3 kube-proxy-node-1 kube-proxy-node-2 \
        kube-proxy-node-3 kube-scheduler kube-controller-manager kube-apiserver etcd; do
        stop_pid "$name"
    done
    local f
    for f in "$C"/pids/*; do
        [ -e "$f" ] && stop_pid "$(basename "$f")"
    done
    local round
    for round in $(seq 50); do
        local pids
        pids="$(cluster_pids)"
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    say "warning: processes left: $(cluster_pids)"
}

# Every process in the cluster's cgroups or in one of its namespaces.
cluster_pids() {
    local f ns=()
    for f in $(cluster_netns); do
        f=/run/netns/$f
        [ -e "$f" ] && ns+=("net:[$(stat -L -c %i "$f")]")
    done
    for f in "$C"/ns/*; do
        mountpoint -q "$f" 2>/dev/null && ns+=("mnt:[$(stat -L -c %i "$f")]")
    done
    {
        local h
        while read -r h; do
            [ -d "$h$CGROUP_ROOT" ] && find "$h$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null
        done < <(cgroup_hierarchies)
        if [ "${#ns[@]}" -gt 0 ]; then
            find /proc/[0-9]*/ns -maxdepth 1 \( -name net -o -name mnt \) -printf '%l %p\n' 2>/dev/null |
                grep -F "$(printf '%s \n' "${ns[@]}")" | sed -E 's|.* /proc/([0-9]+)/ns/.*|\1|'
        fi
    } | grep -vx "$$" | sort -u | tr '\n' ' ' || true
}

remove_cgroups() {
    local h
    while read -r h; do
        [ -d "$h$CGROUP_ROOT" ] || continue
        find "$h$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [ ! -d "$h$CGROUP_ROOT" ] || say "warning: $h$CGROUP_ROOT not removed"
    done < <(cgroup_hierarchies)
}

down_all() {
    kill_everything
    local f
    for f in "$C"/ns/*; do
        [ -e "$f" ] && umount "$f" 2>/dev/null || true
    done
    # Whatever is still mounted under the cluster's directory on the machine.
    local m
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v d="$C" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
    for f in $(cluster_netns); do
        ip netns del "$f"
    done
    remove_cgroups
    rm -rf "$C"
}

down() {
    [ "$(id -u)" -eq 0 ] || fail "run as root"
    down_all
    say "down: nothing of the cluster is left"
}

status() {
    [ -d "$C" ] || {
        echo "no cluster"
        return 1
    }
    load_bins
    local f
    for f in "$C"/pids/*; do
        if kill -0 "$(cat "$f")" 2>/dev/null; then
            echo "$(basename "$f"): running (pid $(cat "$f"))"
        else
            echo "$(basename "$f"): NOT running"
        fi
    done
    kubectl_ get nodes -o wide
}

# run CMD...: in the control plane's netns with KUBECONFIG and PATH set
# (kubectl, helm, crictl and the cluster's tools first on PATH).
run_cmd() {
    load_bins
    KUBECONFIG="$C/pki/admin.kubeconfig" PATH="$K8S_BIN:$HELM_BIN:$PATH" in_cp "$@"
}

case "${1:-}" in
up) shift && up "$@" ;;
down) down ;;
status) status ;;
shell) run_cmd bash ;;
run) shift && run_cmd "$@" ;;
node)
    [ "$#" -ge 3 ] || fail "node NODE CMD..."
    load_bins
    node_index "$2" >/dev/null
    n=$2
    shift 2
    PATH="$K8S_BIN:$CONTAINERD_BIN:$PATH" CONTAINER_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock on_node "$n" "$@"
    ;;
restart)
    [ "$#" -eq 3 ] || fail "restart NODE kubelet|containerd|kube-proxy"
    load_bins
    node_index "$2" >/dev/null
    case "$3" in
    kubelet) stop_pid "kubelet-$2" && start_kubelet "$2" ;;
    containerd) stop_pid "containerd-$2" && start_containerd "$2" ;;
    kube-proxy) stop_pid "kube-proxy-$2" && start_kube_proxy "$2" ;;
    *) fail "restart: kubelet, containerd or kube-proxy" ;;
    esac
    ;;
stop-node)
    [ "$#" -eq 2 ] || fail "stop-node NODE"
    load_bins
    node_index "$2" >/dev/null
    stop_node "$2"
    ;;
start-node)
    [ "$#" -ge 2 ] || fail "start-node NODE [--reboot]"
    load_bins
    node_index "$2" >/dev/null
    [ "${3:-}" != --reboot ] || reboot_node "$2"
    start_node "$2"
    ;;
load-image)
    [ "$#" -eq 2 ] || fail "load-image ARCHIVE"
    load_bins
    for n in "${NODES[@]}"; do import_image "$n" "$(realpath "$2")"; done
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 64
    ;;
esac
