// No std runtime start: `podgate_cni::skel::process_start` does the part of
// it a plugin needs.
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
extern "C" {
    /// glibc's `mallopt(3)`.
    fn mallopt(param: i32, value: i32) -> i32;
}

/// Every allocation of the call comes off a static region first
/// (`podgate_cni::arena`: a bump allocator; what does not fit goes to
/// glibc's malloc).
#[cfg(not(test))]
#[global_allocator]
static ALLOC: podgate_cni::arena::Arena<{ 1 << 20 }> = podgate_cni::arena::Arena::new();

/// glibc's `M_ARENA_MAX`.
#[cfg(not(test))]
const M_ARENA_MAX: i32 = -8;

/// The C entry point (`#![no_main]`); a CNI plugin takes no arguments.
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    ALLOC.touch();
    // One malloc arena: the thread ADD runs in the pod's namespace would
    // otherwise get one of its own on its first allocation (a 64 MiB
    // reservation: mmap, munmap twice, mprotect) for a few KiB of work.
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // other thread exists.
    unsafe {
        mallopt(M_ARENA_MAX, 1);
    }
    podgate_cni::run(
        podgate_router::Router,
        "podgate-router",
        "podgate-router: CNI plugin (chained) for pods that route: sysctls, masquerade, return routes",
    )
}
