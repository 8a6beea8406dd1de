//! A plugin that panics, to test `install_panic_hook` through a real process
//! (integration/tests/faults.rs): the runtime must still get one CNI error
//! JSON on stdout (code 999, in the config's cniVersion) and exit status 1.
//!
//! ADD panics with a formatted (`String`) payload, DEL with a `&'static str`,
//! CHECK from a helper thread (re-raised on the main thread).

use podgate_cni::{Added, CniError, Plugin, Request};

struct Panics;

impl Plugin for Panics {
    fn add(&self, req: &Request) -> Result<Added, CniError> {
        panic!("deliberate panic in ADD of {}", req.env.container_id)
    }

    fn del(&self, _req: &Request) -> Result<(), CniError> {
        panic!("deliberate panic in DEL")
    }

    fn check(&self, _req: &Request) -> Result<(), CniError> {
        let joined = std::thread::spawn(|| -> Result<(), CniError> {
            panic!("deliberate panic on a helper thread")
        })
        .join();
        match joined {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

fn main() {
    podgate_cni::run(Panics, "podgate-panic-example", "panics on purpose")
}
