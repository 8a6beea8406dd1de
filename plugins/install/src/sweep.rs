//! The periodic stale-record sweep of `podgate agent`: containerd
//! and CRI-O do not call CNI GC yet, so records of pods that died without a
//! DEL (a reboot, a missed DEL) would otherwise stay until the next ADD, DEL
//! or GC on the node. Runs podgate-router's own sweep; failures are logged,
//! never fatal to the agent. Each sweep ends with one line saying how long
//! it took (what the node-scale bench reads).

use crate::logging::{info, warn};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Sweep {
    /// podgate-router's `stateDir`.
    pub state_dir: PathBuf,
    pub every: Duration,
    next: Instant,
}

impl Sweep {
    /// None when the interval is 0 (off). The first sweep runs at start.
    pub fn new(state_dir: PathBuf, every_secs: u64) -> Option<Sweep> {
        (every_secs > 0).then(|| Sweep {
            state_dir,
            every: Duration::from_secs(every_secs),
            next: Instant::now(),
        })
    }

    pub fn next(&self) -> Instant {
        self.next
    }

    /// Sweep if due; logs what was removed.
    pub fn tick(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        self.next = now + self.every;
        self.sweep();
    }

    /// One sweep now, logged: what was removed, and what failed.
    pub fn sweep(&self) -> podgate_router::lifecycle::Swept {
        let dir = self.state_dir.display();
        let started = Instant::now();
        let swept = podgate_router::lifecycle::sweep_stale(&self.state_dir).unwrap_or_else(|e| {
            podgate_router::lifecycle::Swept {
                failures: podgate_router::apply::Failures::of(e),
                ..Default::default()
            }
        });
        for r in &swept.removed {
            info(format!("sweep {dir}: removed {r}"));
        }
        for q in &swept.quarantined {
            warn(format!("sweep {dir}: {q}"));
        }
        if swept.index_repaired > 0 {
            info(format!(
                "sweep {dir}: claims index: {} entries repaired to match the records",
                swept.index_repaired
            ));
        }
        for r in &swept.rules_ahead {
            warn(format!(
                "sweep {dir}: {r}; podgate reports it and leaves it (the rule is another agent's, which would put it back): remove it or move it below priority {}",
                podgate_router::routing::PRIO_STRICT
            ));
        }
        for f in swept.failures.iter() {
            warn(format!("sweep {dir}: {f}"));
        }
        info(format!(
            "sweep {dir}: done in {:.1} ms ({} removed, {} failed)",
            started.elapsed().as_secs_f64() * 1000.0,
            swept.removed.len(),
            swept.failures.len()
        ));
        swept
    }
}
