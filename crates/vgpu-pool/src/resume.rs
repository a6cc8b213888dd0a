//! Settling: after blocks are released, who gets them.
//!
//! Suspended and waiting workloads are served highest priority first (then the oldest).
//! A suspended workload resumes on the same devices with the same number of blocks, and
//! only when they fit: the free blocks plus, if need be, those of strictly lower-priority
//! running workloads, which are then suspended in its place by the rule of `preempt.rs`.
//! A waiting workload is served like a new request. Whoever released the blocks settles;
//! no daemon is needed. After a settle, no suspended or waiting workload could be served by
//! the free blocks and those of lower-priority running workloads.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::allocate::Claim;
use super::plan::{Plan, Scratch};
use super::state::{AllocState, Pool};

impl Pool {
    /// Plan who resumes or starts now. Changes nothing; see [`Pool::apply`]. An empty plan
    /// when nobody can.
    pub fn settle(&self) -> Plan {
        self.settle_without(&BTreeSet::new())
    }

    /// [`Pool::settle`], leaving the workloads in `held` suspended or waiting (their
    /// memory does not fit back yet); their blocks may serve others meanwhile.
    pub fn settle_without(&self, held: &BTreeSet<String>) -> Plan {
        let mut scratch = Scratch::new(self);
        scratch.held = held.clone();
        scratch.settle();
        scratch.into_plan()
    }
}

impl Scratch<'_> {
    /// Serve the suspended and waiting workloads that can be served, best first.
    pub(crate) fn settle(&mut self) {
        let pool = self.pool;
        let mut queue: BinaryHeap<_> = pool
            .allocations
            .values()
            .filter(|a| self.state(a.seq).is_some_and(|s| s != AllocState::Running) && !self.held.contains(&a.id))
            .map(|a| (a.priority, Reverse(a.seq)))
            .collect();
        while let Some((priority, Reverse(seq))) = queue.pop() {
            let Some(alloc) = pool.allocations.get(&seq) else { continue };
            let victims = match self.state(seq) {
                Some(AllocState::Suspended) => {
                    let demand = self.shares(seq).to_vec();
                    let Some(victims) = self.victims_for_resume(priority, &demand) else { continue };
                    for &v in &victims {
                        self.suspend(v, &alloc.id);
                    }
                    self.run(seq, demand);
                    victims
                }
                Some(AllocState::Waiting) => {
                    let claim = Claim {
                        id: &alloc.id,
                        priority,
                        blocks: alloc.blocks,
                        eligible: pool.inventory.eligible(alloc.kind),
                    };
                    let Some((shares, victims)) = self.grant(&claim) else { continue };
                    self.run(seq, shares);
                    victims
                }
                _ => continue,
            };
            // Those just suspended rank below this one and are considered in their turn.
            for v in victims {
                if let Some(a) = pool.allocations.get(&v) {
                    queue.push((a.priority, Reverse(v)));
                }
            }
        }
    }
}
