#!/usr/bin/env bash
# Fuzz podgate's parsers of untrusted input with cargo-fuzz (libFuzzer + ASan),
# each target for a bounded time. A crash, a panic, a timeout (> 5 s on one
# input) or one allocation above 64 MiB / RSS above 1 GiB fails the run and
# leaves the input in target/fuzz/artifacts/<target>/.
#
#   integration/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60, all)
#
# Targets: netconf (NetConf::parse + dispatcher + router/guard plugin_config +
# router policy and planner), cni_args (parse_cni_args, from_vars), intent
# (allowed_pools, select), agent_response (agent HTTP parser, /status JSON,
# judge), ovsdb_reply (find_reply, parse_reply), xfrm_policy (kernel policy
# parser). Seeds live in integration/fuzz/seeds/<target>/ (read only); the
# growing corpus goes to target/fuzz/corpus/<target>/ (not in git).
#
# Only the stable toolchain is assumed: cargo-fuzz's -Z flags are accepted
# through RUSTC_BOOTSTRAP=1. cargo-fuzz itself comes from crates.io: when it
# is missing this script installs it (`cargo install cargo-fuzz --locked`,
# a few minutes), except under CI=true, where it skips instead.
# Environment:
#   FUZZ_BUILD_TIMEOUT=S  give up (exit 3) if building takes longer than S s
#   FUZZ_JSON=path        write a summary as JSON
#   FUZZ_SANITIZER=none   build without ASan (cargo fuzz -s none)
# Exit: 0 all clean, 1 a target found a failure, 3 could not build/run
# here (toolchain, time budget), 4 the targets do not compile.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
secs="${1:-60}"
shift || true
all=(netconf cni_args intent agent_response ovsdb_reply xfrm_policy)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
tdir="${CARGO_TARGET_DIR:-$root/target}/fuzz"
case "$tdir" in /*) ;; *) tdir="$root/$tdir" ;; esac
json="${FUZZ_JSON:-}"
sanitizer="${FUZZ_SANITIZER:-address}"
export RUSTC_BOOTSTRAP=1

log="$(mktemp /tmp/podgate-fuzz.XXXXXX)"
trap 'rm -f "$log"' EXIT

skip() {
    echo "fuzz: skipped: $*" >&2
    if [ -n "$json" ]; then
        jq -n --arg why "$*" '{skipped: $why, targets: []}' >"$json"
    fi
    exit 3
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    if [ "${CI:-}" = true ]; then
        skip "cargo-fuzz not installed (cargo install cargo-fuzz --locked)"
    fi
    echo "fuzz: installing cargo-fuzz from crates.io (once)"
    cargo install -q cargo-fuzz --version "${CARGO_FUZZ_VERSION:-0.13.2}" --locked ||
        skip "cargo install cargo-fuzz failed"
fi

cd "$here"
build=(cargo fuzz build --target-dir "$tdir/build" -s "$sanitizer" "${targets[@]}")
if [ "${#targets[@]}" -ne 1 ]; then
    build=(cargo fuzz build --target-dir "$tdir/build" -s "$sanitizer")
fi
t0=$(date +%s)
if [ -n "${FUZZ_BUILD_TIMEOUT:-}" ] && [ "$FUZZ_BUILD_TIMEOUT" -gt 0 ]; then
    if ! timeout "$FUZZ_BUILD_TIMEOUT" "${build[@]}" >"$log" 2>&1; then
        tail -5 "$log" >&2
        skip "building the fuzz targets did not finish within ${FUZZ_BUILD_TIMEOUT}s (partial build is cached; run integration/fuzz/run.sh)"
    fi
elif ! "${build[@]}" >"$log" 2>&1; then
    tail -20 "$log" >&2
    # Our own code not compiling is a failure; anything else (toolchain,
    # sanitizer runtime) is this machine's and only skips.
    if grep -q 'could not compile `podgate-fuzz`' "$log"; then
        echo "fuzz: the fuzz targets do not compile (see above)" >&2
        exit 4
    fi
    skip "cargo fuzz build failed (see above)"
fi
echo "fuzz: built ${#targets[@]} target(s) with -s $sanitizer in $(($(date +%s) - t0))s"

max_len() {
    case "$1" in
        netconf) echo 65536 ;;
        intent | cni_args) echo 8192 ;;
        *) echo 70000 ;;
    esac
}

results=()
failed=0
for t in "${targets[@]}"; do
    corpus="$tdir/corpus/$t"
    artifacts="$tdir/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    seeds="$here/seeds/$t"
    [ -d "$seeds" ] || seeds="$corpus"
    set +e
    cargo fuzz run --target-dir "$tdir/build" -s "$sanitizer" "$t" "$corpus" "$seeds" -- \
        -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=5 \
        -rss_limit_mb=1024 -malloc_limit_mb=64 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1
    rc=$?
    set -e
    execs="$(awk '/stat::number_of_executed_units/ {print $NF}' "$log" | tail -1)"
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')"
    if [ "$rc" -eq 0 ]; then
        status=clean
    else
        status="FAILED (exit $rc)"
        failed=1
        grep -E 'ERROR|panicked|SUMMARY|Test unit written|==[0-9]+==' "$log" | head -20 >&2 || tail -30 "$log" >&2
    fi
    printf 'fuzz %-15s %s: %s execs in %ss, coverage %s, corpus %s files\n' \
        "$t" "$status" "${execs:-?}" "$secs" "${cov:-?}" "$(find "$corpus" -type f | wc -l)"
    results+=("$(jq -n --arg t "$t" --arg s "$status" --arg e "${execs:-0}" --arg c "${cov:-0}" \
        --argjson secs "$secs" \
        '{target: $t, status: $s, execs: ($e | tonumber? // 0), coverage: ($c | tonumber? // 0), seconds: $secs}')")
done

if [ -n "$json" ]; then
    printf '%s\n' "${results[@]}" | jq -s --arg san "$sanitizer" '{sanitizer: $san, targets: .}' >"$json"
fi
exit "$failed"
