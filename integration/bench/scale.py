#!/usr/bin/env python3
"""Node scale: one node netns, N pods (each its own netns on one bridge, as
driver.py's burst builds them), each pod a routed pool of its own and
masquerade of it (ip_forward=1, masquerade source P_i, node return route
P_i), called by integration/bench/run.sh (root only).

In order, on that node:
  1. ADD with none: the router's ADD of pod 0 on an empty node, interleaved
     with the router of an earlier release (--before-bin-dir) in its own
     state dir, ADD/DEL alternating.
  1b. The churn control: N rounds of ADD then DEL of pod 0 alone (timed
     ADDs), median of the first 25 and the last 25: the same file
     creations and deletions as step 2 and more, with one attachment. A
     filesystem that slows file creation after recent deletions (ext4
     without a journal skips inodes freed in the last minutes) shows here
     as in step 2; growth with the attachments shows only in step 2.
  2. ADD after ADD of the N pods through the router: median (wall and
     user+sys CPU) of the first 25 and the last 25 and their ratio; the
     agent (`podgate agent`) measured after the 25th ADD and after the Nth.
  2b. ADD at N attachments against ADD with none, interleaved: a probe
     pod on this node (its N attachments in place) and one on a second,
     empty node netns with a state dir of its own, ADD then DEL each,
     alternating (which goes first alternates too), --probe-runs rounds:
     the medians and their ratio. Side by side, so the machine's drift
     (a shared VM's speed changes within seconds) hits both alike, which
     the first/last 25 of step 2, a second apart, cannot promise. In the
     same rounds: the same probe pods ADDed and DELed with the
     masquerade-only profile (no claims to check), and, after each DEL,
     the reads that grow with the node timed by themselves (reads_us).
  3. The agent with N attachments, in the node netns, --metrics-address on
     the node's bridge address: CPU of one collection cycle (its worker
     thread's /proc/<pid>/task/<tid>/schedstat run time, cross-checked with
     utime+stime of .../stat over all cycles), the wall time of a scrape
     of /metrics, and its VmRSS/VmHWM from /proc/<pid>/status.
  4. GC: half the pods' netns deleted; the CNI GC verb (cniVersion 1.1.0,
     cni.dev/valid-attachments naming the live half) timed spawn to exit;
     then the same again with fresh pods for the agent's stale sweep (timed
     by the agent's own log line). Each time: the live half's records,
     claims, node routes and pod nftables unchanged, the stale half's
     records, claims entries and node routes gone.
  5. DEL of every live pod: the node (routes, rules, nftables, state dir)
     as before step 2.
Output: a JSON file (--out) that `driver.py report` turns into rows and
verdicts. Namespaces: pg-bench-<role>-<tag>-<rand>, always removed.
"""

import argparse
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import statistics
import subprocess
import sys
import tempfile
import time

import driver as d

EDGE = 25  # ADDs in each of the "first" and "last" groups
METRICS_PORT = 9750
NODE_IP = "10.23.255.254"


def pool(i):
    return f"10.{100 + i // 256}.{i % 256}.0/24"


class Node:
    """The node netns (this process moves into it) with its bridge."""

    def __init__(self, tag, role="snode"):
        self.tag = tag
        self.ns = d.netns_add(role, tag)
        d.sysctl_in(self.ns, "net.ipv4.ip_forward", "1")
        d.sysctl_in(self.ns, "net.ipv6.conf.default.disable_ipv6", "1")
        d.sysctl_in(self.ns, "net.ipv6.conf.all.disable_ipv6", "1")
        d.enter_netns(self.ns)
        d.sh("ip", "link", "add", "pgbbr0", "type", "bridge")
        d.sh("ip", "addr", "add", f"{NODE_IP}/16", "dev", "pgbbr0")
        d.sh("ip", "link", "set", "pgbbr0", "up")

    def pod(self, i):
        return d.Pod(self.tag, i, host_if=f"pgbs{i}", bridge="pgbbr0")


class Attachments:
    """The N pods' CNI calls through one router binary and state dir."""

    def __init__(self, router, tmp, name):
        self.router = router
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir, exist_ok=True)
        self.state = os.path.join(self.dir, "state")
        self.log = os.path.join(self.dir, "router.log")

    def conf(self, pod, i, version="1.0.0"):
        p = pool(i)
        prev = pod.prev_result()
        prev["cniVersion"] = version
        return {
            "cniVersion": version,
            "name": "bench",
            "type": "podgate-router",
            "stateDir": self.state,
            "logFile": self.log,
            "profiles": {
                "scale": {
                    "sysctls": {"net.ipv4.ip_forward": "1"},
                    "masquerade": [{"source": p}],
                    "returnRoutes": [{"dst": p}],
                },
                # The VPN gateway's profile: it checks no claims.
                "masq": {
                    "sysctls": {"net.ipv4.ip_forward": "1"},
                    "masquerade": [{"source": p}],
                },
            },
            "assign": [{"namespace": "bench", "profile": "scale"}, {"namespace": "masq", "profile": "masq"}],
            "allow": {},
            "prevResult": prev,
        }

    def call(self, cmd, pod, i, ns="bench"):
        """Pod i's call; `ns` "masq": the masquerade-only profile (another
        container ID)."""
        stdin = d.write_json(os.path.join(self.dir, f"c{i}-{cmd}.json"), self.conf(pod, i))
        cid = f"scale-{i}" if ns == "bench" else f"{ns}-{i}"
        return d.Call([self.router], d.cni_env(cmd, cid, pod, f"s{i}", ns=ns), stdin)

    def gc(self, live):
        """The CNI GC call naming `live` [(pod, i)] as the valid attachments."""
        conf = {
            "cniVersion": "1.1.0",
            "name": "bench",
            "type": "podgate-router",
            "stateDir": self.state,
            "logFile": self.log,
            "profiles": {},
            "cni.dev/valid-attachments": [{"containerID": f"scale-{i}", "ifname": "eth0"} for _, i in live],
        }
        stdin = d.write_json(os.path.join(self.dir, "gc.json"), conf)
        env = dict(d.BASE_ENV, CNI_COMMAND="GC", CNI_PATH="/usr/lib/cni")
        # SCALE_GC_WRAP="strace -f -w -c -o FILE" (or perf record ...):
        # profile the GC call (its time is then the wrapper's).
        wrap = os.environ.get("SCALE_GC_WRAP", "").split()
        if wrap:
            wrap[0] = shutil.which(wrap[0]) or wrap[0]
        return d.Call(wrap + [self.router], env, stdin)

    def records(self):
        return sorted(f for f in os.listdir(self.state) if f.endswith(".json")) if os.path.isdir(self.state) else []

    def claims(self):
        return d.claims_entries(self.state)


def median(v):
    return round(statistics.median(v), 3) if v else None


def return_routes():
    """The node's return routes to the bench pools (10.100.0.0/14)."""
    return sorted(
        l.split()[0] for l in d.sh("ip", "-4", "route", "show", "table", "all").splitlines()
        if l.startswith("10.10") and l.split()[0].startswith(("10.100.", "10.101.", "10.102.", "10.103."))
    )


def pod_nft(pod):
    return d.sh("ip", "netns", "exec", pod.ns, "nft", "list", "ruleset")


# ------------------------------------------------------------------- agent


def thread_of(pid, name):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    return int(tid)
        except OSError:
            pass
    return None


def run_ns(pid, tid):
    """Time the thread ran, ns (schedstat's first field)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def ticks(pid, tid):
    """utime + stime of the thread, clock ticks (/proc/<pid>/task/<tid>/stat)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def scrape(timeout=5.0):
    """(ms, body) of one GET /metrics."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(NODE_IP, METRICS_PORT, timeout=timeout)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        body = r.read().decode()
        if r.status != 200:
            raise RuntimeError(f"GET /metrics: {r.status}")
    finally:
        c.close()
    return (time.perf_counter() - t0) * 1000, body


def gauge_sum(body, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in body.splitlines() if l.startswith(name + "{") or l.startswith(name + " "))


class Agent:
    """`podgate agent` in the node netns (inherited from this process) over
    one router state dir; no runtime (no adoption); stopped with SIGTERM."""

    def __init__(self, podgate, tmp, state, interval, sweep_secs=0):
        self.dir = tempfile.mkdtemp(prefix="agent-", dir=tmp)
        for sub in ("conf", "bin", "installer", "agent"):
            os.makedirs(os.path.join(self.dir, sub))
        plugins = d.write_json(
            os.path.join(self.dir, "plugins.json"),
            [{"type": "podgate-router", "stateDir": state, "profiles": {}}],
        )
        self.log_path = os.path.join(self.dir, "agent.log")
        argv = [podgate, "agent",
                "--metrics-address", f"{NODE_IP}:{METRICS_PORT}",
                "--metrics-interval-secs", str(interval),
                "--sweep-secs", str(sweep_secs),
                "--router-state-dir", state,
                "--agent-state-dir", os.path.join(self.dir, "agent"),
                "--runtime-endpoint", "none",
                "--cni-conf-dir", os.path.join(self.dir, "conf"),
                "--cni-bin-dir", os.path.join(self.dir, "bin"),
                "--source-dir", os.path.dirname(podgate),
                "--plugins", plugins,
                "--state-dir", os.path.join(self.dir, "installer")]
        self.err = open(self.log_path, "w")
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err)
        atexit.register(self.stop)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_for(self, cond, what, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise RuntimeError(f"agent exited ({self.p.returncode}) waiting for {what}:\n{self.log()[-2000:]}")
            v = cond()
            if v:
                return v
            time.sleep(0.02)
        raise RuntimeError(f"agent: no {what} after {timeout}s:\n{self.log()[-2000:]}")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()


def ready_scrape(n):
    """The body once /metrics shows n attachments."""
    try:
        _, body = scrape(1.0)
    except (OSError, RuntimeError):
        return None
    return body if gauge_sum(body, "podgate_attachments") == n else None


def measure_agent(podgate, tmp, state, n, cycles, scrapes):
    """One collection cycle's CPU, a scrape's wall time and the RSS of the
    agent over `state` holding n attachments."""
    a = Agent(podgate, tmp, state, interval=1)
    try:
        body = a.wait_for(lambda: ready_scrape(n), f"a scrape showing {n} attachments")
        if gauge_sum(body, "podgate_attachment_drift") != 0 or gauge_sum(body, "podgate_attachment_drift_unchecked") != 0:
            raise RuntimeError("agent: drift reported on untouched attachments:\n"
                               + "\n".join(l for l in body.splitlines() if "drift" in l))
        pid = a.p.pid
        tid = a.wait_for(lambda: thread_of(pid, "agent-worker"), "worker thread")
        # A cycle is a run of CPU growth of the worker thread; the thread
        # sleeps about a second between cycles. Polled every 5 ms.
        per, spans = [], []
        tk0 = None
        last = run_ns(pid, tid)
        start_ns, start_t, idle_since = None, None, time.monotonic()
        deadline = time.monotonic() + cycles * 2 + 10
        while len(per) < cycles and time.monotonic() < deadline:
            time.sleep(0.005)
            now_ns, t = run_ns(pid, tid), time.monotonic()
            if now_ns != last:
                if start_ns is None:
                    if t - idle_since < 0.3:
                        last = now_ns  # joined mid-cycle: wait for the next one
                        idle_since = t
                        continue
                    start_ns, start_t = last, t
                    if tk0 is None:
                        tk0 = ticks(pid, tid)
                last, idle_since = now_ns, t
            elif start_ns is not None and t - idle_since >= 0.3:
                per.append((last - start_ns) / 1e6)
                spans.append((idle_since - start_t) * 1000)
                start_ns = None
        if len(per) < cycles:
            raise RuntimeError(f"agent: saw {len(per)} collection cycles of {cycles}")
        tk = (ticks(pid, tid) - tk0) * 1000 / os.sysconf("SC_CLK_TCK") / cycles
        scrape_ms = [scrape()[0] for _ in range(scrapes)]
        return {
            "attachments": n,
            "cycles": cycles,
            "cycle_cpu_ms": per,
            "cycle_cpu_median_ms": median(per),
            "cycle_cpu_max_ms": round(max(per), 3),
            "cycle_cpu_ticks_mean_ms": round(tk, 3),
            "cycle_wall_median_ms": median(spans),
            "scrapes": scrapes,
            "scrape_median_ms": median(scrape_ms),
            "scrape_max_ms": round(max(scrape_ms), 3),
            "rss_kib": status_kib(pid, "VmRSS"),
            "hwm_kib": status_kib(pid, "VmHWM"),
        }
    finally:
        a.stop()


# ---------------------------------------------------------------------- GC


def owned(names, idx):
    """The entries of `names` (record files, claims entries) naming the
    record of one of the attachments `idx` (`...+scale-<i>+eth0...`)."""
    keys = {f"+scale-{i}+" for i in idx}
    return [n for n in names if any(k in n for k in keys)]


def snapshot_live(att, live):
    """What the live attachments own: records, claims, node routes, pod nftables."""
    idx = [i for _, i in live]
    return {
        "records": owned(att.records(), idx),
        "claims": owned(att.claims(), idx),
        "routes": [r for r in return_routes() if r in {pool(i) for _, i in live}],
        "nft": {i: pod_nft(p) for p, i in live},
    }


def stale_left(att, stale):
    """What is left of the stale attachments (must be nothing)."""
    pools = {pool(i) for i in stale}
    return owned(att.records(), stale) + owned(att.claims(), stale) + [r for r in return_routes() if r in pools]


def make_stale(pods, idx):
    """Delete the netns of pods[idx]: their attachments are now stale."""
    for i in idx:
        pods[i].close()
        pods[i] = None


def check_gc(att, live, stale, before_live, what):
    problems = []
    after = snapshot_live(att, live)
    for k in before_live:
        if after[k] != before_live[k]:
            problems.append(f"{what}: the live attachments' {k} changed")
    if len(after["records"]) != len(live):
        problems.append(f"{what}: {len(after['records'])} live records, want {len(live)}")
    left = stale_left(att, stale)
    if left:
        problems.append(f"{what}: {len(left)} objects of stale attachments left: {left[:5]}")
    if len(att.records()) != len(live):
        problems.append(f"{what}: {len(att.records())} records in all, want {len(live)}")
    return problems


def sweep_ms(log):
    """The agent's own timing of its sweep (`sweep DIR: done in X ms (...)`)."""
    m = re.search(r"sweep [^\n]*: done in ([0-9.]+) ms", log)
    return float(m.group(1)) if m else None


# -------------------------------------------------------------------- main


def edges(ms, cpu):
    """Medians (wall and CPU) of the first and the last EDGE calls, and their ratios."""
    e = {
        "first_ms": median(ms[:EDGE]), "last_ms": median(ms[-EDGE:]),
        "first_cpu_ms": median(cpu[:EDGE]), "last_cpu_ms": median(cpu[-EDGE:]),
    }
    e["ratio"] = round(e["last_ms"] / e["first_ms"], 3)
    e["cpu_ratio"] = round(e["last_cpu_ms"] / e["first_cpu_ms"], 3)
    return e


# ------------------------------------------------------- the kernel's floor

RTM_GETADDR, RTM_GETROUTE = 22, 26
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
SOL_NETLINK, NETLINK_GET_STRICT_CHK = 270, 12
RT_TABLE_MAIN = 254


def dump_us(msg_type, body):
    """Microseconds of one netlink dump of the current netns (a socket of
    its own, made before the clock starts): the request sent and every
    reply received up to NLMSG_DONE, nothing parsed; what the kernel spends
    producing the listing, as the router's dump pays it."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
        s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)  # as the router's socket
        s.bind((0, 0))
        req = struct.pack("=LHHLL", 16 + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body
        t0 = time.perf_counter()
        s.send(req)
        done = False
        while not done:
            buf = s.recv(64 * 1024)
            off = 0
            while off + 16 <= len(buf):
                length, kind = struct.unpack_from("=LH", buf, off)
                if kind in (NLMSG_DONE, NLMSG_ERROR):
                    done = True
                    break
                off += (length + 3) & ~3
        return (time.perf_counter() - t0) * 1e6


def reads_us(state):
    """The reads an ADD with a return route makes whose size grows with
    the node (observe.rs, claims.rs): the IPv4 route dump (the main table),
    the IPv4 address dump, and the listing of the state directory."""
    route = dump_us(RTM_GETROUTE, struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, 0, 0, 0, 0))
    addr = dump_us(RTM_GETADDR, struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0))
    t0 = time.perf_counter()
    if os.path.isdir(state):
        os.listdir(state)
    return route, addr, (time.perf_counter() - t0) * 1e6


def floor_of(reads_n, reads_0, none_ms):
    """The medians of each read on both nodes, and the ratio an ADD at N
    could not go below if only these reads grew (everything else as with
    none): (ADD with none + the reads' growth) / ADD with none."""
    out = {}
    grow = 0.0
    for i, what in enumerate(("route_dump", "address_dump", "state_listing")):
        at_n = statistics.median(r[i] for r in reads_n)
        at_0 = statistics.median(r[i] for r in reads_0)
        out[what] = {"at_n_us": round(at_n, 1), "none_us": round(at_0, 1)}
        grow += at_n - at_0
    out["growth_us"] = round(grow, 1)
    out["floor_ratio"] = round((none_ms * 1000 + grow) / (none_ms * 1000), 3)
    return out


def side_by_side(at_n, none):
    """Summaries of the ADDs at N and with none (Series), and the ratios of
    their medians, wall and CPU."""
    out = {"at_n": d.summary(at_n.ms, cpu=at_n.cpu), "none": d.summary(none.ms, cpu=none.cpu)}
    out["ratio"] = round(out["at_n"]["median_ms"] / out["none"]["median_ms"], 3)
    out["cpu_ratio"] = round(out["at_n"]["cpu_median_ms"] / out["none"]["cpu_median_ms"], 3)
    return out


def probe(node, now, router, tmp, sp, n, args):
    """ADD (then DEL) of one more pod on `node` (its n attachments in
    place, state dir of `now`) and of one pod on an empty node of its own,
    alternating; the pool is n's (free on both nodes)."""
    empty_node = Node(node.tag, role="enode")  # entered: its pod is made there
    empty = Attachments(router, tmp, "empty")
    empty_pod = empty_node.pod(0)
    d.enter_netns(node.ns)
    probes = [(empty_node.ns, empty, empty_pod), (node.ns, now, node.pod(n))]
    series = {node.ns: d.Series(), empty_node.ns: d.Series()}
    masq = {node.ns: d.Series(), empty_node.ns: d.Series()}
    reads = {node.ns: [], empty_node.ns: []}
    warm = 3
    try:
        for r in range(warm + args.probe_runs):
            for ns, att, pod in (probes if r % 2 else probes[::-1]):
                d.enter_netns(ns)
                series[ns].add(sp, att.call("ADD", pod, n), f"probe ADD ({ns})", r >= warm)
                sp.must(att.call("DEL", pod, n), f"probe DEL ({ns})")
                masq[ns].add(sp, att.call("ADD", pod, n, ns="masq"), f"masquerade-only probe ADD ({ns})", r >= warm)
                sp.must(att.call("DEL", pod, n, ns="masq"), f"masquerade-only probe DEL ({ns})")
                if r >= warm:
                    reads[ns].append(reads_us(att.state))
    finally:
        d.enter_netns(node.ns)
    for _, _, pod in probes:
        pod.close()
    out = dict(side_by_side(series[node.ns], series[empty_node.ns]), runs=args.probe_runs)
    out["floor"] = floor_of(reads[node.ns], reads[empty_node.ns], out["none"]["median_ms"])
    out["masq"] = side_by_side(masq[node.ns], masq[empty_node.ns])
    d.netns_del(empty_node.ns)
    return out


def filesystem_of(path):
    """The filesystem holding `path`, e.g. "tmpfs" or "ext4 /dev/vda (no
    journal)": ext4 without a journal delays reusing freed inodes, which
    makes file creation slower after many recent deletions."""
    out = subprocess.run(["findmnt", "-no", "FSTYPE,SOURCE", "--target", path],
                         capture_output=True, text=True).stdout.split()
    if not out:
        return "unknown"
    fstype, source = out[0], (out[1] if len(out) > 1 else "")
    if fstype != "ext4":
        return fstype
    dev = os.path.basename(source)
    journal = any(j.startswith(f"{dev}-") for j in os.listdir("/proc/fs/jbd2")) if os.path.isdir("/proc/fs/jbd2") else False
    return f"ext4 {source} ({'journal' if journal else 'no journal'})"


def cmd(args):
    n = args.pods
    tmp = tempfile.mkdtemp(prefix="podgate-bench-scale-", dir=args.state_root)
    atexit.register(shutil.rmtree, tmp, True)
    router = os.path.join(os.path.abspath(args.bin_dir), "podgate-router")
    podgate = os.path.join(os.path.abspath(args.bin_dir), "podgate")
    before = os.path.join(os.path.abspath(args.before_bin_dir), "podgate-router") if args.before_bin_dir else None
    node = Node(args.tag)
    t = time.monotonic()
    pods = [node.pod(i) for i in range(n)]
    print(f"  {n} pod netns on one bridge: set up in {time.monotonic() - t:.1f}s", flush=True)
    sp = d.Spawner(tmp)
    res = {"pods": n, "edge": EDGE, "problems": [], "state_fs": filesystem_of(tmp)}
    print(f"  state dirs on {res['state_fs']} ({tmp})", flush=True)
    snap0 = d.node_snapshot(os.path.join(tmp, "now", "state"))

    # 1. ADD with none, side by side with the earlier release.
    now = Attachments(router, tmp, "now")
    steps = [(d.Series(), now.call("ADD", pods[0], 0), "ADD with none"), (None, now.call("DEL", pods[0], 0), "DEL")]
    if before:
        old = Attachments(before, tmp, "before")
        steps += [(d.Series(), old.call("ADD", pods[0], 0), "before: ADD with none"),
                  (None, old.call("DEL", pods[0], 0), "before: DEL")]
    d.interleave(sp, steps, args.none_runs, 5)
    res["none"] = d.summary(steps[0][0].ms, cpu=steps[0][0].cpu)
    if before:
        res["none_before"] = d.summary(steps[2][0].ms, cpu=steps[2][0].cpu)
        res["before"] = args.before_label

    # 1b. The churn control: pod 0 added and deleted N times.
    ms, cpu = [], []
    for r in range(n):
        ms.append(sp.must(now.call("ADD", pods[0], 0), f"control ADD {r}"))
        cpu.append(sp.last_cpu)
        sp.must(now.call("DEL", pods[0], 0), f"control DEL {r}")
    res["churn"] = edges(ms, cpu)
    c = res["churn"]
    print(f"  churn control, {n} ADD+DEL of one pod: median first {EDGE} {c['first_ms']} ms, last {EDGE} "
          f"{c['last_ms']} ms = {c['ratio']}x (CPU {c['cpu_ratio']}x)", flush=True)

    # 2. ADD after ADD; the agent after the 25th and after the last.
    ms, cpu = [], []
    for i in range(n):
        ms.append(sp.must(now.call("ADD", pods[i], i), f"ADD {i}"))
        cpu.append(sp.last_cpu)
        if i + 1 == EDGE and args.agent_cycles:
            res["agent_small"] = measure_agent(podgate, tmp, now.state, EDGE, args.agent_cycles, args.scrapes)
            print(f"  agent with {EDGE} attachments: cycle CPU {res['agent_small']['cycle_cpu_median_ms']} ms", flush=True)
    res["seq"] = edges(ms, cpu)
    s = res["seq"]
    print(f"  {n} ADDs: median first {EDGE} {s['first_ms']} ms, last {EDGE} {s['last_ms']} ms = {s['ratio']}x "
          f"(CPU {s['first_cpu_ms']} / {s['last_cpu_ms']} ms = {s['cpu_ratio']}x)", flush=True)
    if len(now.records()) != n or len(return_routes()) != n:
        res["problems"].append(f"after {n} ADDs: {len(now.records())} records, {len(return_routes())} return routes")

    # 2b. ADD at n against ADD with none, interleaved (two node netns).
    if args.probe_runs:
        res["probe"] = probe(node, now, router, tmp, sp, n, args)
        q = res["probe"]
        print(f"  ADD at {n} attachments vs with none, interleaved: {q['at_n']['median_ms']} / "
              f"{q['none']['median_ms']} ms = {q['ratio']}x (CPU {q['cpu_ratio']}x); the reads that grow "
              f"with the node alone: +{q['floor']['growth_us']} us = {q['floor']['floor_ratio']}x", flush=True)
        m = q["masq"]
        print(f"  masquerade-only ADD at {n} attachments vs with none, interleaved: {m['at_n']['median_ms']} / "
              f"{m['none']['median_ms']} ms = {m['ratio']}x (CPU {m['cpu_ratio']}x)", flush=True)

    # 3. The agent with n attachments.
    if args.agent_cycles:
        res["agent"] = measure_agent(podgate, tmp, now.state, n, args.agent_cycles, args.scrapes)
        ag = res["agent"]
        print(f"  agent with {n} attachments: cycle CPU median {ag['cycle_cpu_median_ms']} ms "
              f"(ticks {ag['cycle_cpu_ticks_mean_ms']} ms), scrape {ag['scrape_median_ms']} ms, "
              f"RSS {ag['rss_kib']} KiB (HWM {ag['hwm_kib']})", flush=True)

    # 4. GC: half stale (odd pods), the CNI verb, then the agent's sweep.
    stale = list(range(1, n, 2))
    live_idx = list(range(0, n, 2))
    live = [(pods[i], i) for i in live_idx]
    before_live = snapshot_live(now, live)
    make_stale(pods, stale)
    gc_ms = sp.must(now.gc(live), "GC")
    res["gc"] = {"stale": len(stale), "of": n, "ms": round(gc_ms, 3), "cpu_ms": round(sp.last_cpu, 3)}
    res["problems"] += check_gc(now, live, stale, before_live, "CNI GC")
    print(f"  CNI GC of {len(stale)} stale of {n}: {gc_ms:.1f} ms (CPU {sp.last_cpu:.1f} ms)", flush=True)

    if args.agent_cycles:
        for i in stale:
            pods[i] = node.pod(i)
            sp.must(now.call("ADD", pods[i], i), f"re-ADD {i}")
        make_stale(pods, stale)
        a = Agent(podgate, tmp, now.state, interval=3600, sweep_secs=3600)
        try:
            took = a.wait_for(lambda: sweep_ms(a.log()), "the sweep's log line")
        finally:
            a.stop()
        res["sweep"] = {"stale": len(stale), "of": n, "ms": took}
        res["problems"] += check_gc(now, live, stale, before_live, "agent sweep")
        print(f"  agent sweep of {len(stale)} stale of {n}: {took:.1f} ms", flush=True)

    # 5. DEL the rest: the node as before.
    for p, i in live:
        sp.must(now.call("DEL", p, i), f"DEL {i}")
    time.sleep(0.2)
    snap1 = d.node_snapshot(now.state)
    # The agent's event channel (the router appends to it once an agent
    # listens) is the agent's, not an attachment's.
    snap1["state"] = [f for f in snap1["state"] if f != "events.jsonl"]
    diff = d.snapshot_diff(snap0, snap1)
    if diff:
        res["problems"].append("node changed after the DELs:\n" + diff)
    for p in pods:
        if p:
            p.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    if res["problems"]:
        print("scale: FAILED\n" + "\n".join(res["problems"]), file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True, help="podgate-router and podgate")
    ap.add_argument("--before-bin-dir", help="podgate-router of an earlier release: ADD with none side by side")
    ap.add_argument("--before-label", default="", help="what --before-bin-dir is (for the report)")
    ap.add_argument("--pods", type=int, default=250)
    ap.add_argument("--none-runs", type=int, default=50, help="ADD-with-none rounds")
    ap.add_argument("--probe-runs", type=int, default=50, help="rounds of ADD at N vs with none, interleaved (0: skip)")
    ap.add_argument("--agent-cycles", type=int, default=10, help="collection cycles measured (0: no agent, no sweep)")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--state-root", help="where the state dirs are made (default: the system's temp dir)")
    ap.add_argument("--tag", default=str(os.getpid()))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("scale: must run as root (creates network namespaces)")
    if args.pods < 2 * EDGE:
        sys.exit(f"scale: --pods must be at least {2 * EDGE}")
    atexit.register(d.cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cmd(args)
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
