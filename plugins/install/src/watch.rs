//! `podgate install --watch`: keep the chain in place while the primary (or
//! anything else) rewrites the conf dir, until SIGTERM.
//!
//! inotify on the conf dir (and the bin dir and the plugins file's dir, for a
//! deleted binary or a ConfigMap update) marks a pass due after a quiet
//! `debounce`; a burst is cut at `max_delay`. A pass also runs every
//! `resync` in case an event was missed. Problems the primary or the operator
//! can fix (no config yet, a half-written file, a bad plugins file) keep the
//! watcher waiting with the ready file removed; I/O failures and a vanished
//! conf dir end it with an error so the DaemonSet restarts it.

use super::chain::{kind_of, ORIG_SUFFIX};
use super::fsx;
use super::history::{self, History, HistoryFile, LastServed, Seen};
use super::reconcile::{self, Applied, Node, Source};
use super::runtime::{self, Runtime};
use super::sys::{poll_readable, Inotify, Signals, WatchDescriptor};
use super::validate::BINARIES;
use super::{Daemon, Error, Readiness};
use crate::logging::{info, warn};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct WatchOpts {
    pub debounce: Duration,
    pub max_delay: Duration,
    pub resync: Duration,
    pub ready_file: Option<PathBuf>,
    pub uninstall_on_exit: bool,
    /// Where readiness asks what the runtime loaded.
    pub runtime: Runtime,
    /// Where this watch (the one writer) records when it saw the runtime serve the chain
    /// (None with `--runtime-endpoint none`: it sees nothing of the runtime).
    pub history: Option<HistoryFile>,
}

const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_CLOSE_WRITE
    | libc::IN_MODIFY
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_ATTRIB
    | libc::IN_ONLYDIR;
const SELF_MASK: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
const SELF_GONE: u32 = SELF_MASK | libc::IN_IGNORED | libc::IN_UNMOUNT;

/// The `--ready-file`: present (naming the chained file) only while the
/// chain is in place.
struct Ready {
    path: Option<PathBuf>,
    current: Option<String>,
}

impl Ready {
    fn set(&mut self, file: &str) -> Result<(), Error> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if self.current.as_deref() == Some(file) && path.exists() {
            return Ok(());
        }
        write_ready_file(path, file)?;
        self.current = Some(file.into());
        Ok(())
    }

    fn clear(&mut self) {
        if let Some(path) = &self.path {
            if let Err(e) = fsx::remove(path) {
                warn(e);
            }
        }
        self.current = None;
    }
}

pub fn write_ready_file(path: &Path, file: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    }
    fsx::atomic_write(path, format!("chained {file}\n").as_bytes(), 0o644)?;
    Ok(())
}

pub fn remove_ready_file(path: &Path) {
    if let Err(e) = fsx::remove(path) {
        warn(e);
    }
}

enum Last {
    Start,
    Chained,
    /// Chained on disk, not (yet) what the runtime loaded.
    NotLoaded(String),
    Waiting(String),
}

/// Which watch a descriptor belongs to.
struct Watches {
    conf: WatchDescriptor,
    bin: WatchDescriptor,
    plugins: Option<WatchDescriptor>,
    plugins_name: String,
}

impl Watches {
    fn add(ino: &Inotify, node: &Node, src: &Source) -> Result<Watches, Error> {
        let add = |dir: &Path, mask: u32| {
            ino.add(dir, mask)
                .map_err(|e| Error::io("watching", dir, e))
        };
        let plugins_dir = dir_of(&src.plugins_file);
        Ok(Watches {
            conf: add(&node.conf_dir, DIR_MASK | SELF_MASK)?,
            bin: add(&node.bin_dir, DIR_MASK)?,
            // A missing dir means no plugins file: the pass reports that and
            // the resync picks the file up once it appears.
            plugins: if plugins_dir == node.conf_dir {
                None
            } else {
                ino.add(&plugins_dir, DIR_MASK).ok()
            },
            plugins_name: src
                .plugins_file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        })
    }

    /// Whether `events` call for a pass; an error when the conf dir itself
    /// went away (the watcher exits and restarts on the new directory).
    fn judge(&self, events: &[crate::sys::Event], node: &Node) -> Result<bool, Error> {
        if let Some(e) = events
            .iter()
            .find(|e| e.wd == self.conf && e.mask & SELF_GONE != 0)
        {
            return Err(Error::ConfDirGone {
                dir: node.conf_dir.clone(),
                mask: e.mask,
            });
        }
        Ok(events
            .iter()
            .any(|e| e.mask & libc::IN_Q_OVERFLOW != 0 || self.relevant(e.wd, &e.name)))
    }

    fn relevant(&self, wd: WatchDescriptor, name: &str) -> bool {
        if fsx::is_temp_name(name) {
            return false;
        }
        if Some(wd) == self.plugins {
            return true;
        }
        if wd == self.conf {
            return name.is_empty()
                || kind_of(name).is_some()
                || name.ends_with(ORIG_SUFFIX)
                || name == self.plugins_name;
        }
        wd == self.bin && BINARIES.contains(&name)
    }
}

fn dir_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub fn run(node: &Node, src: &Source, opts: &WatchOpts) -> Result<(), Error> {
    let signals = Signals::new().map_err(Error::sys(Daemon::Watch, "signalfd"))?;
    for dir in [&node.conf_dir, &node.bin_dir] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    }
    let ino = Inotify::new().map_err(Error::sys(Daemon::Watch, "inotify"))?;
    let watches = Watches::add(&ino, node, src)?;
    info(format!(
        "watching {} (primary: {}; plugins: {})",
        node.conf_dir.display(),
        src.primary.as_deref().unwrap_or("the first config file"),
        src.plugins_file.display()
    ));
    let mut passes = Passes::new(node, opts)?;
    let mut schedule = Schedule::new(opts);
    let result = loop {
        if let Some(now) = schedule.pass_due() {
            match passes.run(node, src, &opts.runtime) {
                Ok(not_loaded) => schedule.passed(now, not_loaded),
                Err(e) => break Err(e),
            }
        }
        let timeout = schedule.wake().saturating_duration_since(Instant::now());
        let [signalled, changed] = match poll_readable([signals.fd(), ino.fd()], timeout) {
            Ok(r) => r,
            Err(e) => break Err(Error::sys(Daemon::Watch, "poll")(e)),
        };
        if signalled {
            match signals.read() {
                Ok(Some(libc::SIGHUP)) => schedule.now(),
                Ok(Some(sig)) => {
                    info(format!("signal {sig}: stopping"));
                    break Ok(());
                }
                Ok(None) => {}
                Err(e) => break Err(Error::sys(Daemon::Watch, "signalfd")(e)),
            }
        }
        if changed {
            match ino.read().map_err(Error::sys(Daemon::Watch, "inotify")) {
                Ok(events) => match watches.judge(&events, node) {
                    Ok(true) => schedule.changed(),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        }
    };
    let result = result.and_then(|()| {
        if opts.uninstall_on_exit {
            for msg in reconcile::unchain_all(node)? {
                info(msg);
            }
        }
        Ok(())
    });
    passes.ready.clear();
    result
}

/// When the next pass is due: at once on start and SIGHUP, a debounce
/// after a change (bounded from the first change), every resync, and while
/// the runtime has not loaded the chain, again soon and less often the
/// longer it takes.
struct Schedule {
    due: Option<Instant>,
    first_event: Option<Instant>,
    next_resync: Instant,
    recheck: Duration,
    debounce: Duration,
    max_delay: Duration,
    resync: Duration,
}

impl Schedule {
    fn new(opts: &WatchOpts) -> Schedule {
        let now = Instant::now();
        Schedule {
            due: Some(now),
            first_event: None,
            next_resync: now + opts.resync,
            recheck: runtime::RECHECK,
            debounce: opts.debounce,
            max_delay: opts.max_delay,
            resync: opts.resync,
        }
    }

    /// Now, when a pass is due (and the next resync counted from it).
    fn pass_due(&mut self) -> Option<Instant> {
        let now = Instant::now();
        if !(self.due.is_some_and(|d| d <= now) || self.next_resync <= now) {
            return None;
        }
        self.due = None;
        self.first_event = None;
        self.next_resync = now + self.resync;
        Some(now)
    }

    /// After the pass of `now`: `not_loaded`, the runtime has not loaded
    /// the chain yet.
    fn passed(&mut self, now: Instant, not_loaded: bool) {
        if not_loaded {
            self.due = Some(now + self.recheck);
            self.recheck = (self.recheck * 2).min(self.resync);
        } else {
            self.recheck = runtime::RECHECK;
        }
    }

    fn now(&mut self) {
        self.due = Some(Instant::now());
    }

    /// A relevant change: a pass after the debounce.
    fn changed(&mut self) {
        let now = Instant::now();
        let first = *self.first_event.get_or_insert(now);
        self.due = Some((now + self.debounce).min(first + self.max_delay));
    }

    fn wake(&self) -> Instant {
        self.due
            .map_or(self.next_resync, |d| d.min(self.next_resync))
    }
}

/// podgate's file put back after someone removed it this many times within
/// `FIGHT_WINDOW` is reported: another component keeps deleting it.
const FIGHT_COUNT: usize = 5;
const FIGHT_WINDOW: Duration = Duration::from_secs(60);

/// What the passes saw so far: readiness, what was last logged, re-chains.
struct Passes {
    ready: Ready,
    last: Last,
    rechains: VecDeque<Instant>,
    warned: Option<Instant>,
    /// The record of when the runtime served the chain, and when this watch
    /// last saw it do so.
    history: Option<(HistoryFile, History)>,
    last_seen: LastServed,
}

/// This boot's history as the watch starts: what the file holds, and if it
/// holds no observation and podgate's own conflist is not in the conf dir
/// (before this watch writes it: a newly joined node, a conf dir that did
/// not survive the reboot), the first observation, "not served since the
/// boot" (no runtime serves a chain from a file that does not exist).
fn begin_history(f: &HistoryFile, node: &Node) -> Result<History, Error> {
    let mut h = f.load()?;
    let absent = !node.conf_dir.join(&node.own_file).exists();
    if absent && h.absent_since_boot(history::now_nanos()) {
        f.save(&h)?;
        info(format!(
            "{} is not in {} yet: the runtime has not served podgate's chain this boot (recorded in {})",
            node.own_file,
            node.conf_dir.display(),
            history::FILE
        ));
    }
    Ok(h)
}

impl Passes {
    fn new(node: &Node, opts: &WatchOpts) -> Result<Passes, Error> {
        Ok(Passes {
            ready: Ready {
                path: opts.ready_file.clone(),
                current: None,
            },
            last: Last::Start,
            rechains: VecDeque::new(),
            warned: None,
            history: match &opts.history {
                Some(f) => Some((f.clone(), begin_history(f, node)?)),
                None => None,
            },
            last_seen: LastServed::default(),
        })
    }

    /// One install pass, then readiness. Ok(true) when the chain is on disk
    /// but the runtime has not loaded it; Err only when the error is fatal.
    fn run(&mut self, node: &Node, src: &Source, rt: &Runtime) -> Result<bool, Error> {
        match reconcile::install_once(node, src) {
            Ok(applied) => {
                let wrote = !matches!(applied, Applied::Unchanged { .. });
                let was_chained = matches!(self.last, Last::Chained | Last::NotLoaded(_));
                if wrote || !was_chained {
                    info(&applied);
                }
                if applied.fresh() && was_chained {
                    self.note_rechain(applied.file());
                }
                let entries = reconcile::load_entries(&src.plugins_file)?;
                let verdict = runtime::judge(node, src, &entries, rt)?;
                self.record(verdict.loaded)?;
                match verdict.ready {
                    Readiness::Chained(file) => {
                        if matches!(self.last, Last::NotLoaded(_)) {
                            info(format!("ready: the runtime loaded {file}"));
                        }
                        self.last = Last::Chained;
                        self.ready.set(&file)?;
                        Ok(false)
                    }
                    Readiness::NotReady(why) => {
                        self.ready.clear();
                        if !matches!(&self.last, Last::NotLoaded(m) if *m == why) {
                            info(format!("not ready: {why}"));
                        }
                        self.last = Last::NotLoaded(why);
                        Ok(true)
                    }
                }
            }
            Err(e) if e.is_transient() => {
                self.ready.clear();
                // Not chained on disk; the runtime may still say what it serves.
                let entries = reconcile::load_entries(&src.plugins_file);
                if let Ok(v) = entries.and_then(|e| runtime::judge(node, src, &e, rt)) {
                    self.record(v.loaded)?;
                }
                let msg = e.to_string();
                if !matches!(&self.last, Last::Waiting(m) if *m == msg) {
                    info(format!("not chained, waiting for a change: {msg}"));
                }
                self.last = Last::Waiting(msg);
                Ok(false)
            }
            Err(e) => {
                self.ready.clear();
                Err(e)
            }
        }
    }

    /// One observation of the runtime into the history (when it said).
    fn record(&mut self, seen: Option<Seen>) -> Result<(), Error> {
        let (Some(seen), Some((file, h))) = (seen, self.history.as_mut()) else {
            return Ok(());
        };
        let now = history::now_nanos();
        if h.observe(seen, now, self.last_seen) {
            file.save(h)?;
            let said = |served: bool, what: &str| match served {
                true => format!("{what} served"),
                false => format!("{what} NOT served"),
            };
            let line = format!(
                "the runtime's network: {}, {} (recorded at {now} ns)",
                said(seen.router, "podgate-router"),
                said(seen.guard, "an enforcing tunnel guard"),
            );
            match seen.router && seen.guard {
                true => info(line),
                false => warn(line),
            }
        }
        self.last_seen.update(seen, now);
        Ok(())
    }

    fn note_rechain(&mut self, file: &str) {
        let now = Instant::now();
        self.rechains.push_back(now);
        while self
            .rechains
            .front()
            .is_some_and(|t| now.duration_since(*t) > FIGHT_WINDOW)
        {
            self.rechains.pop_front();
        }
        let quiet = self
            .warned
            .is_none_or(|t| now.duration_since(t) > FIGHT_WINDOW);
        if self.rechains.len() >= FIGHT_COUNT && quiet {
            self.warned = Some(now);
            warn(format!(
                "{file} was removed {} times in the last minute: another \
                 component keeps removing CNI configs it does not own (e.g. Cilium's \
                 cni.exclusive); configure it to leave {file} alone",
                self.rechains.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::tests::{Scratch, PRIMARY};

    fn passes(ready_file: &Path) -> Passes {
        Passes {
            ready: Ready {
                path: Some(ready_file.to_path_buf()),
                current: None,
            },
            last: Last::Start,
            rechains: VecDeque::new(),
            warned: None,
            history: None,
            last_seen: LastServed::default(),
        }
    }

    fn ready_text(path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    /// A pass chains and writes the ready file; a plugins file that stops
    /// parsing is a wait, not an exit, with the ready file removed; once
    /// fixed, the next pass is ready again.
    #[test]
    fn the_ready_file_exists_only_while_the_chain_is_in_place() {
        let s = Scratch::new("watch-ready");
        let ready = s.root.join("run/ready");
        let mut p = passes(&ready);
        let not_loaded = p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap();
        assert!(!not_loaded);
        assert_eq!(
            ready_text(&ready).as_deref(),
            Some("chained 00-podgate.conflist\n")
        );
        assert!(matches!(p.last, Last::Chained));

        std::fs::write(&s.src.plugins_file, "[{").unwrap();
        assert!(!p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap());
        assert_eq!(ready_text(&ready), None);
        assert!(matches!(&p.last, Last::Waiting(m) if m.contains("plugins.json")));

        std::fs::write(
            &s.src.plugins_file,
            r#"[{"type": "podgate-router", "profiles": {}}]"#,
        )
        .unwrap();
        assert!(!p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap());
        assert!(ready_text(&ready).is_some());
    }

    /// A fatal error (the conf dir cannot be written) ends the watch and
    /// removes the ready file.
    #[test]
    fn a_fatal_pass_error_clears_the_ready_file() {
        let s = Scratch::new("watch-fatal");
        let ready = s.root.join("ready");
        let mut p = passes(&ready);
        p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap();
        assert!(ready_text(&ready).is_some());
        // The bin dir a file: installing the binaries fails, not transient.
        std::fs::remove_dir_all(&s.node.bin_dir).unwrap();
        std::fs::write(&s.node.bin_dir, b"").unwrap();
        let e = p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert_eq!(ready_text(&ready), None);
    }

    /// A re-chain is noted (and past the limit warned about) only when
    /// podgate's file had to be written again after it was in place.
    #[test]
    fn a_deleted_own_file_is_a_rechain() {
        let s = Scratch::new("watch-rechain");
        let mut p = passes(&s.root.join("ready"));
        p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap();
        assert!(p.rechains.is_empty());
        std::fs::remove_file(s.node.conf_dir.join(&s.node.own_file)).unwrap();
        p.run(&s.node, &s.src, &Runtime::FileOnly).unwrap();
        assert_eq!(p.rechains.len(), 1);
        assert!(s.own().is_some());
    }

    /// A pass at start; after a change, one debounce later but never
    /// later than max_delay after the first change; while the runtime has
    /// not loaded the chain, again after RECHECK, doubling up to the resync.
    #[test]
    fn the_schedule_debounces_and_backs_off() {
        let opts = WatchOpts {
            debounce: Duration::from_millis(200),
            max_delay: Duration::from_secs(1),
            resync: Duration::from_secs(3),
            ready_file: None,
            uninstall_on_exit: false,
            history: None,
            runtime: Runtime::FileOnly,
        };
        let mut sch = Schedule::new(&opts);
        let t0 = sch.pass_due().unwrap();
        assert!(sch.pass_due().is_none());
        assert_eq!(sch.wake(), t0 + opts.resync);
        sch.changed();
        let first = sch.due.unwrap();
        assert!(first >= t0 + opts.debounce && first < t0 + opts.max_delay);
        std::thread::sleep(Duration::from_millis(50));
        sch.changed();
        assert!(sch.due.unwrap() > first, "each change pushes the pass back");
        sch.first_event = Some(t0 - opts.max_delay);
        sch.changed();
        assert!(
            sch.due.unwrap() <= t0,
            "bounded by max_delay from the first change"
        );
        let mut waits = Vec::new();
        for _ in 0..5 {
            let now = Instant::now();
            sch.passed(now, true);
            waits.push(sch.due.unwrap() - now);
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [500, 1000, 2000, 3000, 3000]);
        sch.passed(Instant::now(), false);
        assert_eq!(sch.recheck, runtime::RECHECK);
    }

    /// Which inotify events start a pass: config files, backups and the
    /// plugins file in the conf dir, podgate's binaries in the bin dir,
    /// anything in the plugins file's own dir; never a temp name.
    #[test]
    fn only_relevant_names_start_a_pass() {
        let s = Scratch::new("watch-names");
        let ino = Inotify::new().unwrap();
        let plugins_dir = s.root.join("plugins");
        std::fs::create_dir_all(&plugins_dir).unwrap();
        let w = Watches {
            conf: ino.add(&s.node.conf_dir, DIR_MASK).unwrap(),
            bin: ino.add(&s.node.bin_dir, DIR_MASK).unwrap(),
            plugins: Some(ino.add(&plugins_dir, DIR_MASK).unwrap()),
            plugins_name: "plugins.json".into(),
        };
        let (conf, bin, plugins) = (w.conf, w.bin, w.plugins.unwrap());
        for name in [PRIMARY, "05-x.conf", "x.json", "", "plugins.json"] {
            assert!(w.relevant(conf, name), "{name:?}");
        }
        assert!(w.relevant(conf, &format!("10-bridge.conflist{ORIG_SUFFIX}")));
        for name in ["README", "10-bridge.conflist.swp"] {
            assert!(!w.relevant(conf, name), "{name:?}");
        }
        for name in BINARIES {
            assert!(w.relevant(bin, name));
            assert!(!w.relevant(conf, name));
        }
        assert!(!w.relevant(bin, "bridge"));
        assert!(w.relevant(plugins, "..data"));
        let temp = ".00-podgate.conflist.podgate-tmp-1234";
        assert!(fsx::is_temp_name(temp));
        assert!(!w.relevant(conf, temp), "{temp}");
    }
}
