#!/usr/bin/env bash
# Builds the throwaway cluster's components from the Go module proxy with
# the machine's Go, once per version, into ~/.cache/podgate/:
#
#   k8s/<version>-<sources>/bin   podgate-k8s, one binary linking
#       kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#       kube-proxy and kubectl (links by those names); etcd; crictl
#   containerd/<version>/bin      containerd, ctr, containerd-shim-runc-v2
#   helm/<version>/bin            helm (the chart's tests)
#
#   bash integration/k8s/build.sh          build what is missing
#   bash integration/k8s/build.sh --env    also print K8S_BIN=... CONTAINERD2_BIN=... HELM_BIN=...
#
# Versions: Kubernetes and etcd as the wrapper modules beside this script
# pin them (components/go.mod, etcd/go.mod: k8s.io/kubernetes cannot be
# `go install`ed itself, its go.mod replaces its staging modules with
# directories); crictl and containerd below. The first build, with an
# empty Go module cache, took 19 minutes on 2 cores in a cold CI run
# (Kubernetes, etcd and crictl 15, containerd 1.5, helm 2.5); later runs
# build nothing.
# It fails with the reason when a piece cannot be had.
set -euo pipefail

CRICTL_VERSION=v1.37.0
CONTAINERD_VERSION=v2.4.2
HELM_VERSION=v4.3.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PODGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podgate}"

# The machine's Go, never Debian's golang-go (1.19, too old for these
# modules), whatever PATH says.
go=/usr/local/go/bin/go
[ -x "$go" ] || { echo "k8s/build.sh: $go not found (the machine's Go toolchain)" >&2; exit 1; }
export PATH="/usr/local/go/bin:$PATH" CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local

fail() {
    echo "k8s/build.sh: $*" >&2
    exit 1
}

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
quiet() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        fail "command failed: $*"
    fi
}

# A module's required version of a dependency, as its go.mod says.
required() {
    (cd "$1" && "$go" list -m -f '{{.Version}}' "$2")
}

# The sources' digest, so that a changed wrapper builds anew.
digest() {
    cat "$@" | sha256sum | cut -c1-12
}

build_components() {
    local version dir bin started
    version="$(required "$here/components" k8s.io/kubernetes)" ||
        fail "cannot read k8s.io/kubernetes's version from components/go.mod"
    dir="$cache/k8s/$version-$(digest "$here"/components/{go.mod,go.sum,main.go} "$here"/etcd/{go.mod,go.sum,main.go})"
    bin="$dir/bin"
    if [ ! -f "$dir/complete" ]; then
        started=$SECONDS
        echo "k8s/build.sh: building Kubernetes $version (apiserver, controller-manager, scheduler, kubelet, kube-proxy, kubectl), etcd and crictl $CRICTL_VERSION into $bin; the first build takes about 15 minutes on 2 cores" >&2
        rm -rf "$dir"
        mkdir -p "$bin"
        local minor="${version#v1.}"
        minor="${minor%%.*}"
        (cd "$here/components" && quiet "$go" build -trimpath -o "$bin/podgate-k8s" \
            -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$version" .)
        for name in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
            ln -sf podgate-k8s "$bin/$name"
        done
        (cd "$here/etcd" && quiet "$go" build -trimpath -o "$bin/etcd" -ldflags "-s -w" .)
        GOBIN="$bin" GOFLAGS= quiet "$go" install -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
            "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
        touch "$dir/complete"
        echo "k8s/build.sh: built in $((SECONDS - started)) s" >&2
    fi
    K8S_BIN="$bin"
}

build_containerd() {
    local dir="$cache/containerd/$CONTAINERD_VERSION" started
    if [ ! -f "$dir/complete" ]; then
        started=$SECONDS
        echo "k8s/build.sh: building containerd $CONTAINERD_VERSION (containerd, ctr, containerd-shim-runc-v2) into $dir/bin; about 2 minutes" >&2
        rm -rf "$dir"
        mkdir -p "$dir/bin"
        local pkg=github.com/containerd/containerd/v2
        GOBIN="$dir/bin" GOFLAGS= quiet "$go" install -trimpath -tags "no_btrfs" \
            -ldflags "-s -w -X $pkg/version.Version=$CONTAINERD_VERSION" \
            "$pkg/cmd/containerd@$CONTAINERD_VERSION" \
            "$pkg/cmd/ctr@$CONTAINERD_VERSION" \
            "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
        touch "$dir/complete"
        echo "k8s/build.sh: built in $((SECONDS - started)) s" >&2
    fi
    CONTAINERD2_BIN="$dir/bin"
}

build_helm() {
    local dir="$cache/helm/$HELM_VERSION" started
    if [ ! -f "$dir/complete" ]; then
        started=$SECONDS
        echo "k8s/build.sh: building helm $HELM_VERSION into $dir/bin; about 3 minutes" >&2
        rm -rf "$dir"
        mkdir -p "$dir/bin"
        GOBIN="$dir/bin" GOFLAGS= quiet "$go" install -trimpath \
            -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
            "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
        touch "$dir/complete"
        echo "k8s/build.sh: built in $((SECONDS - started)) s" >&2
    fi
    HELM_BIN="$dir/bin"
}

build_components
build_containerd
build_helm
if [ "${1:-}" = "--env" ]; then
    printf 'K8S_BIN=%q\nCONTAINERD2_BIN=%q\nHELM_BIN=%q\n' "$K8S_BIN" "$CONTAINERD2_BIN" "$HELM_BIN"
fi
