//! `vgpu ps`'s whole listing: a row per workload, and the processes in no vGPU on their
//! GPUs. Root with the store lock free reconciles first; anyone else reads the store as it is
//! ([`crate::read_only`]), and the driver fills in what they cannot read.

use super::driver::{self, Driver, UnmanagedRow};
use super::{row, Row};
use crate::cgroup::Layout;
use crate::read_only::{Access, ReadOnly};
use crate::state::{StateError, Store};

/// What to list besides the workloads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Every process of each workload (`ps -a`).
    pub processes: bool,
    /// The processes in no vGPU on the workloads' GPUs (this needs the driver).
    pub unmanaged: bool,
}

/// One listing.
#[derive(Debug)]
pub struct Listing {
    pub rows: Vec<Row>,
    /// With [`Options::unmanaged`]: the processes in no vGPU on the GPUs the workloads use
    /// (empty without a driver).
    pub unmanaged: Option<Vec<UnmanagedRow>>,
    /// Workload records that cannot be read (left in place; each names its file).
    pub damaged: Vec<StateError>,
    /// Why the store was read as it is, if it was (not reconciled first).
    pub read_only: Option<ReadOnly>,
}

/// List the workloads. Never waits for the store lock and, unless it is root's to take at
/// once, writes nothing.
pub fn list(store: &Store, driver: &Driver<'_>, options: Options) -> Result<Listing, StateError> {
    let access = Access::take(store)?;
    let read_only = access.read_only();
    let reconciled = match &access {
        Access::Writer(lock) => Some(crate::lifecycle::reconcile_store(store, lock)),
        Access::ReadOnly(_) => None,
    };
    drop(access);
    let (workloads, damaged) = store.workloads();
    // After a reconcile, its own list (it saw the same files, under the lock).
    let damaged = reconciled.map(|r| r.damaged).unwrap_or(damaged);
    let layout = Layout::detect();
    let mut rows: Vec<Row> = workloads.iter().map(|w| row(store, layout.as_ref(), w, options.processes)).collect();
    let unreadable = rows.iter().any(|r| !r.usage_readable || r.gpus.iter().any(|g| g.mem_used.is_none()));
    let snapshot = if options.unmanaged || unreadable { driver.snapshot() } else { None };
    if let Some(snapshot) = &snapshot {
        for (r, w) in rows.iter_mut().zip(&workloads) {
            driver::fill(r, w, snapshot);
        }
    }
    let unmanaged = options.unmanaged.then(|| snapshot.as_ref().map(|s| driver::unmanaged(s, &workloads)).unwrap_or_default());
    Ok(Listing { rows, unmanaged, damaged, read_only })
}
