#!/bin/bash
# Node scale: ADD after ADD of 250 attachments on one node, each with a
# routed pool of its own and masquerade (its own interface name in one pod
# netns, so each has its own record, nf_tables table and node return
# route), through each router binary given; prints the median ADD of the
# first 25 and of the last 25 and their ratio, then DELs them all.
#
#   integration/bench/node-scale.sh [-n N] ROUTER_BINARY...
#
# Namespaces (pg-scale-*) are made here and removed on every exit path; the
# machine's own namespace is never touched.
set -eu
n=250
if [ "${1:-}" = -n ]; then n=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: $0 [-n N] ROUTER..." >&2; exit 2; }
for b in "$@"; do [ -x "$b" ] || { echo "$0: $b not executable" >&2; exit 2; }; done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=integration/bench/pod-netns.sh
. "$here/pod-netns.sh"
bench_pod_netns scale 1.1.0

for b in "$@"; do
    rm -rf "$tmp/state"
    python3 - "$b" "$tmp/conf.json" "$node" "$n" <<'EOP'
import json, os, statistics, subprocess, sys, time
binary, conf_path, node, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
base = json.load(open(conf_path))

def call(cmd, i):
    ifname = f"sc{i}"
    c = json.loads(json.dumps(base))
    c["profiles"] = {"scale": {
        "masquerade": [{"source": "10.8.0.0/24"}],
        "returnRoutes": [{"dst": f"10.{100 + i // 256}.{i % 256}.0/24"}]}}
    c["assign"] = [{"namespace": "bench", "profile": "scale"}]
    c["allow"] = {}
    c["prevResult"]["interfaces"][1]["name"] = ifname
    env = dict(os.environ, CNI_COMMAND=cmd, CNI_CONTAINERID=f"scale-{i}", CNI_IFNAME=ifname,
               CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p{i}")
    argv = ["nsenter", f"--net=/var/run/netns/{node}", binary]
    t = time.perf_counter()
    r = subprocess.run(argv, input=json.dumps(c).encode(), env=env, capture_output=True)
    dt = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        sys.exit(f"{cmd} {i} failed: {r.stdout.decode()} {r.stderr.decode()}")
    return dt

adds = [call("ADD", i) for i in range(n)]
first, last = statistics.median(adds[:25]), statistics.median(adds[-25:])
print(f"== {binary}: {n} ADDs (routed pool + masquerade each)")
print(f"  median ADD, first 25: {first:.2f} ms; last 25: {last:.2f} ms; ratio {last / first:.2f}")
for i in range(n):
    call("DEL", i)
EOP
    left=$(find "$tmp/state" -name '*.json' | wc -l)
    [ "$left" -eq 0 ] || { echo "$0: $left records left after the DELs" >&2; exit 1; }
done
