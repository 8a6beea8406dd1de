#!/usr/bin/env python3
"""Pod start on a real Kubernetes node, with podgate's entries in the chain
against the same chain without them.

    sudo python3 integration/bench/podstart.py [--pods 50] [--rounds 5]

A throwaway cluster of its own (integration/k8s/cluster.sh, named
pg-k8s-bench), containerd 2.x. On node-1, podgate is put in or taken out of
the chain by the real installer (`podgate install` / `podgate uninstall`,
the release build of the shipped binaries, the shipped policy
conf/plugins.json), rounds interleaved: with, without, with, ... For each
round, PODS plain pods (no profile: what every pod of a cluster pays, podgate
passing them through) are created at once by a Deployment pinned to node-1,
waited for, and deleted. Per pod, from CRI: the sandbox's createdAt to its
container's startedAt (ns), which holds the sandbox's network setup (the CNI
chain) and the container's start. Reported: median and p90 of every pod of
every round, per mode; the per-round medians; the spread of the rounds
without podgate among themselves. Target: median and p90 with podgate at
most 5% over without; where the rounds without spread more than 5%, the
difference is compared against that spread.

Output: a table on stdout and target/bench/podstart.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(ROOT, "integration/k8s/cluster.sh")
NAME = "pg-k8s-bench"
NODE = "node-1"
ENV = dict(os.environ, PODGATE_K8S_NAME=NAME)


def run(*args, check=True, stdin=None):
    out = subprocess.run(args, env=ENV, input=stdin, capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"podstart: {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def cluster(*args, **kw):
    return run("bash", CLUSTER, *args, **kw)


def kubectl(*args, **kw):
    return cluster("run", "kubectl", *args, **kw)


def on_node(script):
    return cluster("node", NODE, "bash", "-euo", "pipefail", "-c", script)


def release_bins():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run("cargo", "build", "-q", "--release", "--manifest-path", os.path.join(ROOT, "Cargo.toml"),
        "-p", "podgate", "-p", "podgate-router", "-p", "podgate-tunnel-guard")
    return os.path.join(target, "release")


def chain_types():
    """The plugin types of the pod network node-1's containerd loaded."""
    info = json.loads(on_node("crictl info"))
    for net in info["cniconfig"]["Networks"]:
        if net["Config"]["Name"] != "cni-loopback":
            return [p["Network"]["type"] for p in net["Config"]["Plugins"]]
    return []


def set_podgate(bins, on):
    podgate = os.path.join(bins, "podgate")
    if on:
        on_node(f"{podgate} install --source-dir {bins} --plugins {ROOT}/conf/plugins.json")
    else:
        on_node(f"{podgate} uninstall")
    deadline = time.time() + 60
    while time.time() < deadline:
        if ("podgate-router" in chain_types()) == on:
            return
        time.sleep(0.5)
    sys.exit(f"podstart: containerd did not load the chain {'with' if on else 'without'} podgate")


def deployment(name, pods):
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "greeter", "image": "localhost/podgate/greeter:1",
                                    "imagePullPolicy": "Never"}],
                },
            },
        },
    })


def ns_of(timestamp):
    """An RFC 3339 timestamp with nanoseconds, as crictl prints it, in ns."""
    base, _, frac = timestamp.rstrip("Z").partition(".")
    frac = (frac.split("+")[0].split("-")[0] + "000000000")[:9]
    seconds = datetime.fromisoformat(base).replace(tzinfo=None)
    epoch = datetime(1970, 1, 1)
    return int((seconds - epoch).total_seconds()) * 1_000_000_000 + int(frac)


def start_times(name):
    """Per pod of Deployment `name`: sandbox createdAt to container startedAt."""
    pods = json.loads(on_node(f"crictl pods --label app={name} -o json"))["items"]
    sandbox_created = {p["id"]: int(p["createdAt"]) for p in pods}
    containers = json.loads(on_node("crictl ps -o json"))["containers"]
    ids = [c["id"] for c in containers if c["podSandboxId"] in sandbox_created]
    out = []
    for cid in ids:
        status = json.loads(on_node(f"crictl inspect {cid}"))["status"]
        sandbox = next(c["podSandboxId"] for c in containers if c["id"] == cid)
        out.append(ns_of(status["startedAt"]) - sandbox_created[sandbox])
    return out


def one_round(index, with_podgate, pods, bins):
    set_podgate(bins, with_podgate)
    name = f"start-{index}-{'with' if with_podgate else 'without'}"
    kubectl("apply", "-f", "-", stdin=deployment(name, pods))
    kubectl("rollout", "status", f"deploy/{name}", "--timeout=300s")
    times = start_times(name)
    if len(times) != pods:
        sys.exit(f"podstart: round {name}: {len(times)} of {pods} pods measured")
    kubectl("delete", "deploy", name, "--wait=true")
    deadline = time.time() + 300
    while time.time() < deadline:
        if not json.loads(on_node(f"crictl pods --label app={name} --state ready -o json"))["items"]:
            break
        time.sleep(1)
    return times


def p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("podstart: run as root")
    bins = release_bins()
    images = os.path.join(ROOT, "target/bench")
    os.makedirs(images, exist_ok=True)
    greeter = os.path.join(images, "greeter.tar")
    run("bash", os.path.join(ROOT, "integration/k8s/images/build.sh"), "greeter", greeter)
    cluster("up", "--containerd", "2")
    try:
        cluster("load-image", greeter)
        rounds = {True: [], False: []}
        # Warm-up round, not counted: the first pods on a fresh node pay for
        # its caches.
        one_round(0, False, args.pods, bins)
        for i in range(args.rounds):
            for mode in ((True, False) if i % 2 == 0 else (False, True)):
                times = one_round(i + 1, mode, args.pods, bins)
                rounds[mode].append(times)
                print(f"round {i + 1} {'with   ' if mode else 'without'}: "
                      f"median {statistics.median(times) / 1e6:7.1f} ms  p90 {p90(times) / 1e6:7.1f} ms",
                      flush=True)
    finally:
        cluster("down", check=False)
    result = {}
    for mode, label in ((True, "with"), (False, "without")):
        every = [t for r in rounds[mode] for t in r]
        result[label] = {
            "median_ms": statistics.median(every) / 1e6,
            "p90_ms": p90(every) / 1e6,
            "round_medians_ms": [statistics.median(r) / 1e6 for r in rounds[mode]],
        }
    without = result["without"]["round_medians_ms"]
    spread = (max(without) - min(without)) / statistics.median(without)
    result["spread_without"] = spread
    for k in ("median_ms", "p90_ms"):
        result[f"{k}_ratio"] = result["with"][k] / result["without"][k]
    limit = max(0.05, spread)
    result["verdict"] = "met" if max(result["median_ms_ratio"], result["p90_ms_ratio"]) <= 1 + limit else "MISSED"
    print(f"\npod start on {NODE}, {args.pods} pods at once, {args.rounds} rounds each, interleaved")
    print(f"  without podgate: median {result['without']['median_ms']:.1f} ms, p90 {result['without']['p90_ms']:.1f} ms")
    print(f"  with podgate:    median {result['with']['median_ms']:.1f} ms, p90 {result['with']['p90_ms']:.1f} ms")
    print(f"  ratio: median {result['median_ms_ratio']:.3f}x, p90 {result['p90_ms_ratio']:.3f}x;"
          f" spread of the rounds without: {spread * 100:.1f}%")
    print(f"  target (at most 5% more, or the spread when larger): {result['verdict']}")
    with open(os.path.join(images, "podstart.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
