//! `podgate install` / `podgate uninstall`: chain podgate into the node's
//! primary conflist (owned by the installer work; interface only so far).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// Where the container runtime looks for CNI binaries.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// Where the container runtime looks for CNI configs.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("not implemented yet")]
    NotYet,
}

pub fn install(_args: &InstallArgs) -> Result<(), InstallError> {
    Err(InstallError::NotYet)
}

pub fn uninstall(_args: &UninstallArgs) -> Result<(), InstallError> {
    Err(InstallError::NotYet)
}
