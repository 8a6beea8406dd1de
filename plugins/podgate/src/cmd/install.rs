//! `podgate install` / `podgate uninstall` / `podgate agent` and the
//! agent's helpers (`podgate sysctl-broker`, `podgate cri-proxy`): the
//! podgate-install crate does the work; its errors are all exit code 1,
//! worded by that crate.

use crate::error::{Error, Found};
use podgate_install::agent::AgentArgs;
use podgate_install::cri_proxy::CriProxyArgs;
use podgate_install::sysctl_broker::SysctlBrokerArgs;
use podgate_install::{InstallArgs, UninstallArgs};

fn done(r: Result<(), podgate_install::Error>) -> Result<Found, Error> {
    r.map(|()| Found::Ok).map_err(Error::from)
}

pub fn install(args: &InstallArgs) -> Result<Found, Error> {
    done(podgate_install::install(args))
}

pub fn uninstall(args: &UninstallArgs) -> Result<Found, Error> {
    done(podgate_install::uninstall(args))
}

pub fn agent(args: &AgentArgs) -> Result<Found, Error> {
    done(podgate_install::agent::run(args))
}

pub fn sysctl_broker(args: &SysctlBrokerArgs) -> Result<Found, Error> {
    done(podgate_install::sysctl_broker::run(args))
}

pub fn cri_proxy(args: &CriProxyArgs) -> Result<Found, Error> {
    done(podgate_install::cri_proxy::run(args))
}
