#!/usr/bin/env bash
# The one command that runs every podgate check: installs what it needs
# (Debian packages, the Go libcni runner), then format, lint, unit tests and
# the root-only network-namespace integration tests. Run as root on Debian 12.
#   Benchmarks run in their short mode when CI=true or PODGATE_BENCH=short.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ "$(id -u)" -ne 0 ]; then
    echo "integration/test.sh: run as root (the tests create network namespaces)" >&2
    exit 1
fi

step() { printf '\n== %s\n' "$*"; }

step "dependencies (apt packages, Go tools: cnitool, reference plugins, libcni runner)"
bash integration/install-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

# Private items are documented, so a link from a public item to a private
# one is fine; any other rustdoc warning (a broken link, bad HTML) fails.
step "cargo doc (intra-doc links resolve, private items too; no rustdoc warning)"
RUSTDOCFLAGS='-D warnings -A rustdoc::private_intra_doc_links' \
    cargo doc --workspace --no-deps --document-private-items --quiet

step "fuzz targets compile (integration/fuzz, its own workspace; run by the benchmarks)"
cargo check --manifest-path integration/fuzz/Cargo.toml --bins

step "build plugin binaries"
cargo build --workspace --bins

# cnitool keeps libcni's result cache in /var/lib/cni with no way to move
# it; the harness binds each test node's own directory there. An entry named
# after a cnitool container ID (cnitool-<hash>) in the machine's would be one
# that escaped.
cnitool_cache() { find /var/lib/cni/results -maxdepth 1 -name '*-cnitool-*' 2>/dev/null | sort; }
cnitool_before="$(cnitool_cache)"

# The machine's own podgate directories (the plugins' default stateDir and
# event file, the installer's and the agent's defaults): every test and
# benchmark writes inside its own temp dirs, so not one entry here is added,
# removed, resized or touched.
machine_state() {
    { find /var/lib/cni/podgate /var/lib/podgate -printf '%p %y %s %T@\n' 2>/dev/null || true; } | sort
}
machine_before="$(machine_state)"

# Tests and benchmarks name their temporary directories and files
# podgate-* or pg-* and remove them when they end. Other runs on the same
# machine may add and remove such names meanwhile: only a name absent before
# and still present after is this run's leftover.
temp_entries() { find "${TMPDIR:-/tmp}" -mindepth 1 -maxdepth 1 \( -name 'podgate-*' -o -name 'pg-*' \) 2>/dev/null | sort; }
temp_before="$(temp_entries)"

step "tests: unit + netns integration"
# Integration test binaries share the machine's /var/run/netns; each test makes
# its own uniquely named namespaces, so tests may run in parallel.
cargo test --workspace -- --test-threads=4

if [ -x integration/lint-deploy.sh ]; then
    step "deployment files (Kubernetes schemas, hadolint)"
    bash integration/lint-deploy.sh
fi

if { [ "${CI:-}" = "true" ] || [ "${PODGATE_BENCH:-}" = "short" ]; } && [ -x integration/bench/run.sh ]; then
    step "benchmarks (short mode)"
    bash integration/bench/run.sh --short
fi

escaped="$(comm -13 <(echo "$cnitool_before") <(cnitool_cache) | sed '/^$/d')"
if [ -n "$escaped" ]; then
    echo "integration/test.sh: cnitool wrote to the machine's /var/lib/cni:" >&2
    echo "$escaped" >&2
    exit 1
fi

touched="$(diff <(echo "$machine_before") <(machine_state) || true)"
if [ -n "$touched" ]; then
    echo "integration/test.sh: the tests wrote to the machine's /var/lib/cni/podgate or /var/lib/podgate:" >&2
    echo "$touched" >&2
    exit 1
fi

left_in_tmp="$(comm -13 <(echo "$temp_before") <(temp_entries) | sed '/^$/d')"
if [ -n "$left_in_tmp" ]; then
    echo "integration/test.sh: the tests left temporary files behind:" >&2
    echo "$left_in_tmp" >&2
    exit 1
fi

leftover="$(ip netns list | grep -c '^pg-' || true)"
if [ "$leftover" != "0" ]; then
    echo "integration/test.sh: $leftover test network namespaces were left behind:" >&2
    ip netns list | grep '^pg-' >&2
    exit 1
fi
echo
echo "all checks passed"
