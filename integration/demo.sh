#!/usr/bin/env bash
# The main job on an embedded default: build podgate, make a throwaway "node"
# and "pod" network namespace, run a conflist (bridge + host-local + portmap +
# podgate-router) through the real libcni, and show what podgate changed.
# Everything happens inside namespaces this script creates and removes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: run as root (it creates network namespaces)" >&2; exit 1; }

echo "== installing dependencies and building podgate (release)"
bash integration/install-deps.sh
cargo build --release --bins --quiet
bin="$root/target/release"
runner="$root/target/cnirunner"

tag="$$"
node="pgdemo-node-$tag"
pod="pgdemo-pod-$tag"
work="$(mktemp -d /tmp/podgate-demo.XXXXXX)"
cleanup() {
    ip netns exec "$node" "$runner" del --conf-dir "$work/net.d" --name demo \
        --netns "/var/run/netns/$pod" --container-id demo-openvpn-0 \
        --cni-path "$work/bin" --cache-dir "$work/cache" \
        --args "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0" >/dev/null 2>&1 || true
    ip netns del "$pod" 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/net.d" "$work/bin" "$work/cache" "$work/ipam" "$work/state"
ln -s /usr/lib/cni/* "$work/bin/"
ln -s "$bin/podgate-router" "$bin/podgate-tunnel-guard" "$work/bin/"

ip netns add "$node"
ip netns add "$pod"
ip -n "$node" link set lo up
ip -n "$pod" link set lo up
ip netns exec "$node" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
# The broken state under test: forwarding is off inside the pod's own namespace.
ip netns exec "$pod" sh -c 'echo 0 > /proc/sys/net/ipv4/ip_forward'

cat > "$work/net.d/10-demo.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "demo",
  "plugins": [
    {"type": "bridge", "bridge": "cni-demo0", "isGateway": true,
     "ipam": {"type": "host-local", "dataDir": "$work/ipam",
              "ranges": [[{"subnet": "10.22.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "podgate-router", "stateDir": "$work/state", "logFile": "$work/router.log",
     "capabilities": {"io.kubernetes.cri.pod-annotations": true},
     "profiles": {
       "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]},
       "vpn-routed":  {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": "10.8.0.0/24"}]}
     },
     "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn", "profile": "vpn-gateway"}],
     "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}}
  ]
}
JSON

show() { printf '\n-- %s\n' "$1"; }
show "conflist: $work/net.d/10-demo.conflist (bridge + host-local + portmap + podgate-router)"
show "before: pod net.ipv4.ip_forward = $(ip netns exec "$pod" cat /proc/sys/net/ipv4/ip_forward)"

show "ADD vpn/openvpn-0 through libcni (result):"
ip netns exec "$node" "$runner" add --conf-dir "$work/net.d" --name demo \
    --netns "/var/run/netns/$pod" --container-id demo-openvpn-0 \
    --cni-path "$work/bin" --cache-dir "$work/cache" \
    --args "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0" \
    --capability-args '{"portMappings":[{"hostPort":1194,"containerPort":1194,"protocol":"udp"}]}' | jq .

show "after: pod net.ipv4.ip_forward = $(ip netns exec "$pod" cat /proc/sys/net/ipv4/ip_forward)"
show "pod nftables (podgate's own table):"
ip netns exec "$pod" nft list table inet podgate-eth0
show "podgate inspect (what podgate-router applied, and whether it still holds):"
ip netns exec "$node" "$bin/podgate" inspect --all --state-dir "$work/state"
show "podgate sysctl diff (pod next to node):"
ip netns exec "$node" "$bin/podgate" sysctl diff --netns "/var/run/netns/$pod"
show "router log:"
cat "$work/router.log"

show "DEL through libcni"
ip netns exec "$node" "$runner" del --conf-dir "$work/net.d" --name demo \
    --netns "/var/run/netns/$pod" --container-id demo-openvpn-0 \
    --cni-path "$work/bin" --cache-dir "$work/cache" \
    --args "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0" \
    --capability-args '{"portMappings":[{"hostPort":1194,"containerPort":1194,"protocol":"udp"}]}'
show "after DEL: pod ip_forward = $(ip netns exec "$pod" cat /proc/sys/net/ipv4/ip_forward); state records: $(find "$work/state" -name '*.json' | wc -l)"
