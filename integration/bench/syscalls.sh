#!/bin/bash
# Syscall counts (`strace -f -c`, load-independent) of one call of each kind,
# for any number of router binaries in the same node/pod namespaces:
# ADD and DEL of the masquerade profile (vpn-gateway: ip_forward +
# masquerade), of the return-route profile (vpn-routed: ip_forward + one
# IPv4 node return route) and of a pod without a profile (pass-through),
# then GC collecting one return-route attachment, GC with nothing to
# collect, and GC keeping one valid attachment. With -o DIR, the full
# `strace -f` of each call is kept there (DIR/<binary>/<call>.trace) to
# see what a call observes.
#
#   integration/bench/syscalls.sh [-o DIR] ROUTER_BINARY...
#
# Namespaces are made here (pg-sysc-*) and removed on every exit path; the
# machine's own namespace is never touched.
set -eu
out=
if [ "${1:-}" = -o ]; then out=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: $0 [-o DIR] ROUTER..." >&2; exit 2; }
for b in "$@"; do [ -x "$b" ] || { echo "$0: $b not executable" >&2; exit 2; }; done
command -v strace >/dev/null || { echo "$0: strace missing" >&2; exit 2; }

tag=$$-$RANDOM
node=pg-sysc-node-$tag
pod=pg-sysc-pod-$tag
tmp=$(mktemp -d /tmp/podgate-sysc-XXXXXX)
cleanup() {
    ip netns del "$pod" 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

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
ip netns exec "$node" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
# Off, so every ADD really writes it and every DEL puts it back.
ip netns exec "$pod" sh -c 'echo 0 > /proc/sys/net/ipv4/ip_forward'

cat >"$tmp/conf.json" <<EOF
{"cniVersion":"1.1.0","name":"bench","type":"podgate-router",
 "stateDir":"$tmp/state","logFile":"$tmp/router.log",
 "profiles":{"vpn-gateway":{"sysctls":{"net.ipv4.ip_forward":"1"},"masquerade":[{"source":"10.8.0.0/24"}]},
   "vpn-routed":{"sysctls":{"net.ipv4.ip_forward":"1"},"returnRoutes":[{"dst":"10.9.0.0/24"}]}},
 "assign":[{"namespace":"bench","podName":"vpn-gateway","profile":"vpn-gateway"},
   {"namespace":"bench","podName":"vpn-routed","profile":"vpn-routed"}],
 "allow":{"annotationNamespaces":["bench"],"pools":["10.8.0.0/16","10.9.0.0/16"]},
 "prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"pgph1"},{"name":"eth0","sandbox":"/var/run/netns/$pod"}],
   "ips":[{"address":"10.22.1.5/24","gateway":"10.22.1.1","interface":1}],
   "routes":[{"dst":"0.0.0.0/0","gw":"10.22.1.1"}]}}
EOF
# GC's config: no prevResult, the valid attachments named per call.
gc_conf() {
    python3 - "$tmp/conf.json" "$@" <<'EOP'
import json, sys
c = json.load(open(sys.argv[1]))
c.pop("prevResult")
c["cni.dev/valid-attachments"] = [{"containerID": v, "ifname": "eth0"} for v in sys.argv[2:]]
print(json.dumps(c))
EOP
}
gc_conf >"$tmp/gc-none.json"
gc_conf keep >"$tmp/gc-keep.json"
export CNI_NETNS=/var/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni
in_node() { nsenter --net=/var/run/netns/"$node" "$@"; }
args() { echo "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=$1"; }

# `count BINARY NAME CONF COMMAND CONTAINER POD [READD]`: one traced call,
# its total. READD: the attachment GC collects, ADDed again after the kept
# trace so the counted call collects it too.
count() {
    local b=$1 name=$2 conf=$3 cmd=$4 cid=$5 podname=$6 readd=${7:-} dir
    if [ -n "$out" ]; then
        dir=$out/$(basename "$b")
        mkdir -p "$dir"
        CNI_COMMAND=$cmd CNI_CONTAINERID=$cid CNI_ARGS=$(args "$podname") in_node \
            strace -f -o "$dir/$name.trace" "$b" <"$conf" >/dev/null
        # Undo what the traced call did, so the counted call below sees the same state.
        case $cmd in
        ADD) CNI_COMMAND=DEL CNI_CONTAINERID=$cid CNI_ARGS=$(args "$podname") in_node "$b" <"$conf" >/dev/null ;;
        DEL) CNI_COMMAND=ADD CNI_CONTAINERID=$cid CNI_ARGS=$(args "$podname") in_node "$b" <"$conf" >/dev/null ;;
        GC) [ -z "$readd" ] || call "$b" ADD "$readd" vpn-routed ;;
        esac
    fi
    CNI_COMMAND=$cmd CNI_CONTAINERID=$cid CNI_ARGS=$(args "$podname") in_node \
        strace -f -c -o "$tmp/count.txt" "$b" <"$conf" >/dev/null
    printf '  %-44s %5s\n' "$name" "$(tail -n 1 "$tmp/count.txt" | awk '{print $4}')"
}
call() {
    CNI_COMMAND=$2 CNI_CONTAINERID=$3 CNI_ARGS=$(args "$4") in_node "$1" <"$tmp/conf.json" >/dev/null
}

for b in "$@"; do
    echo "== $b: syscalls per call (strace -f -c)"
    for p in vpn-gateway vpn-routed passthrough; do
        # A first ADD/DEL warms the state dir (lock files, directories).
        call "$b" ADD c1 "$p"
        call "$b" DEL c1 "$p"
        count "$b" "ADD $p" "$tmp/conf.json" ADD c1 "$p"
        count "$b" "DEL $p" "$tmp/conf.json" DEL c1 "$p"
    done
    call "$b" ADD c1 vpn-routed
    count "$b" "GC collecting one vpn-routed attachment" "$tmp/gc-none.json" GC - - c1
    count "$b" "GC with nothing to collect" "$tmp/gc-none.json" GC - -
    call "$b" ADD keep vpn-routed
    count "$b" "GC keeping one valid vpn-routed attachment" "$tmp/gc-keep.json" GC - -
    call "$b" DEL keep vpn-routed
    [ -z "$(ls "$tmp/state"/*.json 2>/dev/null)" ] || { echo "$0: $b left records: $(ls "$tmp/state")" >&2; exit 1; }
done
