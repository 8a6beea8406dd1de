//! podgate-router: the CNI plugin binary (the plugin is `podgate_router::Router`).

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

fn main() {
    podgate_cni::run(
        podgate_router::Router,
        "podgate-router",
        "podgate-router: CNI plugin (chained) for pods that route: sysctls, masquerade, return routes",
    )
}
