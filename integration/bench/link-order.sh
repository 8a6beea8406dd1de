#!/bin/bash
# Regenerate plugins/router/link-order.txt: the symbols podgate-router runs,
# grouped by request, most frequent request first, for LLD's --symbol-ordering-file (README "The
# hot code on as few pages as possible"; plugins/router/build.rs uses it when
# PODGATE_LINK_ORDER=1, as the Dockerfile and the bench build).
#
#   integration/bench/link-order.sh          (root; needs valgrind)
#
# Builds the shipped static binary, then runs it under callgrind (which
# records every function executed, by its mangled name) for the requests a
# node sees, most frequent first: ADD and DEL of a pod without a profile, of
# masquerade, return-route and masquerade + route pods, then their CHECKs,
# STATUS and GC. Only names the
# binary really has are kept. Run it again after a dependency bump or a
# toolchain change (symbol names carry crate hashes); the bench prints how
# much of the file the current binary still has.
#
# Namespaces are made here (pg-order-*) and removed on every exit path; the
# machine's own namespace is never touched.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
out="$root/plugins/router/link-order.txt"
for tool in valgrind nm ip nsenter; do
    command -v "$tool" >/dev/null || { echo "$0: $tool missing" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "$0: must run as root (network namespaces)" >&2; exit 2; }
# shellcheck source=integration/bench/link-order-stamp.sh
. "$here/link-order-stamp.sh"

# Built as the Dockerfile builds it: its profile and its package set (both
# are part of the crate hashes in the symbol names: the packages built
# together decide the dependencies' features, e.g. nix's), with the symbols
# kept (-C strip=none: callgrind and nm need the names; RUSTFLAGS are not
# hashed), in a target dir of its own so the shipped build is left alone.
# shellcheck disable=SC2086
(cd "$root" && CARGO_TARGET_DIR="$target/link-order" \
    RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static -C strip=none" \
    cargo build -q --release --target x86_64-unknown-linux-gnu $SHIPPED_PACKAGES)
bin="$target/link-order/x86_64-unknown-linux-gnu/release/podgate-router"

# shellcheck source=integration/bench/pod-netns.sh
. "$here/pod-netns.sh"
bench_pod_netns order 1.0.0
export CNI_CONTAINERID=order-1
call() { # KEY POD COMMAND [CONF]: the profile goes to KEY.cg (keys sort by priority)
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=$2" CNI_COMMAND=$3 \
        in_node valgrind --tool=callgrind --demangle=no \
        --compress-strings=no --dump-instr=no --callgrind-out-file="$tmp/$1.cg" \
        "$bin" <"${4:-$tmp/conf.json}" >"$tmp/out.json" 2>"$tmp/valgrind.txt" ||
        { echo "$0: $3 of pod $2 failed:" >&2; cat "$tmp/out.json" "$tmp/valgrind.txt" >&2; exit 1; }
}
# Priority: on a node most pods have no profile, every pod is ADDed and DELed
# once, CHECK is rarer.
i=0
for pod_name in plain vpn-gateway vpn-routed vpn-full; do
    i=$((i + 1))
    call "1$i-add" "$pod_name" ADD
    call "1$i-check" "$pod_name" CHECK
    call "1$i-del" "$pod_name" DEL
done
mv "$tmp/11-check.cg" "$tmp/21-check.cg" # the pass-through's CHECK after every ADD/DEL
for k in 12 13 14; do mv "$tmp/$k-check.cg" "$tmp/2${k#1}-check.cg"; done
printf '%s' '{"cniVersion":"1.1.0","name":"bench","type":"podgate-router","stateDir":"'"$tmp"'/state","cni.dev/valid-attachments":[]}' >"$tmp/v11.json"
call 31-status plain STATUS "$tmp/v11.json"
call 32-gc plain GC "$tmp/v11.json"

nm "$bin" | awk '{print $NF}' | sort -u >"$tmp/syms"
# Each request's functions after those of the more frequent requests before
# it: a pass-through ADD then runs in one contiguous block, a masquerade ADD
# in that block and the next. Within a block by name (callgrind lists
# functions in no stable order), so the same tree gives the same file. Only
# names the binary has.
: >"$tmp/profiled"
for f in "$tmp"/*.cg; do
    sed -n 's/^fn=//p' "$f" | sort -u | grep -vxFf "$tmp/profiled" >>"$tmp/profiled" || true
done
# What runs natively but not under valgrind, put first (every call runs it):
# valgrind emulates a CPU without AVX-512, so glibc picks the AVX2 variants
# of its string functions there and the EVEX/AVX-512 ones on such a node
# (both kept: the variant families the profile shows, in those flavours);
# valgrind has no vDSO, so glibc's vDSO symbol lookup at start-up, and the
# exit-time frees of a static binary, never show in the profile. strcmp
# neither: valgrind replaces it, so no variant of it shows, and glibc's
# start-up calls it (the tunables) in every process.
variants='(sse2|ssse3|sse4_1|sse4_2|sse42|avx|avx2|evex|avx512)'
for family in $({ grep -oE "^__[a-z0-9]+_$variants" "$tmp/profiled" | sed -E "s/_$variants\$//"; echo __strcmp; } | sort -u); do
    grep -E "^${family}_(evex|avx512|avx2)" "$tmp/syms" || true
done >"$tmp/native"
printf '%s\n' _dl_lookup_symbol_x do_lookup_x check_match _dl_name_match_p \
    setup_vdso_pointers dl_vdso_vsym frame_dummy register_tm_clones \
    deregister_tm_clones __do_global_dtors_aux free_mem __libc_freeres >>"$tmp/native"
cat "$tmp/native" "$tmp/profiled" | awk '!seen[$0]++' >"$tmp/order"
# The header (comment lines, which LLD skips) says what the names belong to:
# the bench compares it with the tree it builds (integration/bench/run.sh).
{
    echo "# generated by integration/bench/link-order.sh; regenerate after a dependency or toolchain change"
    link_order_stamp "$root"
    grep -Fxf "$tmp/syms" "$tmp/order"
} >"$out"
echo "$0: $(grep -vc '^#' "$out") symbols ($(wc -l <"$tmp/order") functions run) -> $out"
