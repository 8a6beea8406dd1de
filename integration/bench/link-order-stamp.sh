# shellcheck shell=bash
# What the symbol names in plugins/router/link-order.txt depend on besides
# the source: the toolchain and every crate's version (Cargo.lock). One line,
# written into the file's header by link-order.sh and compared by run.sh.
link_order_stamp() { # ROOT
    echo "# built-with: $(rustc -V | cut -d' ' -f1-2) Cargo.lock $(sha256sum "$1/Cargo.lock" | cut -c1-16)"
}
