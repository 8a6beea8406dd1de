//! Progress for long operations: one rewritten line on stderr, only when
//! stderr is a terminal (never in pipes, logs or tests).

use std::io::{IsTerminal, Write};

pub struct Progress {
    on: bool,
    dirty: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
            dirty: false,
        }
    }

    pub fn step(&mut self, msg: &str) {
        if !self.on {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{msg}");
        let _ = err.flush();
        self.dirty = true;
    }

    pub fn done(&mut self) {
        if self.on && self.dirty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.dirty = false;
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done();
    }
}
