//! The unix sockets the DaemonSet's helper containers serve the agent on
//! (the sysctl broker, the CRI proxy): made anew at start, in a directory
//! only the pod's containers share.

use crate::Error;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Bind `path`, root only (0600); a socket left by an earlier run is
/// replaced, anything else there is refused.
pub fn bind(path: &Path) -> Result<UnixListener, Error> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| Error::io("removing", path, e))?
        }
        Ok(_) => {
            return Err(Error::io(
                "binding",
                path,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket",
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("checking", path, e)),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| Error::io("binding", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io("chmod", path, e))?;
    Ok(listener)
}
