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

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=integration/bench/pod-netns.sh
. "$here/pod-netns.sh"
bench_pod_netns sysc 1.1.0
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
