//! `install --migrate-state-from DIR`: the installer's records from the
//! directory earlier releases kept them in (`/var/lib/cni/podgate/installer`,
//! inside podgate-router's state dir, which the node agent, a container
//! with capabilities, can write).
//!
//! Nothing there is trusted: the agent could have written any of it. What
//! a record holds, and what can be taken of it:
//!
//! * the record of podgate's own conflist (`renderedFrom`): nothing. The
//!   next pass renders the file again and records it anew; until then the
//!   file is recognised as podgate's by its podgate entries.
//! * the record of a file an earlier podgate chained in place, or
//!   converted from a `.conf`: taken only when every name in it is one the
//!   installer could have written ([`crate::state::Backup::check`]), the
//!   file still holds exactly the bytes the record says were written, and
//!   the original bytes say the same chain as those bytes without
//!   podgate's entries (for a conversion: the `.conf`'s plugin). So a taken
//!   record can change nothing but the formatting of what uninstall would
//!   write anyway by removing podgate's entries; a forged original is
//!   never written.
//! * `runtime-chain.json` (when the runtime served the chain): nothing.
//!   Its times cannot be checked against anything on the node; the history
//!   starts afresh in the new state dir, where the chain already in place
//!   makes it no evidence of the sandboxes created before (`history`).
//!
//! The old directory is only read (mounted read-only into the installer);
//! its files go when the uninstall empties podgate-router's state dir.

use crate::chain::{kind_of, Kind, List};
use crate::history;
use crate::reconcile::Node;
use crate::state::Backup;
use crate::{fsx, Error};
use std::path::Path;

/// Bound on a record read from the old directory.
const MAX_RECORD: u64 = 1 << 20;
const SUFFIX: &str = ".podgate-backup";

/// Take what can be taken from `old` into `node`'s state dir; one line per
/// record for the log.
pub fn from(old: &Path, node: &Node) -> Result<Vec<String>, Error> {
    let names = match fsx::list_files(old) {
        Ok(n) => n,
        Err(e) if e.not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let _lock = node.state.lock()?;
    let mut out = Vec::new();
    for name in names {
        if name == history::FILE {
            out.push(format!(
                "not taking {}/{name}: the runtime's history is started afresh (times written where the node agent can write cannot be checked)",
                old.display()
            ));
            continue;
        }
        let Some(key) = name.strip_suffix(SUFFIX) else {
            continue;
        };
        // A regular file of at most MAX_RECORD bytes, not through a link,
        // not waiting on a FIFO.
        let verdict = match podgate_kit::dir::read_regular(&old.join(&name), MAX_RECORD, false) {
            Ok(bytes) => judge(key, &bytes, node),
            Err(e) => Err(format!("reading: {e}")),
        };
        out.push(match verdict {
            Ok(b) => {
                node.state.save(&b)?;
                format!("took the record of {key} from {}", old.display())
            }
            Err(why) => format!(
                "not taking the record of {key} from {}: {why}",
                old.display()
            ),
        });
    }
    Ok(out)
}

/// The record, if it may be taken (see the module's notes); else why not.
fn judge(key: &str, bytes: &[u8], node: &Node) -> Result<Backup, String> {
    let b: Backup = serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))?;
    b.check(key).map_err(|e| e.to_string())?;
    if b.rendered_from.is_some() || b.file == node.own_file {
        return Err("podgate's own conflist is rendered and recorded anew".into());
    }
    if node
        .state
        .load(&b.file)
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Err("the state dir has a record of it already".into());
    }
    let current = fsx::read_opt(&node.conf_dir.join(&b.file)).map_err(|e| e.to_string())?;
    if current.as_deref() != Some(b.written.as_bytes()) {
        return Err(format!(
            "{} does not hold what the record says podgate wrote",
            b.file
        ));
    }
    let written = List::parse(&b.file, b.written.as_bytes()).map_err(|e| e.to_string())?;
    let Some(without) = written.stripped() else {
        return Err(format!("{} holds no podgate entry", b.file));
    };
    let original = match (&b.converted_from, &b.original) {
        (_, None) => return Ok(b),
        (Some(conf), Some(o)) => List::from_single(conf, o.as_bytes()),
        (None, Some(o)) if kind_of(&b.file) == Some(Kind::List) => {
            List::parse(&b.file, o.as_bytes())
        }
        (None, Some(_)) => return Err(format!("{} is not a conflist", b.file)),
    };
    match original {
        Ok(o) if o.same(&without) => Ok(b),
        Ok(_) => Err(format!(
            "its original bytes are not {} without podgate's entries",
            b.file
        )),
        Err(e) => Err(format!("its original bytes: {e}")),
    }
}
