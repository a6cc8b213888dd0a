//! Compaction (SPEC 1.2): relabel a device's blocks so that each owner's blocks are one run
//! and the free blocks one run at the end of the device.
//!
//! Within one device blocks are interchangeable time slices, so relabelling costs nothing
//! and tells nobody anything; blocks never move to another device. Owners keep their order
//! of first appearance, which is what the document's example shows: app1 = 1–3, app2 = 4–6,
//! app3 = 7–8, 9–10 free; app1 exits → app2 = 1–3, app3 = 4–5, 6–10 free.

use std::collections::HashMap;

use super::map::{BlockMap, DeviceRuns, Run};

impl DeviceRuns {
    /// Compact this device; true if anything moved.
    pub fn compact(&mut self) -> bool {
        if self.is_compact() {
            return false;
        }
        let mut order: Vec<Run> = Vec::new();
        let mut slot: HashMap<u64, usize> = HashMap::new();
        let mut free = 0;
        for run in &self.runs {
            match run.owner {
                None => free += run.len,
                Some(owner) => match slot.get(&owner) {
                    Some(&i) => order[i].len += run.len,
                    None => {
                        slot.insert(owner, order.len());
                        order.push(*run);
                    }
                },
            }
        }
        order.push(Run { len: free, owner: None });
        self.runs = order;
        self.normalise();
        true
    }

    /// Every owner one run, and no free run before the last run.
    pub fn is_compact(&self) -> bool {
        let last = self.runs.len().saturating_sub(1);
        if self.runs.iter().enumerate().any(|(i, r)| r.owner.is_none() && i != last) {
            return false;
        }
        // Runs are normalised (no two neighbours share an owner), so an owner with two
        // runs shows up as a duplicate.
        let mut owners: Vec<u64> = self.runs.iter().filter_map(|r| r.owner).collect();
        owners.sort_unstable();
        owners.windows(2).all(|w| w[0] != w[1])
    }
}

impl BlockMap {
    /// Compact every device; true if anything moved.
    pub fn compact(&mut self) -> bool {
        self.devices.iter_mut().fold(false, |moved, d| d.compact() | moved)
    }

    pub fn is_compact(&self) -> bool {
        self.devices.iter().all(DeviceRuns::is_compact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_keep_their_order_and_free_goes_last() {
        let mut d = DeviceRuns {
            runs: vec![
                Run { len: 2, owner: None },
                Run { len: 1, owner: Some(7) },
                Run { len: 1, owner: Some(3) },
                Run { len: 1, owner: None },
                Run { len: 2, owner: Some(7) },
            ],
        };
        assert!(!d.is_compact());
        assert!(d.compact());
        assert_eq!(
            d.runs(),
            [Run { len: 3, owner: Some(7) }, Run { len: 1, owner: Some(3) }, Run { len: 3, owner: None }]
        );
        assert!(d.is_compact());
        assert!(!d.compact(), "compacting twice changes nothing");
    }
}
