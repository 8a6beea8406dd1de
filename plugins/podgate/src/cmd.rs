//! One module per command family.

pub mod admission;
pub mod diagnose;
pub mod inspect;
pub mod install;
pub mod ipsec;
pub mod route;
pub mod rule;
pub mod sysctl;
