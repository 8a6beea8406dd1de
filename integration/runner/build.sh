#!/usr/bin/env bash
# Build integration/runner (cnirunner) offline against Debian's packaged libcni
# (golang-github-appc-cni-dev, GOPATH layout under /usr/share/gocode).
# Output: <workspace>/target/cnirunner. Quiet unless the build fails.
# Usage: integration/runner/build.sh [OUTPUT]   (Go build cache: OUTPUT's dir/go-cache)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
out="${1:-$target/cnirunner}"
gopath=/usr/share/gocode

if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: 'go' not found (apt-get install golang-go)" >&2
    exit 1
fi
if [ ! -d "$gopath/src/github.com/containernetworking/cni/libcni" ]; then
    echo "build.sh: libcni sources missing under $gopath (apt-get install golang-github-appc-cni-dev)" >&2
    exit 1
fi

case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cache="$(dirname "$out")/go-cache"
mkdir -p "$(dirname "$out")" "$cache"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

cd "$here"
# GOPATH mode: resolve imports from Debian's /usr/share/gocode, never the network.
env -u GOFLAGS \
    GO111MODULE=off \
    GOPATH="$gopath" \
    GOCACHE="$cache" \
    GOPROXY=off \
    GOTOOLCHAIN=local \
    CGO_ENABLED=0 \
    go build -trimpath -o "$tmp" .
# Atomic replace so concurrent users never see a half-written binary.
mv -f "$tmp" "$out"
trap - EXIT
