#!/bin/bash
# Load-independent figures for one ADD (by default a masquerade ADD: sysctl ip_forward=1 +
# masquerade, the bench's vpn-gateway profile): user-space instructions
# (where the machine has a PMU; callgrind's count otherwise), context
# switches and page faults from `perf stat -r N` (each ADD followed by its
# DEL through --post, which perf does not count; its wall time is not
# load-independent), context switches of all threads from wait4's rusage, and
# the syscall count from `strace -f -c`. Compares any number of router binaries in the
# same node/pod namespaces, alternating them:
#
#   integration/bench/perfstat.sh [-r RUNS] [-p PROFILE] ROUTER_BINARY...
#
# PROFILE: vpn-gateway (default: ip_forward + masquerade) or vpn-routed
# (ip_forward + one IPv4 node return route, 10.9.0.0/24).
#
# Namespaces are made here (pg-perf-*) and removed on every exit path; the
# machine's own namespace is never touched.
set -eu
runs=200
profile=vpn-gateway
while [ $# -ge 2 ]; do
    case $1 in
    -r) runs=$2; shift 2 ;;
    -p) profile=$2; shift 2 ;;
    *) break ;;
    esac
done
case $profile in vpn-gateway | vpn-routed) ;; *) echo "$0: unknown profile $profile" >&2; exit 2 ;; esac
[ $# -ge 1 ] || { echo "usage: $0 [-r RUNS] [-p PROFILE] ROUTER..." >&2; exit 2; }
for b in "$@"; do [ -x "$b" ] || { echo "$0: $b not executable" >&2; exit 2; }; done
command -v perf >/dev/null || { echo "$0: perf missing (linux-perf)" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=integration/bench/pod-netns.sh
. "$here/pod-netns.sh"
bench_pod_netns perf 1.0.0
export CNI_CONTAINERID=perf-1
export CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=$profile"

check_one() {
    local b=$1 fwd
    CNI_COMMAND=ADD in_node "$b" <"$tmp/conf.json" >/dev/null
    fwd=$(ip netns exec "$pod" cat /proc/sys/net/ipv4/ip_forward)
    if [ "$profile" = vpn-gateway ]; then
        ip netns exec "$pod" nft list tables | grep -q . || { echo "$b: no nft table after ADD" >&2; exit 1; }
    else
        ip -n "$node" route show 10.9.0.0/24 | grep -q "via 10.22.1.5" ||
            { echo "$b: no return route after ADD" >&2; exit 1; }
    fi
    CNI_COMMAND=DEL in_node "$b" <"$tmp/conf.json" >/dev/null
    [ "$fwd" = 1 ] && [ "$(ip netns exec "$pod" cat /proc/sys/net/ipv4/ip_forward)" = 0 ] ||
        { echo "$b: ADD did not set ip_forward or DEL did not restore it" >&2; exit 1; }
}

# perf's --post takes one command: DEL with the binary of this series.
printf '#!/bin/sh\nCNI_COMMAND=DEL exec "$ROUTER" <%s >/dev/null\n' "$tmp/conf.json" >"$tmp/del.sh"
chmod +x "$tmp/del.sh"
for b in "$@"; do check_one "$b"; done
# One perf stat per ADD (stdin is the conf, read once per process: `perf
# stat -r` would hand the later runs an empty stdin), DEL after each, the
# counts averaged here.
for round in 1 2; do
    for b in "$@"; do
        : >"$tmp/perf.csv"
        for _ in $(seq "$runs"); do
            CNI_COMMAND=ADD in_node perf stat -x, -o "$tmp/one.csv" \
                -e instructions:u,task-clock,context-switches,page-faults -- "$b" \
                <"$tmp/conf.json" >/dev/null
            grep -v '^#' "$tmp/one.csv" | grep . >>"$tmp/perf.csv"
            CNI_COMMAND=DEL in_node "$b" <"$tmp/conf.json" >/dev/null
        done
        echo "== $b (round $round: mean of $runs ADDs, each followed by its uncounted DEL)"
        awk -F, '$1 ~ /^[0-9.]+$/ { s[$3] += $1; n[$3]++ } END { for (k in s) printf "  %-20s %12.3f\n", k, s[k] / n[k] }' \
            "$tmp/perf.csv" | sort
    done
done
for b in "$@"; do
    # Context switches of all threads (wait4's rusage), summed over the runs.
    vol=0 invol=0
    for _ in $(seq "$runs"); do
        CNI_COMMAND=ADD in_node /usr/bin/time -f "%w %c" -o "$tmp/time.txt" "$b" \
            <"$tmp/conf.json" >/dev/null
        read -r v i <"$tmp/time.txt"
        vol=$((vol + v)) invol=$((invol + i))
        CNI_COMMAND=DEL in_node "$b" <"$tmp/conf.json" >/dev/null
    done
    echo "== $b: context switches per ADD over $runs (rusage, all threads): voluntary $(echo "scale=2; $vol/$runs" | bc) involuntary $(echo "scale=2; $invol/$runs" | bc)"
    if command -v valgrind >/dev/null; then
        CNI_COMMAND=ADD in_node valgrind --tool=callgrind --callgrind-out-file=/dev/null "$b" \
            <"$tmp/conf.json" >/dev/null 2>"$tmp/cg.txt" || true
        CNI_COMMAND=DEL in_node "$b" <"$tmp/conf.json" >/dev/null
        echo "  user-space instructions of one ADD (callgrind, all threads): $(sed -n 's/.*Collected : //p' "$tmp/cg.txt")"
    fi
    echo "== $b: syscalls of one ADD (strace -f -c)"
    CNI_COMMAND=ADD in_node strace -f -c -o "$tmp/strace.txt" "$b" <"$tmp/conf.json" >/dev/null
    tail -n 1 "$tmp/strace.txt" | awk '{print "  total syscalls:", $4}'
    grep -E ' (clone3|futex|setns|openat|read|pread64|pwrite64|write|socket|getsockopt|close)$' "$tmp/strace.txt" |
        awk '{printf "  %-12s %s\n", $NF, $4}'
    CNI_COMMAND=DEL in_node strace -f -c -o "$tmp/strace.txt" "$b" <"$tmp/conf.json" >/dev/null
    echo "== $b: syscalls of its DEL: $(tail -n 1 "$tmp/strace.txt" | awk '{print $4}')" \
        "(futex $(awk '$NF == "futex" {print $4}' "$tmp/strace.txt"))"
done
