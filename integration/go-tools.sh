#!/usr/bin/env bash
# The upstream Go tools the integration tests and the bench run, built from
# the Go module proxy with the machine's Go (/usr/local/go/bin/go, or
# $PODGATE_GO; never Debian's golang-go 1.19 at /usr/bin/go, too old for
# them):
#   cnitool  github.com/containernetworking/cni/cnitool, the libcni version
#            runner/go.mod pins (one place to move libcni)
#   plugins  github.com/containernetworking/plugins v1.10.0: the primaries
#            the tests chain after and the bench's tuning
# Each is built once per version into
# ${PODGATE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/podgate}/go/<name>-<version>/
# (the cache k8s/build.sh and image/build.sh use), with a line saying
# so and how long it took. A piece that cannot be had (no Go, no proxy, a
# build error) fails the script with the reason.
#
# Usage: go-tools.sh            build whatever is missing
#        go-tools.sh dir NAME   build NAME if missing, print its directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
go_bin="${PODGATE_GO:-/usr/local/go/bin/go}"
cache="${PODGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podgate}/go"

plugins_version=v1.10.0
plugins_module=github.com/containernetworking/plugins
plugins_pkgs=(main/bridge main/loopback main/ptp ipam/host-local meta/portmap meta/tuning)

die() {
    echo "go-tools.sh: $*" >&2
    exit 1
}

# The libcni version runner/go.mod requires.
cni_version() {
    local v
    v="$(awk '{ if ($1 == "require") $0 = substr($0, index($0, $2)) }
        $1 == "github.com/containernetworking/cni" { print $2 }' "$here/runner/go.mod")"
    [ -n "$v" ] || die "no github.com/containernetworking/cni requirement in $here/runner/go.mod"
    echo "$v"
}

# version NAME: the version NAME is built at.
version() {
    case "$1" in
        cnitool) cni_version ;;
        plugins) echo "$plugins_version" ;;
        *) die "unknown tool '$1' (cnitool, plugins)" ;;
    esac
}

# packages NAME VERSION: what `go install` builds for NAME.
packages() {
    case "$1" in
        cnitool) echo "github.com/containernetworking/cni/cnitool@$2" ;;
        plugins)
            local p
            for p in "${plugins_pkgs[@]}"; do
                echo "$plugins_module/plugins/$p@$2"
            done
            ;;
    esac
}

# build NAME: builds NAME into its cache dir unless there; prints the dir.
build() {
    local name="$1" ver dir tmp log start pkgs
    ver="$(version "$name")"
    dir="$cache/$name-$ver"
    if [ -f "$dir/.complete" ]; then
        echo "$dir"
        return
    fi
    [ -x "$go_bin" ] || die "$go_bin not found: the machine's Go (1.26) builds $name $ver from the module proxy (set PODGATE_GO to use another; Debian's /usr/bin/go 1.19 is too old)"
    mkdir -p "$cache"
    # One builder per tool at a time (tests in parallel processes ask too).
    exec {lock}>"$cache/$name-$ver.lock"
    flock "$lock"
    if [ ! -f "$dir/.complete" ]; then
        mapfile -t pkgs < <(packages "$name" "$ver")
        echo "go-tools.sh: building $name $ver with $("$go_bin" env GOVERSION) from $("$go_bin" env GOPROXY) into $dir" >&2
        start=$SECONDS
        tmp="$(mktemp -d "$cache/.$name-$ver.XXXXXX")"
        log="$tmp/build.log"
        # Module mode at the tagged versions' own go.mod, static, no
        # toolchain download: a Go older than the module asks for fails here.
        if ! env -u GOFLAGS GO111MODULE=on GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$tmp/bin" \
            "$go_bin" install -trimpath "${pkgs[@]}" >"$log" 2>&1; then
            echo "go-tools.sh: cannot build $name $ver (module proxy $("$go_bin" env GOPROXY)):" >&2
            cat "$log" >&2
            rm -rf "$tmp"
            exit 1
        fi
        rm -rf "$dir"
        mv "$tmp/bin" "$dir"
        rm -rf "$tmp"
        touch "$dir/.complete"
        echo "go-tools.sh: built $name $ver in $((SECONDS - start)) s" >&2
    fi
    exec {lock}>&-
    echo "$dir"
}

case "${1:-}" in
    "")
        build cnitool >/dev/null
        build plugins >/dev/null
        ;;
    dir)
        [ $# -eq 2 ] || die "usage: go-tools.sh [dir NAME]"
        build "$2"
        ;;
    *) die "usage: go-tools.sh [dir NAME]" ;;
esac
