//! The block map: who owns each block, run-length encoded per device.
//!
//! A device's blocks are a list of runs (`len` consecutive blocks, one owner or free), so
//! every operation costs the number of runs on the device, not the number of blocks. An
//! owner is an allocation's sequence number.

use serde::{Deserialize, Serialize};

use super::error::PoolError;

/// `len` consecutive blocks with one owner (`None`: free).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub len: u64,
    pub owner: Option<u64>,
}

/// One device's blocks, in block order. Invariant: no empty run, no two neighbours with the
/// same owner.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeviceRuns {
    pub(crate) runs: Vec<Run>,
}

impl DeviceRuns {
    pub fn new(blocks: u64) -> Self {
        let mut d = DeviceRuns { runs: vec![Run { len: blocks, owner: None }] };
        d.normalise();
        d
    }

    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    pub fn len(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn free(&self) -> u64 {
        self.runs.iter().filter(|r| r.owner.is_none()).map(|r| r.len).sum()
    }

    pub fn held_by(&self, owner: u64) -> u64 {
        self.runs.iter().filter(|r| r.owner == Some(owner)).map(|r| r.len).sum()
    }

    /// Free every block of `owner`; returns how many.
    pub fn release(&mut self, owner: u64) -> u64 {
        let mut freed = 0;
        for run in self.runs.iter_mut().filter(|r| r.owner == Some(owner)) {
            run.owner = None;
            freed += run.len;
        }
        if freed > 0 {
            self.normalise();
        }
        freed
    }

    /// Give `count` free blocks to `owner`: the start of the smallest free run that holds
    /// them all (best fit); when the free blocks are scattered, compact first (relabelling
    /// within a device is free) and take the start of the one free run.
    pub fn take(&mut self, owner: u64, count: u64) -> Result<(), PoolError> {
        if count == 0 {
            return Ok(());
        }
        let at = match self.best_fit(count) {
            Some(at) => at,
            None => {
                self.compact();
                self.best_fit(count).ok_or_else(|| {
                    PoolError::Corrupt(format!("{count} blocks wanted on a device with {} free", self.free()))
                })?
            }
        };
        let run = self.runs[at];
        self.runs[at] = Run { len: count, owner: Some(owner) };
        if run.len > count {
            self.runs.insert(at + 1, Run { len: run.len - count, owner: None });
        }
        self.normalise();
        Ok(())
    }

    /// The smallest free run of at least `count` blocks (the first of equals).
    fn best_fit(&self, count: u64) -> Option<usize> {
        self.runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.owner.is_none() && r.len >= count)
            .min_by_key(|&(i, r)| (r.len, i))
            .map(|(i, _)| i)
    }

    pub(crate) fn normalise(&mut self) {
        let mut out: Vec<Run> = Vec::with_capacity(self.runs.len());
        for run in self.runs.drain(..).filter(|r| r.len > 0) {
            match out.last_mut() {
                Some(last) if last.owner == run.owner => last.len += run.len,
                _ => out.push(run),
            }
        }
        self.runs = out;
    }
}

/// The whole node: one run list per device, in the inventory's order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockMap {
    pub(crate) devices: Vec<DeviceRuns>,
}

impl BlockMap {
    pub fn new(sizes: impl IntoIterator<Item = u64>) -> Self {
        BlockMap { devices: sizes.into_iter().map(DeviceRuns::new).collect() }
    }

    pub fn device(&self, index: usize) -> &DeviceRuns {
        &self.devices[index]
    }

    pub(crate) fn device_mut(&mut self, index: usize) -> &mut DeviceRuns {
        &mut self.devices[index]
    }

    pub fn devices(&self) -> &[DeviceRuns] {
        &self.devices
    }

    pub fn free_per_device(&self) -> Vec<u64> {
        self.devices.iter().map(DeviceRuns::free).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(d: &DeviceRuns) -> Vec<(u64, Option<u64>)> {
        d.runs().iter().map(|r| (r.len, r.owner)).collect()
    }

    #[test]
    fn take_and_release_keep_runs_merged() {
        let mut d = DeviceRuns::new(10);
        d.take(1, 3).unwrap();
        d.take(2, 3).unwrap();
        assert_eq!(owners(&d), [(3, Some(1)), (3, Some(2)), (4, None)]);
        assert_eq!(d.release(1), 3);
        assert_eq!(owners(&d), [(3, None), (3, Some(2)), (4, None)]);
        // Best fit: the 3-block hole, not the 4-block tail.
        d.take(3, 2).unwrap();
        assert_eq!(owners(&d), [(2, Some(3)), (1, None), (3, Some(2)), (4, None)]);
        assert_eq!(d.free(), 5);
        assert_eq!(d.held_by(2), 3);
    }

    #[test]
    fn scattered_free_blocks_are_compacted_before_taking() {
        let mut d = DeviceRuns::new(10);
        d.take(1, 3).unwrap();
        d.take(2, 3).unwrap();
        d.take(3, 2).unwrap();
        d.release(1);
        // Free: 1–3 and 9–10; 4 blocks fit in neither.
        d.take(4, 4).unwrap();
        assert_eq!(owners(&d), [(3, Some(2)), (2, Some(3)), (4, Some(4)), (1, None)]);
        assert!(d.take(5, 2).is_err());
    }

    #[test]
    fn a_device_worth_no_block_has_no_run() {
        let d = DeviceRuns::new(0);
        assert!(d.is_empty());
        assert_eq!(d.free(), 0);
    }
}
