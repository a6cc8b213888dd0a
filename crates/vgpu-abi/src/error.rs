//! Why a usage or per-process file cannot be used: the one error of the mapped layouts.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::layout::LAYOUT_VERSION;

/// Why a usage or per-process file cannot be used.
#[derive(Debug)]
pub enum LayoutError {
    Io { path: PathBuf, source: io::Error },
    BadMagic { path: PathBuf, what: &'static str },
    Version { path: PathBuf, found: u32 },
    Truncated { path: PathBuf, len: usize, expected: usize },
    Corrupt { path: PathBuf, reason: String },
    /// Not a regular file (a FIFO, symbolic link, directory…): never opened through, never
    /// read. `kind` says what it is.
    NotRegular { path: PathBuf, kind: &'static str },
    /// A path vgpu will not use as it is: a name that is not plain, a directory owned by
    /// another user, a symbolic link where a directory belongs. `reason` says which.
    Unsafe { path: PathBuf, reason: String },
}

impl LayoutError {
    /// [`crate::mapping::open_regular`]'s refusal, naming `path`.
    pub(crate) fn from_open(path: &Path, e: crate::mapping::OpenRegularError) -> LayoutError {
        match e {
            crate::mapping::OpenRegularError::Io(source) => LayoutError::Io {
                path: path.to_path_buf(),
                source,
            },
            crate::mapping::OpenRegularError::NotRegular(kind) => LayoutError::NotRegular {
                path: path.to_path_buf(),
                kind,
            },
        }
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            LayoutError::BadMagic { path, what } => write!(f, "{}: not a {what} (bad magic)", path.display()),
            LayoutError::Version { path, found } => write!(
                f,
                "{}: created by {} vgpu (layout version {found}, this build reads {LAYOUT_VERSION})",
                path.display(),
                if *found < LAYOUT_VERSION { "an older" } else { "a newer" }
            ),
            LayoutError::Truncated { path, len, expected } => write!(
                f,
                "{}: damaged vgpu state file: {len} bytes, expected {expected}",
                path.display()
            ),
            LayoutError::Corrupt { path, reason } => write!(f, "{}: damaged vgpu state file: {reason}", path.display()),
            LayoutError::NotRegular { path, kind } => write!(
                f,
                "{}: not a regular file (a {kind}); not opened",
                path.display()
            ),
            LayoutError::Unsafe { path, reason } => write!(f, "{}: {reason}; not used", path.display()),
        }
    }
}

impl std::error::Error for LayoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LayoutError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
