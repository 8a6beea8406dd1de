//! `podgate install` and `podgate uninstall`.

use crate::logging::{info, warn};
use crate::readiness::{readiness, Readiness};
use crate::runtime::{self, Runtime};
use crate::{
    agent, args::source_of, fsx, history, logging, migrate, reconcile, sys, watch, Daemon, Error,
    InstallArgs, UninstallArgs, LEGACY_STATE_DIR,
};
use std::time::Duration;

/// How long a one-shot install with --ready-file gives the runtime to load
/// the chain it just wrote.
const ONE_SHOT_WAIT: Duration = Duration::from_secs(10);

pub fn install(args: &InstallArgs) -> Result<(), Error> {
    logging::set(&args.log, "installer");
    if args.check {
        return match readiness(&args.chain)? {
            Readiness::Chained(file) => {
                println!("chained: {file}");
                Ok(())
            }
            Readiness::NotReady(reason) => Err(Error::NotChained(reason)),
        };
    }
    let node = args.chain.node.node()?;
    let mut src = source_of(&args.chain)?;
    src.host_paths.extra_roots = args.plugin_path_root.clone();
    let runtime = Runtime::from_arg(args.chain.runtime_endpoint.as_deref());
    if let Some(old) = &args.migrate_state_from {
        if old != &args.chain.node.state_dir {
            for line in migrate::from(old, &node)? {
                info(line);
            }
        }
    }
    if args.watch {
        let opts = watch::WatchOpts {
            debounce: Duration::from_millis(args.debounce_ms),
            max_delay: Duration::from_millis(args.debounce_ms.saturating_mul(10).max(1000)),
            resync: Duration::from_secs(args.resync_secs.max(1)),
            ready_file: args.ready_file.clone(),
            uninstall_on_exit: args.uninstall_on_exit,
            history: match runtime {
                Runtime::FileOnly => None,
                _ => Some(history::HistoryFile::new(&args.chain.node.state_dir)?),
            },
            runtime,
        };
        return watch::run(&node, &src, &opts);
    }
    match reconcile::install_once(&node, &src) {
        Ok(applied) => {
            info(&applied);
            if let Some(ready) = &args.ready_file {
                match runtime::wait_ready(&node, &src, &runtime, ONE_SHOT_WAIT)? {
                    Readiness::Chained(file) => watch::write_ready_file(ready, &file)?,
                    Readiness::NotReady(why) => {
                        watch::remove_ready_file(ready);
                        info(format!("not ready: {why}"));
                    }
                }
            }
            Ok(())
        }
        Err(e) => {
            if let Some(ready) = &args.ready_file {
                watch::remove_ready_file(ready);
            }
            Err(e)
        }
    }
}

pub fn uninstall(args: &UninstallArgs) -> Result<(), Error> {
    let node = args.node.node()?;
    if args.check {
        let left = reconcile::leftovers(&node, args.remove_binaries)?;
        if !left.is_empty() {
            return Err(Error::NotUninstalled(left.join(", ")));
        }
        println!("uninstalled: nothing of podgate's left");
        return Ok(());
    }
    // Signals blocked before the work, so a SIGTERM during it is not lost.
    let signals = match args.wait {
        true => Some(sys::Signals::new().map_err(Error::sys(Daemon::Watch, "signalfd"))?),
        false => None,
    };
    for msg in reconcile::unchain_all(&node)? {
        info(msg);
    }
    if args.remove_binaries {
        let removed = reconcile::remove_binaries(&node)?;
        if !removed.is_empty() {
            info(format!(
                "removed {} from {}",
                removed.join(", "),
                node.bin_dir.display()
            ));
        }
    }
    if let Some(signals) = signals {
        info("uninstalled; waiting for SIGTERM");
        loop {
            sys::poll_readable([signals.fd()], Duration::from_secs(3600))
                .map_err(Error::sys(Daemon::Watch, "poll"))?;
            match signals.read() {
                Ok(Some(libc::SIGHUP)) | Ok(None) => {}
                Ok(Some(sig)) => {
                    info(format!("signal {sig}: stopping"));
                    break;
                }
                Err(e) => return Err(Error::sys(Daemon::Watch, "signalfd")(e)),
            }
        }
        if let Some(dir) = &args.purge_state_dir {
            purge_state_dir(dir, &args.node.state_dir)?;
            if node.state.purge_unless_records()? {
                info(format!(
                    "emptied {}: no installer record left",
                    args.node.state_dir.display()
                ));
            }
        }
    }
    Ok(())
}

/// Removes what podgate made in `dir` (keeps the dir itself, which may be a
/// mount point, and every name podgate did not make: another network's
/// `stateDir` placed under it, an operator's file) unless podgate-router
/// still holds an attachment record there; under podgate-router's
/// node-wide lock, so an ADD still running from the old chain is either
/// seen or runs after. The subdirectories it removes: the agent's default
/// state dir, the installer's of earlier releases ([`LEGACY_STATE_DIR`])
/// and `installer_dir`, the installer's own, when it is a subdirectory of
/// `dir`.
fn purge_state_dir(dir: &std::path::Path, installer_dir: &std::path::Path) -> Result<(), Error> {
    let Some(store) = podgate_kit::state::StateStore::existing(dir)? else {
        return Ok(());
    };
    let inflight = format!("{}.inflight", podgate_cni::event::EVENT_FILE_NAME);
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let defaults = [LEGACY_STATE_DIR, agent::DEFAULT_AGENT_STATE_DIR].map(std::path::Path::new);
    let configured = (installer_dir.parent() == Some(dir))
        .then(|| name(installer_dir))
        .flatten();
    let subdirs: Vec<String> = defaults
        .into_iter()
        .filter_map(name)
        .chain(configured)
        .collect();
    let ours = |name: &str| {
        podgate_router::lifecycle::STATE_DIR_NAMES.contains(&name)
            || name == podgate_cni::event::EVENT_FILE_NAME
            || name == inflight
            || fsx::is_temp_name(name)
            || subdirs.iter().any(|s| s == name)
    };
    let (removed, foreign) = match store.purge_unless_records(ours)? {
        podgate_kit::state::Purge::RecordsLeft(n) => {
            warn(format!(
                "{n} attachment record(s) left in {}: kept (their pods still run; the agent's sweep removes them once they are gone)",
                dir.display()
            ));
            return Ok(());
        }
        podgate_kit::state::Purge::Emptied { removed, foreign } => (removed, foreign),
    };
    info(format!(
        "emptied {}: no attachment record left; {removed} entries podgate made removed",
        dir.display()
    ));
    if !foreign.is_empty() {
        info(format!(
            "left in {}: {} (not podgate's)",
            dir.display(),
            foreign.join(", ")
        ));
    }
    Ok(())
}
