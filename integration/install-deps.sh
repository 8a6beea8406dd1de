#!/usr/bin/env bash
# Install everything podgate's integration tests need on Debian 12 (run as
# root), then the Go tools: upstream cnitool and reference plugins (go-tools.sh)
# and the libcni test runner on both libcni versions (target/cnirunner,
# target/cnirunner-libcni13).
# Idempotent: apt is only touched when a package is missing. Quiet unless
# something fails (then the captured output is shown).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

packages=(
    golang-github-appc-cni-dev
    containernetworking-plugins
    nftables
    iptables
    iproute2
    iputils-ping
    openvpn
    openvswitch-switch
    jq
    procps
    coreutils
    util-linux
    python3
    python3-venv
    hyperfine
    time
    # bench/run.sh (static no-op floor), tests/soak.rs (fd shim, CLOEXEC audit)
    gcc
    libc6-dev
    strace
    # tests/containerd.rs: containerd (with ctr and the runc v2 shim) in a node
    # netns; protoc builds the k8s-cri bindings (helper and tests)
    containerd
    runc
    protobuf-compiler
    tar
    # tests/metrics.rs: `promtool check metrics` on the agent's /metrics
    prometheus
    # tests/image.rs (integration/image/build.sh): podman builds the
    # Dockerfile on a bookworm made by mmdebstrap; the arm64 image's binaries
    # run under qemu-user; `file` reads their ELF headers
    podman
    mmdebstrap
    qemu-user-static
    file
    git
)

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

quiet() {
    if ! "$@" >"$log" 2>&1; then
        echo "install-deps.sh: command failed: $*" >&2
        cat "$log" >&2
        exit 1
    fi
}

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: must run as root" >&2
    exit 1
fi

missing=()
for p in "${packages[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    if [ "$status" != "installed" ]; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    quiet apt-get update
    quiet apt-get install -y --no-install-recommends "${packages[@]}"
fi

# The arm64 image cross-compiles with this machine's toolchain (the build
# stage's stand-in carries it): its aarch64 standard library must be there.
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    quiet rustup target add aarch64-unknown-linux-gnu
fi

# tests/image.rs: Debian's docker-registry (a real registry, distribution
# 2.8) serves podgate's image to containerd inside a node netns. Its binary
# only, from the package: installing the package would enable its service
# and, where an init system runs, start it on this machine's own network
# (0.0.0.0:5000). The tests start the binary themselves, inside a netns.
registry_bin=/usr/local/libexec/podgate-it/docker-registry
if [ ! -x "$registry_bin" ]; then
    deb_dir="$(mktemp -d)"
    chmod 0755 "$deb_dir"
    if ! (cd "$deb_dir" && apt-get download docker-registry) >"$log" 2>&1; then
        quiet apt-get update
        (cd "$deb_dir" && quiet apt-get download docker-registry)
    fi
    quiet dpkg-deb -x "$deb_dir"/docker-registry_*.deb "$deb_dir/root"
    install -D -m 0755 "$deb_dir/root/usr/bin/docker-registry" "$registry_bin"
    rm -rf "$deb_dir"
fi

# The Go tools (the machine's Go, /usr/local/go/bin/go): upstream cnitool and
# the reference plugins v1.10.0 from the module proxy, cached per version under
# ~/.cache/podgate/go/ (a line per build; go-tools.sh fails with the reason
# when a piece cannot be had); the runner on Debian's libcni 1.1.2 (offline)
# and on libcni 1.3 (module proxy).
bash "$here/go-tools.sh"
quiet bash "$here/runner/build.sh"
quiet bash "$here/runner/build.sh" --libcni13

# tests/k8s: the real Kubernetes components, etcd, crictl and containerd
# 2.x, built from the Go module proxy once per version into
# ~/.cache/podgate (k8s/build.sh says when it builds and how long that
# takes: about 19 minutes the first time on 2 cores).
bash "$here/k8s/build.sh"
