# podgate installer image: podgate, podgate-router and podgate-tunnel-guard,
# statically linked, on an empty distroless base. Its DaemonSet
# (conf/kubernetes/podgate.yaml) runs `podgate install --watch`, which copies
# the two plugins into the host's CNI bin dir and writes podgate's own
# conflist (the primary CNI's chain plus podgate's, sorting first).
#
#   docker build -t registry.example.com/podgate/podgate:0.1.0 .

# ---- build ------------------------------------------------------------------
FROM docker.io/library/rust:1.95-bookworm AS build

# glibc with crt-static: fully static executables (no loader, no libc.so in
# the final image) from the stock toolchain, without a musl toolchain. None of
# the binaries resolve names through NSS, so static glibc is safe here.
# relocation-model=static: a plain static executable, not static-pie, so no
# start-up pass applying ~2,700 relocations (README "Where a masquerade ADD's
# time goes": 0.09 ms of every plugin call). integration/bench/run.sh builds
# with the same flags.
ARG TARGET=x86_64-unknown-linux-gnu
# PODGATE_LINK_ORDER=1: podgate-router's hot code placed together by LLD
# from plugins/router/link-order.txt (plugins/router/build.rs; README "The hot
# code on as few pages as possible"), as the bench measures it.
ENV RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    PODGATE_LINK_ORDER=1 \
    CARGO_TERM_COLOR=never

# protoc: the helper's CRI client (`k8s-cri`) generates its bindings at build
# time. Pinned to bookworm's version (the image's base).
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler=3.21.12-3+deb12u1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .
# These three packages in one build: integration/bench (SHIPPED_PACKAGES in
# link-order-stamp.sh) builds the same set, so the router's symbol names
# match plugins/router/link-order.txt (the packages built together decide
# the dependencies' features).
RUN cargo build --release --locked --target "${TARGET}" \
        -p podgate -p podgate-router -p podgate-tunnel-guard \
    && mkdir -p /out \
    && cp "target/${TARGET}/release/podgate" \
          "target/${TARGET}/release/podgate-router" \
          "target/${TARGET}/release/podgate-tunnel-guard" /out/

# ---- runtime ----------------------------------------------------------------
# distroless/static: CA certs, tzdata and /etc/passwd (nonroot = 65532), no
# shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot

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

ENTRYPOINT ["/usr/local/bin/podgate", "install", "--watch"]
