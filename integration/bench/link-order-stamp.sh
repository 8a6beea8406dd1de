# shellcheck shell=bash
# The packages the Dockerfile builds, in one cargo invocation: every build
# whose router binary should match plugins/router/link-order.txt builds
# exactly these together (the bench, link-order.sh), because the packages
# built together decide the features, and so the symbol names, of shared
# dependencies.
# shellcheck disable=SC2034
SHIPPED_PACKAGES="-p podgate -p podgate-router -p podgate-tunnel-guard"
# What the symbol names in plugins/router/link-order.txt depend on besides
# the source: the toolchain and every crate's version (Cargo.lock). One line,
# written into the file's header by link-order.sh and compared by run.sh.
link_order_stamp() { # ROOT
    echo "# built-with: $(rustc -V | cut -d' ' -f1-2) Cargo.lock $(sha256sum "$1/Cargo.lock" | cut -c1-16)"
}
