# podgate installer image: podgate, podgate-router and podgate-tunnel-guard,
# statically linked, on an empty distroless base. Its DaemonSet
# (conf/kubernetes/podgate.yaml) gives each container its arguments; without
# any it runs `podgate install --watch`, which copies the two plugins into
# the host's CNI bin dir and writes podgate's own conflist.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#       --build-arg PODGATE_COMMIT="$(git rev-parse HEAD)" \
#       -t registry.example.com/podgate/podgate:0.1.0 --push .
#
# (conf/kubernetes/README.md "Building the image": podman, one architecture
# at a time, and the multi-arch manifest.)

# ---- build ------------------------------------------------------------------
# Runs on the machine's own platform and cross-compiles for the target one:
# no emulated step, whichever architecture is built.
FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95-bookworm AS build

# protoc: the helper's CRI client (`k8s-cri`) generates its bindings at build
# time. The aarch64 cross linker and C library link the arm64 binaries.
# Pinned to bookworm's versions (the image's base).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        protobuf-compiler=3.21.12-3+deb12u1 \
        gcc-aarch64-linux-gnu=4:12.2.0-3 \
        libc6-dev-arm64-cross=2.36-8cross1 \
    && rm -rf /var/lib/apt/lists/*

# glibc with crt-static: fully static executables (no loader, no libc.so in
# the final image) from the stock toolchain, without a musl toolchain. None of
# the binaries resolve names through NSS, so static glibc is safe here.
# RUSTFLAGS apply to the target's binaries only (cargo is given --target).
ENV RUSTFLAGS="-C target-feature=+crt-static" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TERM_COLOR=never

WORKDIR /src
COPY . .

# TARGETARCH: set by buildx and podman from --platform (empty with docker's
# legacy builder: then the build machine's own architecture).
ARG TARGETARCH
# `podgate --version` names this commit (.git is not in the build context).
ARG PODGATE_COMMIT=unknown
RUN arch="${TARGETARCH:-$(dpkg --print-architecture)}" \
    && case "$arch" in \
        amd64) target=x86_64-unknown-linux-gnu ;; \
        arm64) target=aarch64-unknown-linux-gnu ;; \
        *) echo "no Rust target for architecture '$arch'" >&2 && exit 1 ;; \
    esac \
    && rustup target add "$target" \
    && PODGATE_COMMIT="$PODGATE_COMMIT" cargo build --release --locked --target "$target" \
        -p podgate -p podgate-router -p podgate-tunnel-guard \
    && mkdir -p /out \
    && cp "target/$target/release/podgate" \
          "target/$target/release/podgate-router" \
          "target/$target/release/podgate-tunnel-guard" /out/

# ---- runtime ----------------------------------------------------------------
# distroless/static: CA certs, tzdata and /etc/passwd (nonroot = 65532), no
# shell, no package manager. The target platform named (it is the default):
# podman 4.3 otherwise keeps looking for the build stage's platform.
# hadolint ignore=DL3065
FROM --platform=$TARGETPLATFORM gcr.io/distroless/static-debian12:nonroot

LABEL org.opencontainers.image.title="podgate" \
      org.opencontainers.image.description="Installs podgate's chained CNI plugins on every node" \
      org.opencontainers.image.licenses="Apache-2.0"

# `podgate install` defaults to the directory of its own executable as the
# source of the plugin binaries it copies to the host.
COPY --from=build /out/ /usr/local/bin/

# Non-root by default. The installer itself must run as root (uid 0, with
# every capability dropped) because it writes root-owned host directories
# (/opt/cni/bin, /etc/cni/net.d, /var/lib/cni/podgate): the DaemonSet sets
# runAsUser: 0 for it explicitly.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/podgate"]
CMD ["install", "--watch"]
