//! `podgate cri-proxy`: the DaemonSet's `cri-proxy` container, the one
//! holding the runtime's CRI socket for the node agent. The socket makes
//! its holder node-root (a privileged container with the node's `/` is
//! one call away), so the agent gets this proxy's socket instead, which
//! forwards only the reads podgate makes ([`podgate_cri::proxy`]) and,
//! with `--allow-stop`, StopPodSandbox for `--repair-unguarded`.

use crate::logging::{self, info, warn};
use crate::{AgentLogArgs, Daemon, Error};
use clap::Args;
use podgate_cni::log::Level;
use podgate_cri::proxy::{self, Event, Filter};
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct CriProxyArgs {
    /// Serve on this unix socket (root only; one left by an earlier run is
    /// replaced), e.g. in a memory emptyDir shared with the agent.
    #[arg(long, value_name = "PATH")]
    pub listen: PathBuf,
    /// The runtime's CRI socket [default: crictl's, the first whose socket
    /// exists, looked up for every call: unix:///run/containerd/containerd.sock,
    /// unix:///run/crio/crio.sock, unix:///var/run/cri-dockerd.sock].
    #[arg(long, value_name = "unix:///PATH")]
    pub runtime_endpoint: Option<String>,
    /// Also forward StopPodSandbox, for the agent's --repair-unguarded.
    /// Without it the agent can only read from the runtime.
    #[arg(long)]
    pub allow_stop: bool,
    #[command(flatten)]
    pub log: AgentLogArgs,
}

pub fn run(args: &CriProxyArgs) -> Result<(), Error> {
    logging::set(&args.log, "cri-proxy");
    let upstream = match &args.runtime_endpoint {
        Some(e) => Some(podgate_cri::socket_path(e).map_err(|source| Error::Cri {
            daemon: Daemon::CriProxy,
            source,
        })?),
        None => None,
    };
    let mut allowed = proxy::READS.to_vec();
    if args.allow_stop {
        allowed.push(proxy::STOP_SANDBOX);
    }
    let listener = crate::socket::bind(&args.listen)?;
    listener
        .set_nonblocking(true)
        .map_err(Error::sys(Daemon::CriProxy, "listener"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::sys(Daemon::CriProxy, "tokio runtime"))?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::from_std(listener)
            .map_err(Error::sys(Daemon::CriProxy, "listener"))?;
        let signal = |kind| {
            tokio::signal::unix::signal(kind).map_err(Error::sys(Daemon::CriProxy, "signals"))
        };
        let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = signal(tokio::signal::unix::SignalKind::interrupt())?;
        info(format!(
            "serving {} for {}: {}",
            args.listen.display(),
            upstream
                .as_ref()
                .map_or("the first CRI runtime found".into(), |p| p
                    .display()
                    .to_string()),
            allowed.join(", ")
        ));
        let filter = Filter { upstream, allowed };
        let stop = async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            info(format!("{name}: stopping"));
        };
        proxy::serve(listener, filter, report, stop).await;
        Ok::<(), Error>(())
    })?;
    let _ = std::fs::remove_file(&args.listen);
    Ok(())
}

fn report(e: Event) {
    match e {
        Event::Forwarded(m) => logging::at(Level::Debug, &format!("forwarded {m}")),
        Event::Denied(m) => warn(format!("refused {m}: not forwarded")),
        Event::Failed { method, why } => warn(format!("{method}: {why}")),
    }
}
