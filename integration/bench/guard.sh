#!/usr/bin/env bash
# Benchmark: whole-process ADD latency of podgate-tunnel-guard (release build)
# on a ready node: the fixture agent's protection endpoint armed (answering
# /armed from its live readback), a real ovsdb-server with the lease keys and
# marked OVN tunnel interfaces, the guards of both families, and 4,000 XFRM
# policies (2 per peer of a 2,000-node cluster, as strongSwan installs them:
# out + in, udp/6081, the lease mark on out, ESP templates with the lease
# reqid) and 10,000 (5,000 peers, the node-scale target) versus 10. Every measured ADD must be a real "ready" verdict (checked
# in the plugin's log), not a pass-through. Prints medians, their ratio and
# peak RSS. Target: median <= 5 ms at 4,000 and at 10,000 policies. Timing: a posix_spawn/waitpid loop (no
# shell), cross-checked with hyperfine when installed.
#
# Root only. Everything happens in a private netns and temp dir, removed on
# exit. Not a timed test: run it by hand, or through integration/bench/run.sh.
#   integration/bench/guard.sh [RUNS]        (default 300)
# Environment: GUARD_BIN (benchmark another build, skips cargo build),
# GUARD_BEFORE=path (another build, e.g. the previous release, run alternately
# with GUARD_BIN in the same loop: its medians are printed beside, a fair
# comparison on a machine whose speed drifts),
# GUARD_JSON=path (also write the results as JSON), GUARD_HYPERFINE=0 (skip
# the hyperfine cross-check, as run.sh --short does), GUARD_TUNNELS=N (OVN
# tunnel interfaces in OVSDB, default 10; 2000 matches the 2,000-peer policy
# count and measures the OVSDB side at that scale).
set -euo pipefail

runs="${1:-300}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
bin="${GUARD_BIN:-$target/release/podgate-tunnel-guard}"  # GUARD_BIN: benchmark another build
before="${GUARD_BEFORE:-}"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
mark=759815
reqid=31337
tunnels="${GUARD_TUNNELS:-10}"
node_ip=10.0.0.1

if [ "$(id -u)" -ne 0 ]; then
    echo "guard.sh: must run as root (creates a network namespace)" >&2
    exit 1
fi
for tool in ip ovsdb-tool ovsdb-server ovs-vsctl jq; do
    command -v "$tool" >/dev/null || { echo "guard.sh: $tool missing (integration/install-deps.sh)" >&2; exit 1; }
done

[ -n "${GUARD_BIN:-}" ] || (cd "$root" && cargo build -q --release -p podgate-tunnel-guard)

ns="pg-bench-guard-$$"
tmp="$(mktemp -d /tmp/podgate-bench-guard.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up

# A ready node: ovsdb with system-id, the agent's lease and marked OVN tunnels,
# both guards, then the fixture agent (armed: it holds the lease).
ovsdb-tool create "$tmp/conf.db" /usr/share/openvswitch/vswitch.ovsschema
ovsdb-server "$tmp/conf.db" --remote="punix:$tmp/db.sock" --unixctl="$tmp/ovsdb.ctl" \
    --log-file="$tmp/ovsdb.log" --no-chdir -vconsole:off </dev/null >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    [ -S "$tmp/db.sock" ] && break
    sleep 0.05
done
vsctl() { ovs-vsctl --db="unix:$tmp/db.sock" --no-wait --retry --timeout=60 "$@"; }
vsctl init
vsctl set Open_vSwitch . external_ids:system-id=bench-chassis \
    external_ids:ovn-ipsec-protection-node-uid=bench-uid \
    external_ids:ovn-ipsec-protection-lease=BENCHLEASE \
    external_ids:ovn-ipsec-protection-mark=$mark \
    external_ids:ovn-ipsec-protection-reqid=$reqid
# All tunnel ports in one transaction, as ovn-controller makes them (IPsec
# variant: remote_name, and the agent's three options).
tunnel_args=(--may-exist add-br br-int)
for ((i = 0; i < tunnels; i++)); do
    a=$((i / 250 + 1)) b=$((i % 250 + 1)) name="ovn-p$i-0"
    tunnel_args+=(-- add-port br-int "$name" -- set Interface "$name" type=geneve
        "options:remote_ip=172.16.$a.$b" options:key=flow "options:remote_name=peer-$i"
        "options:egress_pkt_mark=$mark" "options:ipsec_mark_out=\"$mark/0xffffffff\""
        "options:ipsec_reqid=$reqid" -- set Port "$name" "external_ids:ovn-chassis-id=peer-$i")
done
vsctl "${tunnel_args[@]}"
for fam in "" "-6"; do
    any=0.0.0.0/0
    [ -n "$fam" ] && any=::/0
    ip -n "$ns" $fam xfrm policy add dir out src $any dst $any action block \
        priority 2147483647 mark $mark mask 0xffffffff
done
cat >"$tmp/agent.json" <<EOF
{"lease": {"nodeUID": "bench-uid", "lease": "BENCHLEASE", "mark": $mark, "reqid": $reqid,
           "chassis": "bench-chassis"},
 "boundUuid": null, "preparing": false, "mode": "normal", "status": {"phase": "Configured"}}
EOF
ip netns exec "$ns" "$python" "$root/integration/fixtures/ipsec_agent.py" "$tmp/agent.json" \
    "$tmp/protection" "$tmp/db.sock" </dev/null >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    [ -S "$tmp/protection/protection.sock" ] && break
    sleep 0.05
done

# Policies for peers [from, to): out + in, udp/6081, required ESP template.
peer_policies() {
    local i a b
    for ((i = $1; i < $2; i++)); do
        a=$((i / 250 + 1)) b=$((i % 250 + 1))
        echo "xfrm policy add dir out src $node_ip/32 dst 172.16.$a.$b/32 proto udp dport 6081 mark $mark mask 0xffffffff tmpl src $node_ip dst 172.16.$a.$b proto esp reqid $reqid mode transport"
        echo "xfrm policy add dir in src 172.16.$a.$b/32 dst $node_ip/32 proto udp dport 6081 tmpl src 172.16.$a.$b dst $node_ip proto esp reqid $reqid mode transport"
    done
}

cat >"$tmp/conf.json" <<EOF
{"cniVersion": "1.0.0", "name": "bench", "type": "podgate-tunnel-guard",
 "protectionDir": "$tmp/protection", "ovsdbSocket": "$tmp/db.sock", "timeoutMs": 3000,
 "eventFile": "$tmp/events.jsonl",
 "prevResult": {"cniVersion": "1.0.0",
   "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/$ns"}],
   "ips": [{"address": "10.244.0.5/24", "gateway": "10.244.0.1", "interface": 0}]}}
EOF
export CNI_COMMAND=ADD CNI_CONTAINERID=bench CNI_NETNS="/var/run/netns/$ns" CNI_IFNAME=eth0 \
    CNI_PATH=/usr/lib/cni

# Whole-process ADD inside the node netns, spawn to exit, no shell in between
# (posix_spawn + waitpid from a small Python loop); prints the median and p95
# in ms, then those of GUARD_BEFORE when set (run alternately, in turns of
# alternating order). (Peak RSS comes from /usr/bin/time below: the
# ru_maxrss of a posix_spawn'd child also counts the Python parent's pages.)
spawn_loop() {
    ip netns exec "$ns" "$python" - "$tmp/conf.json" "$runs" "$bin" $before <<'PY'
import os, sys, time
conf, runs, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ts = {b: [] for b in bins}
for i in range(runs + 20):
    for binp in bins if i % 2 == 0 else bins[::-1]:
        fd, null = os.open(conf, os.O_RDONLY), os.open("/dev/null", os.O_WRONLY)
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(binp, [binp], os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_DUP2, null, 1)])
        _, status = os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
        os.close(fd), os.close(null)
        if status != 0:
            sys.exit("plugin ADD failed: " + binp)
        if i >= 20:  # warm-up
            ts[binp].append((t1 - t0) / 1e6)
out = []
for binp in bins:
    t = sorted(ts[binp])
    out += [t[len(t) // 2], t[max(0, -(-95 * len(t) // 100) - 1)]]
print(" ".join("%.3f" % v for v in out))
PY
}

# The same with hyperfine (through a shell, whose startup hyperfine subtracts).
hyperfine_median() {
    if [ "${GUARD_HYPERFINE:-1}" = 0 ] || ! command -v hyperfine >/dev/null; then
        echo "n/a"
        return
    fi
    ip netns exec "$ns" hyperfine --style none --warmup 20 --runs "$runs" \
        --export-json "$tmp/hf.json" "$bin < $tmp/conf.json" >/dev/null 2>&1
    jq '.results[0].median * 1000 * 1000 | round / 1000' "$tmp/hf.json"
}

# One ADD with a log file: it must pass with a real "ready" verdict (both
# guards, no bypass, lease, tunnel marks, /armed 200), or the numbers mean nothing.
verify_ready() {
    local bin="$1"
    jq --arg log "$tmp/verify.log" '. + {logFile: $log}' "$tmp/conf.json" >"$tmp/verify.json"
    rm -f "$tmp/verify.log"
    ip netns exec "$ns" "$bin" <"$tmp/verify.json" >"$tmp/out.json" || {
        echo "guard.sh: ADD failed:" >&2
        cat "$tmp/out.json" >&2
        exit 1
    }
    local verdict
    verdict="$(jq -r .verdict "$tmp/verify.log" | tail -n1)"
    if [ "$verdict" != ready ]; then
        echo "guard.sh: ADD verdict is $verdict, not ready:" >&2
        jq -r .msg "$tmp/verify.log" >&2
        exit 1
    fi
}

# "median p95 hyperfine [before-median before-p95]"
measure() {
    verify_ready "$bin"
    [ -z "$before" ] || verify_ready "$before"
    local loop
    loop="$(spawn_loop)"
    read -r m p rest <<<"$loop"
    echo "$m $p $(hyperfine_median) $rest"
}

peak_rss_kib() {
    if [ -x /usr/bin/time ]; then
        ip netns exec "$ns" /usr/bin/time -v "$bin" <"$tmp/conf.json" 2>&1 >/dev/null |
            awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}'
    else
        echo "n/a (apt-get install time)"
    fi
}

peer_policies 0 5 | ip -n "$ns" -batch -
small_n="$(ip -n "$ns" xfrm policy list | grep -c '^src')"
read -r small_ms small_p95 small_hf small_before <<<"$(measure)"
small_rss="$(peak_rss_kib)"

peer_policies 5 2000 | ip -n "$ns" -batch -
big_n="$(ip -n "$ns" xfrm policy list | grep -c '^src')"
read -r big_ms big_p95 big_hf big_before <<<"$(measure)"
big_rss="$(peak_rss_kib)"

peer_policies 2000 4999 | ip -n "$ns" -batch -
xl_n="$(ip -n "$ns" xfrm policy list | grep -c '^src')"
read -r xl_ms xl_p95 xl_hf xl_before <<<"$(measure)"
xl_rss="$(peak_rss_kib)"

echo "podgate-tunnel-guard ADD, whole process (release), median of $runs runs; both guard families, $tunnels OVN tunnel interfaces; load: $(cut -d' ' -f1-3 /proc/loadavg)"
size_line() { # n median p95 hyperfine rss [before-median before-p95]
    printf '  %5d xfrm policies: median %.3f ms, p95 %.3f ms (hyperfine: %s ms), peak RSS %s KiB\n' "$1" "$2" "$3" "$4" "$5"
    [ -z "${6:-}" ] || printf '        GUARD_BEFORE, alternately: median %.3f ms, p95 %.3f ms (%.2fx)\n' "$6" "$7" \
        "$(awk -v a="$2" -v b="$6" 'BEGIN {print a / b}')"
}
size_line "$small_n" "$small_ms" "$small_p95" "$small_hf" "$small_rss" $small_before
size_line "$big_n" "$big_ms" "$big_p95" "$big_hf" "$big_rss" $big_before
size_line "$xl_n" "$xl_ms" "$xl_p95" "$xl_hf" "$xl_rss" $xl_before
for n_ms in "$big_n $big_ms" "$xl_n $xl_ms"; do
    read -r n ms <<<"$n_ms"
    printf '  ratio %d vs %d policies: %.2fx\n' "$n" "$small_n" "$(awk -v a="$ms" -v b="$small_ms" 'BEGIN {print a / b}')"
    awk -v n="$n" -v m="$ms" 'BEGIN {print "  target median <= 5 ms with " n " policies: " (m <= 5 ? "met" : "MISSED")}'
done

if [ -n "${GUARD_JSON:-}" ]; then
    num() { if [[ "$1" =~ ^[0-9.]+$ ]]; then echo "$1"; else echo null; fi; }
    cat >"$GUARD_JSON" <<EOF
{"runs": $runs, "tunnels": $tunnels,
 "small": {"policies": $small_n, "median_ms": $small_ms, "p95_ms": $small_p95,
           "peak_rss_kib": $(num "$small_rss"), "hyperfine_median_ms": $(num "$small_hf")},
 "big": {"policies": $big_n, "median_ms": $big_ms, "p95_ms": $big_p95,
         "peak_rss_kib": $(num "$big_rss"), "hyperfine_median_ms": $(num "$big_hf")},
 "xl": {"policies": $xl_n, "median_ms": $xl_ms, "p95_ms": $xl_p95,
        "peak_rss_kib": $(num "$xl_rss"), "hyperfine_median_ms": $(num "$xl_hf")}}
EOF
fi
