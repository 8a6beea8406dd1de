#!/usr/bin/env bash
# Build integration/runner (cnirunner) with the machine's Go
# (/usr/local/go/bin/go, or $PODGATE_GO), in one of two flavours:
#   (default)   on Debian's packaged libcni 1.1.2 (golang-github-appc-cni-dev,
#               GOPATH layout under /usr/share/gocode), offline: add, check, del
#   --libcni13  on the libcni go.mod pins, from the Go module proxy (module
#               mode, build tag libcni13): also gc and status
# Output: <workspace>/target/cnirunner (--libcni13: cnirunner-libcni13).
# Quiet unless the build fails.
# Usage: integration/runner/build.sh [--libcni13] [OUTPUT]   (Go build cache: OUTPUT's dir/go-cache)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
flavour=libcni112
if [ "${1:-}" = "--libcni13" ]; then
    flavour=libcni13
    shift
fi
if [ "$flavour" = libcni13 ]; then
    out="${1:-$target/cnirunner-libcni13}"
else
    out="${1:-$target/cnirunner}"
fi
gopath=/usr/share/gocode
go_bin="${PODGATE_GO:-/usr/local/go/bin/go}"

if [ ! -x "$go_bin" ]; then
    echo "build.sh: $go_bin not found (the machine's Go 1.26; set PODGATE_GO for another)" >&2
    exit 1
fi
if [ "$flavour" = libcni112 ] && [ ! -d "$gopath/src/github.com/containernetworking/cni/libcni" ]; then
    echo "build.sh: libcni sources missing under $gopath (apt-get install golang-github-appc-cni-dev)" >&2
    exit 1
fi

case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cache="$(dirname "$out")/go-cache"
mkdir -p "$(dirname "$out")" "$cache"
tmp="$out.tmp.$$"
log="$out.log.$$"
trap 'rm -f "$tmp" "$log"' EXIT

cd "$here"
if [ "$flavour" = libcni13 ]; then
    # Module mode: libcni and its requirements as go.mod/go.sum pin them.
    cmd=(env -u GOFLAGS GO111MODULE=on GOCACHE="$cache" GOTOOLCHAIN=local CGO_ENABLED=0
        "$go_bin" build -mod=readonly -tags libcni13 -trimpath -o "$tmp" .)
else
    # GOPATH mode: resolve imports from Debian's /usr/share/gocode, never the network.
    cmd=(env -u GOFLAGS GO111MODULE=off GOPATH="$gopath" GOCACHE="$cache" GOPROXY=off
        GOTOOLCHAIN=local CGO_ENABLED=0 "$go_bin" build -trimpath -o "$tmp" .)
fi
if ! "${cmd[@]}" >"$log" 2>&1; then
    echo "build.sh: building cnirunner ($flavour) failed:" >&2
    cat "$log" >&2
    exit 1
fi
# Atomic replace so concurrent users never see a half-written binary.
mv -f "$tmp" "$out"
