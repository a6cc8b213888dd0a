//! Resizing a running allocation (`vgpu update ID --tflops N`).
//!
//! Its processes already run on specific devices, so its blocks grow or shrink only on the
//! devices it holds shares on, keeping at least one block on each.
//!
//! - Lower: the blocks go back (from the device where it holds the most first, so its
//!   shares stay even), and the pool settles in the same plan: whoever was waiting or
//!   suspended may now run.
//! - Raise: the extra blocks come from free blocks on its devices, else by preempting
//!   strictly lower-priority running allocations there, exactly as a request of its
//!   priority would ([`Scratch::grant`]); else [`PoolError::NoRoom`] naming who holds them.
//!   Preemption may free more than it takes: the plan settles too.
//!
//! Like `admit`, it changes nothing: the caller freezes the plan's victims and records it
//! with [`Pool::apply`].

use super::allocate::Claim;
use super::error::PoolError;
use super::plan::{Plan, Scratch};
use super::state::{AllocState, Pool, Share};

impl Pool {
    /// Plan to give running workload `id` `blocks` blocks in all, on the devices it runs on.
    /// Errors: no such allocation, one that is not running, fewer blocks than devices or
    /// more than its devices have (usage errors), or no room even with preemption.
    pub fn resize(&self, id: &str, blocks: u64) -> Result<Plan, PoolError> {
        self.resize_without(id, blocks, &std::collections::BTreeSet::new())
    }

    /// [`Pool::resize`], whose settling leaves the workloads in `held` where they are (see
    /// [`Pool::settle_without`]).
    pub fn resize_without(&self, id: &str, blocks: u64, held_back: &std::collections::BTreeSet<String>) -> Result<Plan, PoolError> {
        let alloc = self.allocation(id).ok_or_else(|| PoolError::UnknownWorkload(id.to_string()))?;
        if alloc.state != AllocState::Running {
            return Err(PoolError::NotRunning { id: id.to_string(), name: alloc.name.clone(), state: alloc.state });
        }
        let devices: Vec<usize> = alloc.shares.iter().map(|s| s.device).collect();
        if blocks < devices.len() as u64 {
            return Err(PoolError::ResizeBelowDevices { id: id.to_string(), name: alloc.name.clone(), devices: devices.len(), requested: blocks });
        }
        let available: u64 = devices.iter().map(|&d| self.inventory.devices[d].blocks).sum();
        if blocks > available {
            return Err(PoolError::ResizeTooLarge { id: id.to_string(), name: alloc.name.clone(), requested: blocks, available });
        }
        let held = alloc.held();
        let mut scratch = Scratch::new(self);
        scratch.held = held_back.clone();
        if blocks < held {
            scratch.reshape(alloc.seq, shrink(&alloc.shares, held - blocks));
        } else if blocks > held {
            let claim = Claim { id, priority: alloc.priority, blocks: blocks - held, eligible: devices.clone() };
            let Some((extra, _victims)) = scratch.grant(&claim) else {
                return Err(self.no_room(claim.blocks, claim.priority, &devices, Some(id)));
            };
            scratch.reshape(alloc.seq, grow(&alloc.shares, &extra));
        } else {
            return Ok(scratch.into_plan());
        }
        scratch.settle();
        Ok(scratch.into_plan())
    }
}

/// `shares` less `by` blocks, taken one at a time from the device holding the most (the
/// higher device of equals), never the last block of a device. The caller has checked that
/// `by` leaves at least one block per device.
fn shrink(shares: &[Share], by: u64) -> Vec<Share> {
    let mut out = shares.to_vec();
    let mut left = by;
    while left > 0 {
        // Take down to the next largest share at once, so that this costs the number of
        // devices, not the number of blocks.
        let Some(top) = out.iter().filter(|s| s.blocks > 1).map(|s| s.blocks).max() else { break };
        let next = out.iter().map(|s| s.blocks).filter(|&b| b < top).max().unwrap_or(1).max(1);
        let at_top: Vec<usize> = (0..out.len()).filter(|&i| out[i].blocks == top).collect();
        let room = (top - next) * at_top.len() as u64;
        if room <= left {
            for &i in &at_top {
                out[i].blocks = next;
            }
            left -= room;
        } else {
            // Level down as far as whole rounds go, then one more from the highest devices.
            let rounds = left / at_top.len() as u64;
            let extra = (left % at_top.len() as u64) as usize;
            for (k, &i) in at_top.iter().enumerate().rev() {
                let more = u64::from(at_top.len() - k <= extra);
                out[i].blocks -= rounds + more;
            }
            left = 0;
        }
    }
    out
}

/// `shares` plus `extra` (both sorted by device), merged per device.
fn grow(shares: &[Share], extra: &[Share]) -> Vec<Share> {
    let mut out = shares.to_vec();
    for e in extra {
        match out.iter_mut().find(|s| s.device == e.device) {
            Some(s) => s.blocks += e.blocks,
            None => out.push(*e),
        }
    }
    out.sort_by_key(|s| s.device);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(blocks: &[u64]) -> Vec<Share> {
        blocks.iter().enumerate().map(|(device, &blocks)| Share { device, blocks }).collect()
    }

    fn counts(shares: &[Share]) -> Vec<u64> {
        shares.iter().map(|s| s.blocks).collect()
    }

    #[test]
    fn shrinking_takes_from_the_largest_share_first_and_keeps_one_each() {
        assert_eq!(counts(&shrink(&shares(&[8, 2]), 4)), [4, 2]);
        assert_eq!(counts(&shrink(&shares(&[8, 2]), 7)), [2, 1]);
        assert_eq!(counts(&shrink(&shares(&[8, 2]), 8)), [1, 1]);
        assert_eq!(counts(&shrink(&shares(&[5, 5, 5]), 1)), [5, 5, 4]);
        assert_eq!(counts(&shrink(&shares(&[5, 5, 5]), 5)), [4, 3, 3]);
        assert_eq!(counts(&shrink(&shares(&[3, 9, 1]), 6)), [3, 3, 1]);
        assert_eq!(counts(&shrink(&shares(&[7]), 6)), [1]);
    }

    #[test]
    fn growing_merges_per_device() {
        let grown = grow(&shares(&[2, 3]), &[Share { device: 1, blocks: 4 }]);
        assert_eq!(counts(&grown), [2, 7]);
    }
}
