#!/usr/bin/env bash
# The problem podgate solves, shown on a three-node cluster made of network
# namespaces (integration/src/cluster.rs: nodes A, B, C on one fabric, pod
# CIDRs wired by the real bridge + host-local plugins through libcni, a
# Service DNATed on every node, a backend on each node): a real OpenVPN
# client outside the cluster reaches nothing past the OpenVPN pod while the
# pod does not forward, and everything once the pod is recreated with
# podgate's profile. `podgate diagnose` names the silent hop. The story is
# integration/examples/demo.rs; it exits non-zero when the story does not
# hold, and removes everything it made.
#   PODGATE_DEMO_PROFILE=debug uses the debug build (CI; default: release).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: run as root (it creates network namespaces)" >&2; exit 1; }

profile="${PODGATE_DEMO_PROFILE:-release}"
case "$profile" in
    release) flags=(--release) ;;
    debug) flags=() ;;
    *) echo "demo.sh: PODGATE_DEMO_PROFILE must be release or debug" >&2; exit 1 ;;
esac

echo "== installing dependencies and building podgate ($profile)"
bash integration/install-deps.sh
cargo build "${flags[@]}" --quiet --bins
cargo build "${flags[@]}" --quiet -p podgate-integration --example demo
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac

PODGATE_BIN_DIR="$target/$profile" exec "$target/$profile/examples/demo"
