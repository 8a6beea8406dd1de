#!/usr/bin/env bash
# The images the throwaway cluster runs, built here (no registry can be
# reached), as archives `ctr images import` takes:
#
#   images/build.sh pause|greeter|openvpn OUT.tar
#
#   pause    localhost/podgate/pause:3.10, every sandbox's (a static C pause)
#   greeter  localhost/podgate/greeter:1, a test backend answering TCP on
#            8080 with its pod's name (static C)
#   openvpn  docker.io/kylemanna/openvpn:2.4, the name
#            conf/kubernetes/openvpn-example.yaml runs: Debian's openvpn and
#            the libraries it links
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ "$#" -eq 2 ] || { echo "usage: $0 pause|greeter|openvpn OUT.tar" >&2; exit 64; }
what=$1 out=$2
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
case "$what" in
pause)
    gcc -static -Os -o "$root/pause" "$here/pause.c"
    bash "$here/oci-archive.sh" "$root" localhost/podgate/pause:3.10 /pause "$out"
    ;;
greeter)
    gcc -static -Os -o "$root/greeter" "$here/greeter.c"
    bash "$here/oci-archive.sh" "$root" localhost/podgate/greeter:1 /greeter "$out" 65534
    ;;
openvpn)
    bin="$(command -v openvpn)" || { echo "images/build.sh: openvpn not installed" >&2; exit 1; }
    mkdir -p "$root/usr/sbin" "$root/tmp" "$root/etc"
    cp "$bin" "$root/usr/sbin/openvpn"
    # The executable's libraries and loader, at their paths.
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
    echo 'root:x:0:0:root:/root:/usr/sbin/nologin' >"$root/etc/passwd"
    echo 'root:x:0:' >"$root/etc/group"
    bash "$here/oci-archive.sh" "$root" docker.io/kylemanna/openvpn:2.4 /usr/sbin/openvpn "$out"
    ;;
*)
    echo "images/build.sh: no image '$what'" >&2
    exit 64
    ;;
esac
