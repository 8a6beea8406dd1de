//! podgate-tunnel-guard: a chained CNI plugin that fails ADD with code 11
//! (try again later) until the node's IPsec tunnel protection is really in
//! place, so no pod is wired up while tunnel traffic could leave in plaintext.
//! See the library docs for what "ready" means.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

fn main() {
    podgate_cni::run(
        podgate_tunnel_guard::TunnelGuard,
        podgate_tunnel_guard::plugin::NAME,
        "podgate-tunnel-guard: chained CNI plugin gating pod ADD on the node's IPsec tunnel protection",
    )
}
