#!/usr/bin/env bash
# An OCI image layout (tar) of one layer holding a directory, as
# `ctr images import` takes it, under the name given:
#
#   oci-archive.sh ROOTFS NAME ENTRYPOINT[,ARG...] OUT.tar [USER]
#
# Layer and config are reproducible (sorted, mtime 0, root-owned), so the
# same ROOTFS gives the same image ID.
set -euo pipefail
[ "$#" -ge 4 ] || { echo "usage: $0 ROOTFS NAME ENTRYPOINT[,ARG...] OUT.tar [USER]" >&2; exit 64; }
rootfs=$1 name=$2 entrypoint=$3 out=$4 user=${5:-}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
blobs="$work/layout/blobs/sha256"
mkdir -p "$blobs"

# blob FILE: copies FILE into the layout, prints "DIGEST SIZE".
blob() {
    local digest size
    digest="$(sha256sum "$1" | cut -d' ' -f1)"
    size="$(stat -c %s "$1")"
    cp "$1" "$blobs/$digest"
    echo "sha256:$digest $size"
}

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
read -r layer layer_size < <(blob "$work/layer.tar")
jq -cn --arg layer "$layer" --arg ep "$entrypoint" --arg user "$user" \
    '{architecture: "amd64", os: "linux",
      config: {Entrypoint: ($ep | split(",")), Cmd: [], User: $user,
              Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
      rootfs: {type: "layers", diff_ids: [$layer]}}' >"$work/config.json"
read -r config config_size < <(blob "$work/config.json")
jq -cn --arg config "$config" --argjson csize "$config_size" --arg layer "$layer" --argjson lsize "$layer_size" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $config, size: $csize},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $layer, size: $lsize}]}' \
    >"$work/manifest.json"
read -r manifest manifest_size < <(blob "$work/manifest.json")
jq -cn --arg m "$manifest" --argjson size "$manifest_size" --arg name "$name" --arg ref "${name##*:}" \
    '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
      digest: $m, size: $size, platform: {architecture: "amd64", os: "linux"},
      annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $ref}}]}' \
    >"$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
tar -C "$work/layout" -cf "$out.tmp" .
mv "$out.tmp" "$out"
