//! `podgate sysctl-broker`: the DaemonSet's `sysctl-broker` container, the
//! one holding a writable `/proc/sys/net`. It opens sysctls for the node
//! agent ([`podgate_kit::sysctl::broker`]): any `net.*` sysctl of a pod's
//! own namespace, and in the node's namespace only those podgate-router's
//! plans write there ([`podgate_router::routing::node_sysctl_allowed`]:
//! strict routing's node-wide and uplink settings, the host-side
//! interface's). Requests are answered one at a time on the main thread.

use crate::logging::{self, info, warn};
use crate::sys::{poll_readable, Signals};
use crate::{AgentLogArgs, Daemon, Error};
use clap::Args;
use podgate_cni::log::Level;
use podgate_kit::sysctl::broker::{Broker, Outcome};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct SysctlBrokerArgs {
    /// Serve on this unix socket (root only; one left by an earlier run is
    /// replaced), e.g. in a memory emptyDir shared with the agent.
    #[arg(long, value_name = "PATH")]
    pub listen: PathBuf,
    /// A writable procfs `sys` dir: the node's `/proc/sys/net` mounted at
    /// DIR/net (a container's own /proc/sys is read-only).
    #[arg(long, default_value = "/proc/sys", value_name = "DIR")]
    pub proc_sys: PathBuf,
    #[command(flatten)]
    pub log: AgentLogArgs,
}

pub fn run(args: &SysctlBrokerArgs) -> Result<(), Error> {
    logging::set(&args.log, "sysctl-broker");
    let signals = Signals::new().map_err(Error::sys(Daemon::Broker, "signalfd"))?;
    let broker = Broker::new(
        args.proc_sys.clone(),
        podgate_router::routing::node_sysctl_allowed,
    )?;
    let listener = crate::socket::bind(&args.listen)?;
    listener
        .set_nonblocking(true)
        .map_err(Error::sys(Daemon::Broker, "listener"))?;
    info(format!(
        "serving {}: pods' net.* sysctls in their own namespace, in the node's only podgate-router's node settings; writing through {}",
        args.listen.display(),
        args.proc_sys.display()
    ));
    loop {
        let [conn, sig] =
            poll_readable([listener.as_fd(), signals.fd()], Duration::from_secs(3600))
                .map_err(Error::sys(Daemon::Broker, "poll"))?;
        if sig {
            match signals
                .read()
                .map_err(Error::sys(Daemon::Broker, "signalfd"))?
            {
                Some(libc::SIGHUP) | None => {}
                Some(s) => {
                    info(format!("signal {s}: stopping"));
                    break;
                }
            }
        }
        if conn {
            match listener.accept() {
                Ok((stream, _)) => report(broker.serve(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => warn(format!("accept: {e}")),
            }
        }
    }
    let _ = std::fs::remove_file(&args.listen);
    Ok(())
}

fn report(outcome: Outcome) {
    match outcome {
        Outcome::Granted { name, node: true } => info(format!(
            "opened {name} for the agent in the node's namespace"
        )),
        Outcome::Granted { name, node: false } => logging::at(
            Level::Debug,
            &format!("opened {name} for the agent in a pod's namespace"),
        ),
        Outcome::Refused { name, why } => warn(format!("refused {name}: {why}")),
        Outcome::Failed(why) => warn(why),
    }
}
