//! Allocation: where a request's blocks go.
//!
//! 1. One device: the eligible device with the fewest free blocks that still holds them
//!    all (best fit; after compaction a device's free blocks are one run, so this is the
//!    best-fitting contiguous run).
//! 2. Else one contiguous stretch of the node's numbering that crosses device boundaries
//!    (a device's free tail followed by wholly free devices): the smallest that holds them,
//!    its first blocks taken. On an empty node this is SPEC 1.2's "a 50T request is served
//!    with blocks 1–50".
//! 3. Else the free blocks of several devices, the devices with the most free first (the
//!    fewest devices).
//! 4. Else preemption (see `preempt.rs`), or a refusal naming what holds the blocks.
//!
//! Free blocks are always used before anyone is preempted, even when that spreads a
//! request over devices.

use super::error::{Holder, PoolError};
use super::inventory::Inventory;
use super::plan::{Plan, Scratch};
use super::preempt::Target;
use super::priority::Priority;
use super::request::Request;
use super::state::{AllocState, Allocation, Pool, Share};

/// Where `blocks` fit among the `eligible` devices given `free` blocks per device, without
/// preempting anyone.
pub fn place(inventory: &Inventory, free: &[u64], eligible: &[usize], blocks: u64) -> Option<Vec<Share>> {
    if blocks == 0 {
        return Some(Vec::new());
    }
    if let Some(&d) = eligible.iter().filter(|&&d| free[d] >= blocks).min_by_key(|&&d| (free[d], d)) {
        return Some(vec![Share { device: d, blocks }]);
    }
    if let Some(shares) = contiguous_stretch(inventory, free, eligible, blocks) {
        return Some(shares);
    }
    let total: u64 = eligible.iter().map(|&d| free[d]).sum();
    if total < blocks {
        return None;
    }
    let mut order: Vec<usize> = eligible.iter().copied().filter(|&d| free[d] > 0).collect();
    order.sort_by_key(|&d| (std::cmp::Reverse(free[d]), d));
    let mut left = blocks;
    let mut shares = Vec::new();
    for d in order {
        if left == 0 {
            break;
        }
        let take = free[d].min(left);
        shares.push(Share { device: d, blocks: take });
        left -= take;
    }
    shares.sort_by_key(|s| s.device);
    Some(shares)
}

/// Step 2: stretches of free blocks that cross device boundaries. Devices are compact, so a
/// stretch is one device's free tail followed by devices that are wholly free.
fn contiguous_stretch(inventory: &Inventory, free: &[u64], eligible: &[usize], blocks: u64) -> Option<Vec<Share>> {
    let devices = &inventory.devices;
    let usable = |d: usize| eligible.contains(&d) && devices[d].blocks > 0;
    // (first device, last device, free blocks) of every maximal stretch.
    let mut stretches: Vec<(usize, usize, u64)> = Vec::new();
    for d in 0..devices.len() {
        if devices[d].blocks == 0 {
            continue; // worth no block: not a break in the numbering
        }
        let wholly_free = usable(d) && free[d] == devices[d].blocks;
        match stretches.last_mut() {
            Some((_, last, len)) if wholly_free && continues(inventory, *last, d) => {
                *last = d;
                *len += free[d];
            }
            _ if usable(d) && free[d] > 0 => stretches.push((d, d, free[d])),
            _ => {}
        }
    }
    let &(first, last, _) = stretches.iter().filter(|s| s.2 >= blocks && s.0 != s.1).min_by_key(|s| (s.2, s.0))?;
    let mut left = blocks;
    let mut shares = Vec::new();
    for (d, &have) in free.iter().enumerate().take(last + 1).skip(first) {
        let take = have.min(left);
        if take > 0 {
            shares.push(Share { device: d, blocks: take });
            left -= take;
        }
    }
    Some(shares)
}

/// Whether device `next` directly follows device `last` in the numbering.
fn continues(inventory: &Inventory, last: usize, next: usize) -> bool {
    let (a, b) = (&inventory.devices[last], &inventory.devices[next]);
    a.first_block + a.blocks == b.first_block
}

/// What a claim on blocks needs to be served.
pub(crate) struct Claim<'a> {
    pub id: &'a str,
    pub priority: Priority,
    pub blocks: u64,
    pub eligible: Vec<usize>,
}

impl Scratch<'_> {
    /// Serve a claim: free blocks, else preemption. Returns its shares, with its victims
    /// (if any) recorded as suspended; `None` if it cannot be served, with nothing recorded.
    pub(crate) fn grant(&mut self, claim: &Claim<'_>) -> Option<(Vec<Share>, Vec<u64>)> {
        let inventory = &self.pool.inventory;
        if let Some(shares) = place(inventory, &self.free, &claim.eligible, claim.blocks) {
            return Some((shares, Vec::new()));
        }
        let (victims, target) = self.victims_for_request(claim.priority, &claim.eligible, claim.blocks)?;
        for &v in &victims {
            self.suspend(v, claim.id);
        }
        let shares = match target {
            Target::Device(device) => Some(vec![Share { device, blocks: claim.blocks }]),
            Target::Span => place(inventory, &self.free, &claim.eligible, claim.blocks),
        };
        // The victims were chosen to make room, so `shares` is always there.
        shares.map(|s| (s, victims))
    }
}

impl Pool {
    /// Plan to admit a request: blocks on one device if possible, else across devices,
    /// else by preempting strictly lower-priority workloads (the plan then also resumes or
    /// starts whoever fits in blocks the preemption freed beyond the request). Changes
    /// nothing; see [`Pool::apply`]. Errors: a bad or duplicate request, more blocks than the devices it
    /// may use have ([`PoolError::TooLarge`], at once), or no room even with preemption
    /// ([`PoolError::NoRoom`], naming the holders; queue it with [`Pool::enqueue`] to wait).
    pub fn admit(&self, request: &Request) -> Result<Plan, PoolError> {
        self.admit_without(request, &std::collections::BTreeSet::new())
    }

    /// [`Pool::admit`], whose settling leaves the workloads in `held` where they are (see
    /// [`Pool::settle_without`]).
    pub fn admit_without(&self, request: &Request, held: &std::collections::BTreeSet<String>) -> Result<Plan, PoolError> {
        self.check_request(request)?;
        let claim = Claim {
            id: &request.id,
            priority: request.priority,
            blocks: request.blocks,
            eligible: self.inventory.eligible(request.kind),
        };
        let mut scratch = Scratch::new(self);
        scratch.held = held.clone();
        let Some((shares, _)) = scratch.grant(&claim) else {
            return Err(self.no_room(request.blocks, request.priority, &claim.eligible, None));
        };
        let alloc = Allocation {
            id: request.id.clone(),
            name: request.name.clone(),
            priority: request.priority,
            seq: self.next_seq,
            blocks: request.blocks,
            kind: request.kind,
            state: AllocState::Running,
            shares: Vec::new(),
            preempted_by: None,
        };
        scratch.run_new(alloc, shares);
        // Preemption may free more than the request takes: blocks that suspended or
        // waiting work can use at once.
        scratch.settle();
        Ok(scratch.into_plan())
    }

    /// Why `requested` blocks for a claim of `priority` on the `eligible` devices cannot be
    /// had: the free blocks, and the running holders that may not be preempted (but
    /// `claimant`, a running workload asking for more).
    pub(crate) fn no_room(&self, requested: u64, priority: Priority, eligible: &[usize], claimant: Option<&str>) -> PoolError {
        let free = eligible.iter().map(|&d| self.map.device(d).free()).sum();
        let mut holders: Vec<Holder> = self
            .allocations
            .values()
            .filter(|a| a.state == AllocState::Running && a.priority >= priority && Some(a.id.as_str()) != claimant)
            .filter_map(|a| {
                let blocks: u64 = a.shares.iter().filter(|s| eligible.contains(&s.device)).map(|s| s.blocks).sum();
                (blocks > 0).then(|| Holder {
                    id: a.id.clone(),
                    name: a.name.clone(),
                    priority: a.priority.get(),
                    blocks,
                })
            })
            .collect();
        holders.sort_by(|a, b| b.blocks.cmp(&a.blocks).then_with(|| a.id.cmp(&b.id)));
        PoolError::NoRoom { requested, free, holders }
    }
}
