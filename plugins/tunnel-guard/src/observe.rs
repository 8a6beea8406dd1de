//! What the guard reads from the node: the agent's protection endpoint and
//! OVSDB on the caller's thread, the kernel's XFRM policies (of the caller's
//! netns) on a second, the agent's own socket on two more, all under one
//! deadline. Errors are kept as text for [`crate::judge()`]; nothing here
//! decides.

use crate::agent::{self, AgentStatus};
use crate::guard;
use crate::io::{Deadline, IoError};
use crate::ovsdb::{self, OvsInfo, OvsdbError};
use crate::protection::{self, Answer, Endpoint, Presence, ProtectionError};
use crate::{GuardConfig, Required};
use podgate_kit::xfrm::{self, Dir, PolicyDump};
use std::thread::{Builder, Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

/// How an OVSDB read ended, keeping "no socket at all" apart (no OVS, so no
/// key can be set) from every other failure (keys cannot be ruled out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvsRead {
    Ok(OvsInfo),
    Absent,
    Failed(String),
}

/// An endpoint request: `None` in the options below means not asked.
pub type Asked = Result<Answer, String>;

/// Everything read from the node, errors as text. `None` = not asked.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub required_file: Option<Presence>,
    pub socket: Option<Presence>,
    pub dir_check: Option<Result<(), String>>,
    pub socket_check: Option<Result<(), String>>,
    pub ovsdb: Option<OvsRead>,
    pub armed: Option<Asked>,
    pub startup: Option<Asked>,
    /// The OUT policies of the calling thread's netns: how many, and those
    /// that could be a guard or a bypass ([`crate::guard::may_guard_or_bypass`]).
    pub policies: Option<Result<PolicyDump, String>>,
    pub readyz: Option<Result<u16, String>>,
    pub status: Option<Result<AgentStatus, String>>,
    pub elapsed: Duration,
}

/// What the endpoint thread learns: OVSDB, then (with its `_uuid`) the agent.
struct EndpointRead {
    dir_check: Option<Result<(), String>>,
    socket_check: Option<Result<(), String>>,
    ovsdb: OvsRead,
    armed: Option<Asked>,
    startup: Option<Asked>,
}

fn read_endpoint(
    cfg: &GuardConfig,
    socket: &Presence,
    file: &Presence,
    dl: &Deadline,
) -> EndpointRead {
    let ovsdb = match ovsdb::query(&cfg.ovsdb_socket, dl) {
        Ok(info) => OvsRead::Ok(info),
        Err(OvsdbError::Io(IoError::Absent(_))) => OvsRead::Absent,
        Err(e) => OvsRead::Failed(e.to_string()),
    };
    let mut out = EndpointRead {
        dir_check: None,
        socket_check: None,
        ovsdb,
        armed: None,
        startup: None,
    };
    if !socket.exists() {
        return out;
    }
    // Observations keep errors as text (the report shows them).
    let refused = |e: protection::EndpointRefused| e.to_string();
    out.dir_check = Some(protection::check_dir(&cfg.protection_dir).map_err(refused));
    out.socket_check = Some(protection::check_socket(&cfg.protection_socket()).map_err(refused));
    let (OvsRead::Ok(info), Some(Ok(())), Some(Ok(()))) =
        (&out.ovsdb, &out.dir_check, &out.socket_check)
    else {
        return out;
    };
    let sock = cfg.protection_socket();
    let text = |e: Endpoint, err: ProtectionError| match err {
        ProtectionError::Io(io) => format!("agent {}: {io}", e.path()),
        other => other.to_string(),
    };
    let armed = protection::ask(&sock, Endpoint::Armed, &info.uuid, dl);
    let armed_ok = matches!(&armed, Ok(a) if a.code == 200);
    // A server that is not root is not the agent: nothing it says counts.
    let impostor = matches!(
        &armed,
        Err(ProtectionError::NotRoot(_) | ProtectionError::PeerCred(_))
    );
    out.armed = Some(armed.map_err(|err| text(Endpoint::Armed, err)));
    // /startup can only be accepted without durable intent: do not spend the
    // budget (up to 2 s in the agent) on an answer that cannot pass.
    if !armed_ok && !impostor && !file.exists() && info.lease_keys_set().is_empty() {
        out.startup = Some(
            protection::ask(&sock, Endpoint::Startup, &info.uuid, dl)
                .map_err(|err| text(Endpoint::Startup, err)),
        );
    }
    out
}

pub fn observe(cfg: &GuardConfig) -> Observations {
    let started = Instant::now();
    let mut obs = Observations::default();
    if cfg.required == Required::Never {
        return obs;
    }
    let file = Presence::of(&cfg.required_file());
    let socket = Presence::of(&cfg.protection_socket());
    let dl = Deadline::after(cfg.timeout());
    std::thread::scope(|s| {
        let budget = dl.remaining().unwrap_or(Duration::from_millis(1));
        // The dump is CPU work in the kernel from its first receive to its
        // last, the endpoint mostly waits on OVSDB and the agent: the dump
        // gets a thread of its own (which starts in the caller's netns) and
        // the caller's thread, already running, takes the endpoint, so the
        // two overlap even while the new thread waits for a CPU. Only OUT
        // policies can guard or bypass output, and of those only the few that
        // could be either are parsed: on a node with thousands of per-peer
        // policies the kernel's side of the dump is most of its cost.
        let policies = spawn(s, move || {
            xfrm::dump_policies_where(Dir::Out, budget, guard::may_guard_or_bypass)
        });
        let dl = &dl;
        let agent = cfg.agent_socket.as_deref().map(|p| {
            (
                spawn(s, move || agent::readyz(p, dl)),
                spawn(s, move || agent::status(p, dl)),
            )
        });
        let e = read_endpoint(cfg, &socket, &file, dl);
        obs.dir_check = e.dir_check;
        obs.socket_check = e.socket_check;
        obs.ovsdb = Some(e.ovsdb);
        obs.armed = e.armed;
        obs.startup = e.startup;
        obs.policies = Some(join(policies));
        if let Some((readyz, status)) = agent {
            obs.readyz = Some(join(readyz));
            obs.status = Some(join(status));
        }
    });
    obs.required_file = Some(file);
    obs.socket = Some(socket);
    obs.elapsed = started.elapsed();
    obs
}

type Job<'s, T, E> = std::io::Result<ScopedJoinHandle<'s, Result<T, E>>>;

fn spawn<'s, 'e, T, E, F>(s: &'s Scope<'s, 'e>, f: F) -> Job<'s, T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 's,
    T: Send + 's,
    E: Send + 's,
{
    Builder::new().spawn_scoped(s, f)
}

fn join<T, E: std::fmt::Display>(job: Job<'_, T, E>) -> Result<T, String> {
    job.map_err(|e| format!("cannot start a thread: {e}"))?
        .join()
        .map_err(|_| "check panicked".to_string())?
        .map_err(|e| e.to_string())
}
