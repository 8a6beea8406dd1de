//! `podgate install` / `podgate uninstall` / `podgate agent`: the
//! podgate-install crate does the work; its errors are all exit code 1,
//! worded by that crate.

use crate::error::{Error, Found};
use podgate_install::agent::AgentArgs;
use podgate_install::{InstallArgs, UninstallArgs};

pub fn install(args: &InstallArgs) -> Result<Found, Error> {
    podgate_install::install(args)
        .map(|()| Found::Ok)
        .map_err(|e| Error::msg(e.to_string()))
}

pub fn uninstall(args: &UninstallArgs) -> Result<Found, Error> {
    podgate_install::uninstall(args)
        .map(|()| Found::Ok)
        .map_err(|e| Error::msg(e.to_string()))
}

pub fn agent(args: &AgentArgs) -> Result<Found, Error> {
    podgate_install::agent::run(args)
        .map(|()| Found::Ok)
        .map_err(|e| Error::msg(e.to_string()))
}
