# shellcheck shell=bash
# One node netns and one pod netns joined by a veth, and a podgate-router
# config for them: what perfstat.sh and syscalls.sh measure
# in. Source it, then call `bench_pod_netns PREFIX CNI_VERSION`:
#   node=pg-PREFIX-node-<pid>-<rand>  the node netns (pgph1 10.22.1.1/24, forwarding on)
#   pod=pg-PREFIX-pod-<pid>-<rand>    the pod netns (eth0 10.22.1.5/24, forwarding OFF,
#                                     so every ADD really writes it and every DEL puts it back)
#   tmp=/tmp/podgate-PREFIX-XXXXXX    $tmp/conf.json: profiles vpn-gateway (ip_forward +
#                                     masquerade 10.8.0.0/24), vpn-routed (+ node return
#                                     route 10.9.0.0/24), vpn-full (both), assigned to the
#                                     pods bench/<profile name>; state dir and log in $tmp
# and exports CNI_NETNS, CNI_IFNAME, CNI_PATH; `in_node CMD...` runs CMD in the
# node netns. Both namespaces and $tmp are removed on every exit path (an EXIT
# trap); the machine's own namespace is never touched.
bench_pod_netns() { # PREFIX CNI_VERSION
    local tag=$$-$RANDOM
    node=pg-$1-node-$tag
    pod=pg-$1-pod-$tag
    tmp=$(mktemp -d "/tmp/podgate-$1-XXXXXX")
    trap bench_pod_netns_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ip netns add "$node"
    ip netns add "$pod"
    ip -n "$node" link set lo up
    ip -n "$pod" link set lo up
    ip -n "$node" link add pgph1 type veth peer name eth0 netns "$pod"
    ip -n "$node" addr add 10.22.1.1/24 dev pgph1
    ip -n "$node" link set pgph1 up
    ip -n "$pod" addr add 10.22.1.5/24 dev eth0
    ip -n "$pod" link set eth0 up
    ip -n "$pod" route add default via 10.22.1.1
    in_node sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
    nsenter --net=/var/run/netns/"$pod" sh -c 'echo 0 > /proc/sys/net/ipv4/ip_forward'
    cat >"$tmp/conf.json" <<EOC
{"cniVersion":"$2","name":"bench","type":"podgate-router",
 "stateDir":"$tmp/state","logFile":"$tmp/router.log",
 "profiles":{
  "vpn-gateway":{"sysctls":{"net.ipv4.ip_forward":"1"},"masquerade":[{"source":"10.8.0.0/24"}]},
  "vpn-routed":{"sysctls":{"net.ipv4.ip_forward":"1"},"returnRoutes":[{"dst":"10.9.0.0/24"}]},
  "vpn-full":{"sysctls":{"net.ipv4.ip_forward":"1"},"masquerade":[{"source":"10.8.0.0/24"}],"returnRoutes":[{"dst":"10.9.0.0/24"}]}},
 "assign":[{"namespace":"bench","podName":"vpn-gateway","profile":"vpn-gateway"},
           {"namespace":"bench","podName":"vpn-routed","profile":"vpn-routed"},
           {"namespace":"bench","podName":"vpn-full","profile":"vpn-full"}],
 "allow":{"annotationNamespaces":["bench"],"pools":["10.8.0.0/16","10.9.0.0/16"]},
 "prevResult":{"cniVersion":"$2","interfaces":[{"name":"pgph1"},{"name":"eth0","sandbox":"/var/run/netns/$pod"}],
   "ips":[{"address":"10.22.1.5/24","gateway":"10.22.1.1","interface":1}],
   "routes":[{"dst":"0.0.0.0/0","gw":"10.22.1.1"}]}}
EOC
    export CNI_NETNS=/var/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni
}

bench_pod_netns_cleanup() {
    ip netns del "$pod" 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
    rm -rf "$tmp"
}

in_node() { nsenter --net=/var/run/netns/"$node" "$@"; }
