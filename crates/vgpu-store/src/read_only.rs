//! How the listing commands (`ps`, `pool`, `devices`, `partition list`, `carbon plan`,
//! `carbon intensity`) get at the store.
//!
//! Root, when the store lock is free at once, lists as every command works: under the lock,
//! after reconciling (and, for the pool, settling). Everybody else — another user, or root
//! while a writer holds the lock — reads the files as they are: nothing is created, changed
//! or locked, and nothing is waited for. So a listing never blocks behind a writer, and
//! works for users who may not write the store, as `nvidia-smi` works for them. What it
//! shows may then include what the next writer will clean up (a workload whose supervisor
//! died), marked as such.

use std::time::Duration;

use serde::Serialize;

use crate::state::StateError;

use crate::state::Store;

use crate::state::StoreLock;

/// Why a listing reads the store as it is instead of reconciling it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadOnly {
    /// Not root: the store and its lock (`<state>/lock`, root's, 0600) are root's.
    NotRoot,
    /// Root, but a writer holds the store lock; a listing does not wait for it.
    LockHeld,
}

/// How this listing may use the store.
pub enum Access {
    /// Root with the store lock: reconcile (and settle) before listing, as every command does.
    Writer(StoreLock),
    /// Read the files as they are, write nothing.
    ReadOnly(ReadOnly),
}

impl Access {
    /// Root: try the store lock once, without waiting ([`Access::Writer`], or
    /// [`ReadOnly::LockHeld`] when a writer holds it). Anyone else: [`ReadOnly::NotRoot`],
    /// after checking the store's existing directories as a writer would (nothing is made).
    pub fn take(store: &Store) -> Result<Access, StateError> {
        if !is_root() {
            store.check_existing_dirs()?;
            return Ok(Access::ReadOnly(ReadOnly::NotRoot));
        }
        match store.lock_within(Duration::ZERO) {
            Ok(lock) => Ok(Access::Writer(lock)),
            Err(StateError::LockBusy { pid, .. }) => {
                tracing::debug!(
                    "the store lock is held (by pid {}): listing the state as it is, without reconciling",
                    pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
                );
                Ok(Access::ReadOnly(ReadOnly::LockHeld))
            }
            Err(e) => Err(e),
        }
    }

    /// Why the listing is read-only, if it is.
    pub fn read_only(&self) -> Option<ReadOnly> {
        match self {
            Access::Writer(_) => None,
            Access::ReadOnly(why) => Some(*why),
        }
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_lists_as_writer_when_the_lock_is_free_and_read_only_when_it_is_held() {
        if !is_root() {
            panic!("this test needs root (the store lock is root's)");
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        let access = Access::take(&store).unwrap();
        assert!(matches!(access, Access::Writer(_)));
        let started = std::time::Instant::now();
        let again = Access::take(&store).unwrap();
        assert_eq!(again.read_only(), Some(ReadOnly::LockHeld));
        assert!(started.elapsed() < Duration::from_secs(1), "did not wait for the lock");
        drop(access);
        assert!(matches!(Access::take(&store).unwrap(), Access::Writer(_)));
    }
}
