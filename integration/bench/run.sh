#!/usr/bin/env bash
# podgate benchmarks and long-running checks: the one runner (root only).
#
#   integration/bench/run.sh            full: 300 runs per series, 110 pods x 3
#                                        rounds, node scale with 250 attachments
#                                        and a 250-pod burst, 2,000-cycle soak,
#                                        fuzz 60 s/target
#   integration/bench/run.sh --short    CI (integration/test.sh when CI=true):
#                                        40 runs, 110 pods x 1, node scale with
#                                        100 attachments, 100-cycle soak, fuzz
#                                        only if time is left; < 4 min
#
# In one run, side by side: whole-process median/p95 and peak RSS of
# podgate-router ADD/DEL (vpn-gateway: ip_forward=1 + masquerade 10.8.0.0/24;
# vpn-routed: + node return route instead; sysctl + masquerade + route),
# a pod without a profile; masq_ref.c, a static C program making the router's
# masquerade-ADD kernel calls with the bytes captured from the router (the
# physical limit, interleaved with the router's ADD); the tuning plugin
# setting only ip_forward, Debian's 1.1.1 and the reference plugins v1.10.0
# (integration/go-tools.sh) side by side, interleaved with a static C no-op (subtracted:
# ADD net of process start), the router's ADDs and, in the full mode, the
# router before issue 26's removals (commit 1c58541, built as it shipped);
# `nsenter --net + nft -f` of the same masquerade rule and `nft delete table`
# against the router's DEL in the same netns, podgate-tunnel-guard ADD with 10,
# 4,000 and 10,000 XFRM policies (guard.sh). Each plugin is driven directly with
# env + stdin against a real veth'd pod netns, static release build. Then:
# the burst, 110 pods (all masquerade, a third with return routes) ADDed at
# once and DELed at once: p50/p99/max against the CPU floor (110 x one ADD's
# user+sys / cores), node-lock hold times from the router's log, node must
# end as it started; node scale (scale.py): ADD after ADD of 250 attachments
# (routed pool + masquerade each), the median of the last 25 against the first
# 25, ADD at 250 against ADD with none interleaved (the routed profile and the
# masquerade-only one, and the kernel reads that grow with the node timed
# alone), ADD with none against the router before the removals, the agent's
# collection CPU, scrape time and RSS with them, CNI GC and the agent's sweep
# of 125 stale, and (full) the same 250 ADDed at once; the soak test
# (integration/tests/soak.rs) and the fuzz targets. Method and the latest full run: integration/bench/README.md.
#
# Output: a table and one verdict line per target on stdout, and
# target/bench/results.json. Timing fails the run in two cases only: the
# router's masquerade ADD net of process start slower than 0.8x tuning's
# (both modes), and in the short mode ADD at 100 node-scale attachments over
# 1.6x ADD with none, interleaved (wall and CPU both; the target, 1.15x,
# prints MISSED like the other targets). A broken
# plugin, a node left changed, a soak leftover or a fuzz crash fail it too.
# Everything runs in network namespaces made here (pg-bench-*) and removed
# on exit, whatever happens; the host's networking is never touched.
#
# Environment: BENCH_RUNS, BENCH_PODS, BENCH_ROUNDS, BENCH_SCALE_PODS,
# PODGATE_SOAK_CYCLES, FUZZ_SECONDS (per target; 0 skips fuzzing),
# BENCH_SKIP="guard concurrency scale soak fuzz",
# BENCH_BEFORE (1: measure the router before the removals; default 1 full, 0 short),
# BENCH_SCALE_STATE_ROOT (where node scale makes its state dirs: e.g. a tmpfs;
# default the system's temp dir).
set -euo pipefail

mode=full
case "${1:-}" in
    --short) mode=short ;;
    "") ;;
    -h | --help)
        sed -n '2,48p' "$0"
        exit 0
        ;;
    *)
        echo "usage: $0 [--short]" >&2
        exit 2
        ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
out="$target/bench"
# Measure what ships: statically linked against glibc, as the image builds
# it (static linking saves the dynamic loader's work on every plugin call).
rustflags="-C target-feature=+crt-static"
# The packages the image builds, in one cargo invocation: the packages built
# together decide the dependencies' features, and so the plugins' code.
shipped="-p podgate -p podgate-router -p podgate-tunnel-guard"
# The router before issue 26's removals (arena allocator, link order, no std
# runtime start, non-PIE), built the way it shipped then, measured side by
# side in the full mode (BENCH_BEFORE=0 skips it, =1 adds it to --short).
before_commit="${BENCH_BEFORE_COMMIT:-1c58541}"
static_target=x86_64-unknown-linux-gnu
rel="$target/$static_target/release"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
started=$(date +%s)
tag=$$
failures=()
skip=" ${BENCH_SKIP:-} "

if [ "$mode" = short ]; then
    runs="${BENCH_RUNS:-40}" warmup=5 pods="${BENCH_PODS:-110}" rounds="${BENCH_ROUNDS:-1}"
    guard_runs="${BENCH_RUNS:-50}" cycles="${PODGATE_SOAK_CYCLES:-100}" phase_runs=10
    scale_pods="${BENCH_SCALE_PODS:-100}" agent_cycles=3 probe_runs=20
    budget=170 # seconds for everything, build included, node scale excepted
    with_before="${BENCH_BEFORE:-0}"
else
    runs="${BENCH_RUNS:-300}" warmup=20 pods="${BENCH_PODS:-110}" rounds="${BENCH_ROUNDS:-3}"
    guard_runs="${BENCH_RUNS:-300}" cycles="${PODGATE_SOAK_CYCLES:-2000}" phase_runs=50
    scale_pods="${BENCH_SCALE_PODS:-250}" agent_cycles=10 probe_runs=50
    budget=0
    with_before="${BENCH_BEFORE:-1}"
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: must run as root (creates network namespaces)" >&2
    exit 1
fi
for tool in ip nft nsenter unshare jq cc cargo strace "$python"; do
    command -v "$tool" >/dev/null || {
        echo "run.sh: $tool missing (integration/install-deps.sh)" >&2
        exit 1
    }
done
[ -x /usr/lib/cni/tuning ] || {
    echo "run.sh: /usr/lib/cni/tuning missing (containernetworking-plugins)" >&2
    exit 1
}
# The reference plugins v1.10.0 (built once from the module proxy; says why
# when it cannot).
upstream_plugins="$(bash "$here/../go-tools.sh" dir plugins)"

cleanup() {
    local ns
    # Our namespaces only: pg-bench-<role>-<this pid>-<rand> (the driver's).
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^pg-bench-[a-z]+-$tag-[0-9a-f]{8}$" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

elapsed() { echo $(($(date +%s) - started)); }
left() { echo $((budget - $(elapsed))); }
step() { printf '\n== %s (%ss)\n' "$*" "$(elapsed)"; }
fail() {
    failures+=("$*")
    echo "run.sh: FAILED: $*" >&2
}
wanted() { [[ "$skip" != *" $1 "* ]]; }

mkdir -p "$out"
rm -f "$out"/{series,guard,concurrency,burst-scale,scale,soak,fuzz}.json
echo "podgate bench ($mode) on $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"

step "release build (static, as shipped)"
# shellcheck disable=SC2086
(cd "$root" && RUSTFLAGS="$rustflags" cargo build -q --release --target "$static_target" $shipped)
cc -O2 -static -o "$out/noop.cc" "$here/noop.c" 2>/dev/null || {
    echo "run.sh: no static libc (libc6-dev); the floor is a dynamic binary"
    cc -O2 -o "$out/noop.cc" "$here/noop.c"
}
# Every binary measured is installed as a node installs it, copied into a
# directory of its own (the DaemonSet copies into /opt/cni/bin; Debian's
# plugins come from dpkg). A linker's fresh output is not what runs on a
# node, and here it costs 2 page faults and about 25 us more per exec than
# a copy of itself, the no-op and the router alike.
# driver.py copies the C reference the same way.
install -m 0755 "$out/noop.cc" "$out/noop"
mkdir -p "$out/bin"
for b in podgate-router podgate-tunnel-guard podgate; do
    install -m 0755 "$rel/$b" "$out/bin/$b"
done
rel="$out/bin"
install -D -m 0755 "$upstream_plugins/tuning" "$out/plugins-upstream/tuning"

before_args=()
if [ "$with_before" = 1 ]; then
    # A `git archive` of that commit, built once into its own target dir
    # (kept: the commit never changes) with the flags its Dockerfile used.
    before="$out/before-$before_commit"
    step "the router before the removals ($before_commit, built as it shipped then)"
    if [ ! -x "$before/bin/podgate-router" ]; then
        if ! git -C "$root" cat-file -e "$before_commit^{commit}" 2>/dev/null; then
            echo "run.sh: commit $before_commit is not in this clone (git fetch --unshallow, or BENCH_BEFORE=0)" >&2
            exit 1
        fi
        rm -rf "$before/src"
        mkdir -p "$before/src" "$before/bin"
        git -C "$root" archive "$before_commit" | tar -x -C "$before/src"
        # shellcheck disable=SC2086
        (cd "$before/src" && CARGO_TARGET_DIR="$before/target" PODGATE_LINK_ORDER=1 \
            RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
            cargo build -q --release --target "$static_target" $shipped)
        install -m 0755 "$before/target/$static_target/release/podgate-router" "$before/bin/podgate-router"
    fi
    before_args=(--before-bin-dir "$before/bin")
fi

if [ "$mode" = short ] && [ "$(left)" -lt 75 ]; then
    # A cold build ate most of the budget: fewer runs, same coverage.
    runs=20 warmup=3 guard_runs=25 cycles=50
    echo "run.sh: $(left)s of the budget left after the build: $runs runs per series, $cycles soak cycles"
fi

loadavg="$(cut -d' ' -f1-3 /proc/loadavg)"
step "series: $runs runs each (+$warmup warm-up), ADD/DEL alternating"
"$python" "$here/driver.py" series --bin-dir "$rel" "${before_args[@]}" --noop "$out/noop" \
    --tuning-upstream "$out/plugins-upstream/tuning" --ref-src "$here/masq_ref.c" --runs "$runs" --warmup "$warmup" --phase-runs "$phase_runs" --tag "$tag" --loadavg "$loadavg" --out "$out/series.json" ||
    fail "series (a plugin call failed or did not apply)"

if wanted guard; then
    step "podgate-tunnel-guard: 10, 4,000 and 10,000 xfrm policies (guard.sh, $guard_runs runs)"
    hf=1
    [ "$mode" = short ] && hf=0
    GUARD_BIN="$rel/podgate-tunnel-guard" GUARD_JSON="$out/guard.json" GUARD_HYPERFINE="$hf" \
        bash "$here/guard.sh" "$guard_runs" || fail "guard.sh"
fi

if wanted concurrency; then
    step "burst: $pods pods ADDed at once, then DELed at once, x$rounds"
    "$python" "$here/driver.py" concurrency --bin-dir "$rel" --pods "$pods" --rounds "$rounds" \
        --tag "$tag" --out "$out/concurrency.json" ||
        fail "concurrency (a call failed, or the node/pods did not end as they started)"
fi

if wanted scale; then
    step "node scale: $scale_pods attachments (routed pool + masquerade each), agent, GC and sweep of half"
    scale_started=$(date +%s)
    "$python" "$here/scale.py" --bin-dir "${BENCH_SCALE_BIN_DIR:-$rel}" "${before_args[@]}" ${before_args:+--before-label "the router before the removals ($before_commit)"} \
        --pods "$scale_pods" --agent-cycles "$agent_cycles" --probe-runs "$probe_runs" --tag "$tag" --out "$out/scale.json" \
        ${BENCH_SCALE_STATE_ROOT:+--state-root "$BENCH_SCALE_STATE_ROOT"} ||
        fail "node scale (a call failed, or the node did not end as it started)"
    if [ "$mode" = full ] && wanted concurrency; then
        "$python" "$here/driver.py" concurrency --bin-dir "$rel" --pods "$scale_pods" --rounds 1 --routed-every 1 \
            --tag "$tag" --out "$out/burst-scale.json" ||
            fail "burst of $scale_pods (a call failed, or the node/pods did not end as they started)"
    fi
    # The short mode's budget is for the rest: node scale is its own cost.
    budget=$((budget + $(date +%s) - scale_started))
fi

if wanted soak; then
    step "soak: $cycles ADD/DEL cycles, random profiles (integration/tests/soak.rs, release plugin)"
    # The soak's fd/RSS report comes from an LD_PRELOAD shim, which a static
    # binary ignores: it runs the dynamically linked release build (built on
    # demand by the test), same code.
    if (cd "$root" && PODGATE_BIN_DIR="$target/release" PODGATE_SOAK_CYCLES="$cycles" \
        PODGATE_SOAK_REPORT="$out/soak.json" \
        cargo test -q -p podgate-integration --test soak -- --nocapture 2>&1 |
        grep -E '^soak:|panicked|assert|left:|right:|test result|error' | cut -c1-400); then
        [ -s "$out/soak.json" ] || fail "soak (no report: the test failed before the end)"
    else
        fail "soak"
    fi
fi

fuzz_secs="${FUZZ_SECONDS:-60}"
if wanted fuzz && [ "$fuzz_secs" != 0 ]; then
    fuzz_env=()
    if [ "$mode" = short ]; then
        # Whatever the budget leaves: up to 20 s per target (6 targets),
        # building only if that fits too (a cached build takes seconds).
        remaining="$(left)"
        fuzz_secs=$(((remaining - 25) / 6))
        [ "$fuzz_secs" -gt 20 ] && fuzz_secs=20
        fuzz_env=(FUZZ_BUILD_TIMEOUT=$((remaining - 15 - 6 * fuzz_secs)))
    fi
    step "fuzz: ${fuzz_secs}s per target (integration/fuzz/run.sh)"
    if [ "$fuzz_secs" -lt 3 ] || { [ "$mode" = short ] && [ "${fuzz_env[0]#*=}" -lt 5 ]; }; then
        echo "fuzz: skipped: the short mode's time budget is spent ($(elapsed)s of $budget s)"
        jq -n --arg why "short-mode time budget spent ($(elapsed)s of ${budget}s); run integration/fuzz/run.sh" \
            '{skipped: $why, targets: []}' >"$out/fuzz.json"
    else
        set +e
        env "${fuzz_env[@]}" FUZZ_JSON="$out/fuzz.json" bash "$root/integration/fuzz/run.sh" "$fuzz_secs"
        rc=$?
        set -e
        case "$rc" in
            0) ;;
            3) echo "fuzz: skipped (see above)" ;;
            4) fail "fuzz: the fuzz targets do not compile" ;;
            *) fail "fuzz: a target found a crash, hang or oversized allocation (target/fuzz/artifacts)" ;;
        esac
    fi
fi

step "report"
cmd="integration/bench/run.sh"
[ "$mode" = short ] && cmd="$cmd --short"
"$python" "$here/driver.py" report --mode "$mode" --command "$cmd" \
    --series "$out/series.json" --guard "$out/guard.json" --concurrency "$out/concurrency.json" \
    --burst-scale "$out/burst-scale.json" --scale "$out/scale.json" \
    --soak "$out/soak.json" --fuzz "$out/fuzz.json" --out "$out/results.json" ||
    fail "report: a gate failed: masquerade ADD over 0.8x tuning's net of process start, or node-scale ADD ratio over 1.6x (or not measured)"

echo
echo "run.sh $mode: done in $(elapsed)s"
if [ "${#failures[@]}" -gt 0 ]; then
    printf 'run.sh: %d failure(s):\n' "${#failures[@]}" >&2
    printf '  - %s\n' "${failures[@]}" >&2
    exit 1
fi
