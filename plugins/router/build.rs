//! Link-time code layout for the shipped binary (README "The hot code on as
//! few pages as possible").
//!
//! With `PODGATE_LINK_ORDER=1` (the Dockerfile and integration/bench set it)
//! the `podgate-router` binary is linked with `link-order.txt`: the functions
//! pass-through, masquerade and return-route requests execute (those most
//! requests run first), so LLD places them next to each other and a call
//! faults in a few 64 KiB windows of code instead of most of the binary. Missing names
//! (a renamed function, a dependency bump) are skipped by the linker, so a
//! stale file costs speed, never a broken build; `integration/bench/link-order.sh`
//! regenerates it and the bench reports how much of it the binary still has.
//!
//! Off by default: `--symbol-ordering-file` is an LLD option (the default
//! linker of x86_64-unknown-linux-gnu since Rust 1.90), and the workspace
//! builds with older toolchains and other linkers too.

fn main() {
    println!("cargo:rerun-if-env-changed=PODGATE_LINK_ORDER");
    println!("cargo:rerun-if-changed=link-order.txt");
    if std::env::var_os("PODGATE_LINK_ORDER").is_some_and(|v| v == "1") {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
        println!(
            "cargo:rustc-link-arg-bin=podgate-router=-Wl,--symbol-ordering-file={dir}/link-order.txt"
        );
        println!("cargo:rustc-link-arg-bin=podgate-router=-Wl,--no-warn-symbol-ordering");
    }
}
