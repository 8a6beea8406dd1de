#!/usr/bin/env bash
# Build podgate's image from the repository's Dockerfile, unchanged, with
# podman on a machine that cannot pull container images:
#
#   bash integration/image/build.sh --arch amd64|arm64 --tag IMAGE:TAG \
#       [--commit SHA] [--out FILE.tar]
#
# The Dockerfile's base images are supplied as local images under the exact
# names its FROM lines use (a local image of that name is taken without a
# pull), made once and reused:
#  * the build stage (docker.io/library/rust:<version>-bookworm): a Debian
#    bookworm from `mmdebstrap --variant=minbase` with what the official rust
#    image adds (gcc, libc6-dev, ca-certificates) and this machine's Rust
#    toolchain in that image's layout (/usr/local/cargo, /usr/local/rustup,
#    rustup's proxies on PATH), with the aarch64 target for the arm64 image;
#  * the runtime stage (gcr.io/distroless/static-debian12:nonroot): the
#    distroless layout podgate relies on (/etc/passwd and /etc/group with
#    nonroot = 65532, its home, /tmp), one image per architecture, tagged
#    under the FROM name for the build that needs it.
# The build runs with the host network (podman's default build network adds
# a bridge, nftables tables and turns the machine's ip_forward on), the
# machine's CA bundle mounted read-only (cargo reaches crates.io over TLS),
# and a cargo cache mounted into it ($PODGATE_IMAGE_CACHE, default
# ~/.cache/podgate/image-build, outside the checkout: the registry, shared,
# and one target dir per checkout path, for both architectures (the build
# scripts and proc macros, built for the build machine, serve both; a
# checkout of its own, because cargo takes a path crate's artifacts built
# from another checkout as fresh while they are newer than its sources).
# --out saves a docker-archive that
# `ctr -n k8s.io images import` takes with the image name.
#
# Builds are serialized machine-wide (podman's image store and the FROM tags
# are shared by every checkout). Quiet unless something fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

# Bump when what the stand-ins contain changes: they are made again (the
# build stage's carries it as a label, the runtime's in its tag, so that no
# stand-in label reaches the shipped image).
STANDIN_REVISION=1
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

usage() {
    echo "usage: $0 --arch amd64|arm64 --tag IMAGE:TAG [--commit SHA] [--out FILE.tar]" >&2
    exit 64
}

fail() {
    echo "image/build.sh: $*" >&2
    exit 1
}

arch="" tag="" commit="" out=""
while [ "$#" -gt 0 ]; do
    case "$1" in
    --arch) arch="${2:-}" && shift 2 ;;
    --tag) tag="${2:-}" && shift 2 ;;
    --commit) commit="${2:-}" && shift 2 ;;
    --out) out="${2:-}" && shift 2 ;;
    *) usage ;;
    esac
done
[ -n "$tag" ] || usage
case "$arch" in
amd64) rust_arch_target=x86_64-unknown-linux-gnu ;;
arm64) rust_arch_target=aarch64-unknown-linux-gnu ;;
*) usage ;;
esac
if [ -z "$commit" ]; then
    commit="$(git -C "$root" rev-parse HEAD 2>/dev/null)" ||
        fail "no --commit given and $root is not a git checkout"
fi
[ "$(id -u)" -eq 0 ] || fail "run as root (podman's root image store)"
for tool in podman mmdebstrap rustup rustc; do
    command -v "$tool" >/dev/null || fail "$tool not found; run integration/install-deps.sh"
done
[ "$(uname -m)" = x86_64 ] || fail "the stand-in build stage is made for an x86_64 build machine"

log="$(mktemp)"
work=""
cleanup() {
    rm -f "$log"
    if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

quiet() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        fail "command failed: $*"
    fi
}

# The FROM lines: the first names the build stage, the last the runtime.
mapfile -t froms < <(sed -nE 's/^FROM[[:space:]]+(--platform=[^[:space:]]+[[:space:]]+)?([^[:space:]]+).*/\2/p' Dockerfile)
[ "${#froms[@]}" -ge 2 ] || fail "expected a build and a runtime FROM line in the Dockerfile"
build_from="${froms[0]}"
runtime_from="${froms[${#froms[@]} - 1]}"
# rust:<major>.<minor>[.<patch>]-bookworm
rust_version="$(sed -nE 's/.*:([0-9]+\.[0-9]+(\.[0-9]+)?)-bookworm$/\1/p' <<<"$build_from")"
[ -n "$rust_version" ] || fail "cannot read the Rust version from $build_from"

lock=/run/lock/podgate-image-build.lock
mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
flock 9

revision_of() {
    podman image inspect --format '{{ index .Labels "dev.podgate.standin" }}' "$1" 2>/dev/null || true
}

cache="${PODGATE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podgate/image-build}"
target_cache="$cache/target-$(printf '%s' "$root" | sha256sum | cut -c1-12)"
mkdir -p "$cache/registry" "$target_cache"

# ---- the build stage's stand-in ---------------------------------------------
make_build_standin() {
    local sysroot toolchain version rustup_bin
    version="$(rustc --version)"
    case "$version" in
    "rustc $rust_version "* | "rustc $rust_version."*) ;;
    *) fail "the Dockerfile builds with Rust $rust_version, this machine's rustc is '$version'" ;;
    esac
    version="$(sed -E 's/^rustc ([0-9.]+).*/\1/' <<<"$version")"
    # The arm64 image cross-compiles in the build stage: its toolchain has to
    # carry the aarch64 standard library (the official image gets it from
    # the Dockerfile's `rustup target add`, which is then a no-op here).
    if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
        quiet rustup target add aarch64-unknown-linux-gnu
    fi
    sysroot="$(rustc --print sysroot)"
    [ -d "$sysroot/lib/rustlib/aarch64-unknown-linux-gnu/lib" ] ||
        fail "no aarch64-unknown-linux-gnu standard library under $sysroot"
    rustup_bin="$(command -v rustup)"
    rustup_bin="$(readlink -f "$rustup_bin")"
    toolchain="$version-x86_64-unknown-linux-gnu"

    work="$(mktemp -d "$cache/standin.XXXXXX")"
    # Layout of the official image (rust:<version>-bookworm): rustup's
    # proxies in /usr/local/cargo/bin, one default toolchain in
    # /usr/local/rustup. The toolchain's docs (share/) are left out.
    cat >"$work/populate.sh" <<EOF
set -eu
chroot_dir="\$1"
tc="\$chroot_dir/usr/local/rustup/toolchains/$toolchain"
mkdir -p "\$tc" "\$chroot_dir/usr/local/cargo/bin"
tar -C "$sysroot" --exclude=./share -cf - . | tar -C "\$tc" -xf -
printf 'version = "12"\nprofile = "minimal"\ndefault_toolchain = "$toolchain"\n' \
    >"\$chroot_dir/usr/local/rustup/settings.toml"
install -m 0755 "$rustup_bin" "\$chroot_dir/usr/local/cargo/bin/rustup"
for proxy in cargo cargo-clippy cargo-fmt clippy-driver rustc rustdoc rustfmt; do
    ln "\$chroot_dir/usr/local/cargo/bin/rustup" "\$chroot_dir/usr/local/cargo/bin/\$proxy"
done
EOF
    quiet mmdebstrap --variant=minbase --include=ca-certificates,gcc,libc6-dev \
        --customize-hook="sh $work/populate.sh \"\$1\"" \
        bookworm "$work/rootfs.tar" \
        "deb $DEBIAN_MIRROR bookworm main" \
        "deb $DEBIAN_MIRROR bookworm-updates main" \
        "deb $DEBIAN_SECURITY_MIRROR bookworm-security main"
    quiet podman import --arch amd64 \
        --change "ENV RUSTUP_HOME=/usr/local/rustup" \
        --change "ENV CARGO_HOME=/usr/local/cargo" \
        --change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV RUST_VERSION=$version" \
        --change "LABEL dev.podgate.standin=$STANDIN_REVISION" \
        --change "CMD [\"bash\"]" \
        --message "podgate stand-in for $build_from" \
        "$work/rootfs.tar" "$build_from"
    rm -rf "$work"
    work=""
}

if [ "$(revision_of "$build_from")" != "$STANDIN_REVISION" ]; then
    make_build_standin
fi

# ---- the runtime stage's stand-in (one per architecture) --------------------
runtime_standin="localhost/podgate-standin/distroless-static:r$STANDIN_REVISION-nonroot-$arch"
make_runtime_standin() {
    work="$(mktemp -d "$cache/standin.XXXXXX")"
    local fs="$work/rootfs"
    mkdir -p "$fs/etc" "$fs/home/nonroot" "$fs/tmp" "$fs/root"
    cat >"$fs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
    cat >"$fs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
    chmod 0700 "$fs/root"
    chmod 1777 "$fs/tmp"
    chown 65532:65532 "$fs/home/nonroot"
    chmod 0700 "$fs/home/nonroot"
    tar -C "$fs" --numeric-owner -cf "$work/rootfs.tar" .
    quiet podman import --arch "$arch" \
        --change "USER 65532" \
        --change "WORKDIR /home/nonroot" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --message "podgate stand-in for $runtime_from ($arch)" \
        "$work/rootfs.tar" "$runtime_standin"
    rm -rf "$work"
    work=""
}

if ! podman image exists "$runtime_standin"; then
    make_runtime_standin
fi

# ---- the image --------------------------------------------------------------
# BUILDPLATFORM given explicitly: podman 4.3 (buildah 1.28) leaves it unset
# when it prepares a stage that a later `COPY --from` names, and then looks
# for the build stage's base image for the target platform.
volumes=(
    -v "$cache/registry:/usr/local/cargo/registry"
    -v "$target_cache:/src/target"
)
if [ -f "$CA_BUNDLE" ]; then
    volumes+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
fi
quiet podman tag "$runtime_standin" "$runtime_from"
quiet podman build \
    --runtime runc \
    --network host \
    --pull=never \
    --ulimit nofile=10000:10000 --ulimit nproc=1000:1000 \
    --platform "linux/$arch" \
    --build-arg BUILDPLATFORM=linux/amd64 \
    --build-arg "PODGATE_COMMIT=$commit" \
    "${volumes[@]}" \
    --file Dockerfile \
    --tag "$tag" \
    "$root"

# The build stage's image (toolchain, sources: about 1.5 GB each) is left
# untagged; drop it and any older one, or repeated builds fill the disk.
quiet podman image prune --force

built_arch="$(podman image inspect --format '{{.Architecture}}' "$tag")"
[ "$built_arch" = "$arch" ] || fail "built $tag for $built_arch, not $arch"

if [ -n "$out" ]; then
    rm -f "$out"
    quiet podman save --format docker-archive --output "$out" "$tag"
fi
echo "image/build.sh: built $tag (linux/$arch, $rust_arch_target, commit $commit)${out:+, saved to $out}"
