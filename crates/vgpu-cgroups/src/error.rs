//! The one error type of the cgroup layer. Every variant names the path or the controller
//! involved; causes (the OS error) are chained as `source`, not repeated in the message.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::Signal;

use super::layout::Controller;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },

    #[error("cgroup {} already exists", path.display())]
    AlreadyExists { path: PathBuf },

    #[error("cgroup {name:?} not found (looked for {})", display_paths(looked_in))]
    NotFound { name: String, looked_in: Vec<PathBuf> },

    #[error("the {controller} controller is not available for {}", path.display())]
    MissingController { controller: Controller, path: PathBuf },

    #[error("no cgroup hierarchy vgpu uses (cpu, cpuacct, memory, pids, freezer) is mounted for {name:?}")]
    NoHierarchy { name: String },

    #[error("invalid {what} limit {value}: {reason}")]
    InvalidLimit { what: &'static str, value: String, reason: &'static str },

    #[error("cgroup manager: {reason}")]
    Manager { reason: String },

    #[error("invalid cgroup record: {reason}")]
    InvalidSpec { reason: String },

    #[error("cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("unexpected content {content:?} in {}", path.display())]
    Parse { path: PathBuf, content: String },

    #[error("{} did not become {target} within {waited:?} (it reads {current:?})", path.display())]
    Timeout { path: PathBuf, target: &'static str, current: String, waited: Duration },

    #[error("cannot send {signal} to pid {pid} of {}", path.display())]
    Signal {
        pid: i32,
        signal: Signal,
        path: PathBuf,
        #[source]
        source: Errno,
    },

    #[error("cgroup {} still holds processes {pids:?}", path.display())]
    Populated { path: PathBuf, pids: Vec<i32> },
}

pub type Result<T, E = CgroupError> = std::result::Result<T, E>;

fn display_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// An error and its causes on one line, for logs (`{:#}` does this for `anyhow` errors).
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
