//! The store lock: an exclusive `flock` on `<state-dir>/lock`, released by the kernel
//! when the holder exits or dies, so no crash can leave it held.

use std::fs::File;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::StateError;

pub struct StoreLock {
    _lock: Flock<File>,
}

impl StoreLock {
    pub fn acquire(path: &Path) -> Result<StoreLock, StateError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| StateError::io(path, e))?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| StateError::io(path, std::io::Error::from(errno)))?;
        Ok(StoreLock { _lock: lock })
    }
}
