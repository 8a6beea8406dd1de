//! One module per command family.

pub mod diagnose;
pub mod inspect;
pub mod install;
pub mod ipsec;
pub mod route;
pub mod rule;
pub mod sysctl;
