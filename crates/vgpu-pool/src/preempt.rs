//! Preemption: which strictly lower-priority workloads to suspend so that a request (or a
//! suspended workload's resumption) fits.
//!
//! The rule: take the candidates in order (lowest priority first, then the youngest) until
//! their blocks and the free ones suffice; then give back, most important first, every
//! candidate the others can do without. The set is the smallest sufficient one in that
//! order: suspending any fewer of its members would not free enough, and no workload is
//! suspended while one of lower priority that could have served instead keeps running.
//! A single device is preferred, as for allocation; among devices, the one whose set has
//! the lowest top priority, then the fewest members, then the fewest blocks.

use super::plan::{Candidate, Scratch};
use super::priority::Priority;
use super::state::Share;

/// Where a request goes once its victims are suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Device(usize),
    Span,
}

/// The smallest sufficient prefix-closed set of `candidates` (already in preemption
/// order): indices into `candidates`, in that order. `enough(freed)` says whether blocks
/// freed per device (indexed by device) suffice; it must be monotonic.
pub(crate) fn choose(candidates: &[&Candidate], devices: usize, enough: impl Fn(&[u64]) -> bool) -> Option<Vec<usize>> {
    let mut freed = vec![0u64; devices];
    let mut chosen = Vec::new();
    if !enough(&freed) {
        for (i, c) in candidates.iter().enumerate() {
            add(&mut freed, &c.shares);
            chosen.push(i);
            if enough(&freed) {
                break;
            }
        }
        if !enough(&freed) {
            return None;
        }
    }
    // Give back what is not needed, the most important first.
    let mut keep = vec![true; chosen.len()];
    for k in (0..chosen.len()).rev() {
        let shares = &candidates[chosen[k]].shares;
        sub(&mut freed, shares);
        if enough(&freed) {
            keep[k] = false;
        } else {
            add(&mut freed, shares);
        }
    }
    Some(chosen.into_iter().zip(keep).filter(|&(_, k)| k).map(|(i, _)| i).collect())
}

fn add(freed: &mut [u64], shares: &[Share]) {
    for s in shares {
        freed[s.device] += s.blocks;
    }
}

fn sub(freed: &mut [u64], shares: &[Share]) {
    for s in shares {
        freed[s.device] -= s.blocks;
    }
}

impl Scratch<'_> {
    /// Victims that make room for `blocks` on the `eligible` devices for a request of
    /// `priority`, and where it then goes. `None`: not even suspending every lower-priority
    /// workload would make room.
    pub(crate) fn victims_for_request(
        &self,
        priority: Priority,
        eligible: &[usize],
        blocks: u64,
    ) -> Option<(Vec<u64>, Target)> {
        let devices = &self.pool.inventory.devices;
        let n = devices.len();
        // Could suspending every lower-priority workload make room at all?
        let room = |d: usize| self.free[d] + self.running_below(d, priority);
        if eligible.iter().map(|&d| room(d)).sum::<u64>() < blocks {
            return None;
        }
        let all = self.victims_below(priority, |x| eligible.contains(&x));
        // (top priority, members, blocks suspended, device): the smallest wins.
        type Cost = (Priority, usize, u64, usize);
        let mut best: Option<(Cost, Vec<u64>)> = None;
        for &d in eligible.iter().filter(|&&d| devices[d].blocks >= blocks && room(d) >= blocks) {
            let candidates: Vec<&Candidate> = all.iter().filter(|c| c.shares.iter().any(|s| s.device == d)).collect();
            let free = self.free[d];
            let Some(chosen) = choose(&candidates, n, |freed| free + freed[d] >= blocks) else { continue };
            let top = chosen.iter().map(|&i| candidates[i].priority).max().unwrap_or(Priority::DEFAULT);
            let suspended: u64 = chosen.iter().flat_map(|&i| &candidates[i].shares).map(|s| s.blocks).sum();
            let cost = (top, chosen.len(), suspended, d);
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, chosen.iter().map(|&i| candidates[i].seq).collect()));
            }
        }
        if let Some(((.., d), seqs)) = best {
            return Some((seqs, Target::Device(d)));
        }
        let candidates: Vec<&Candidate> = all.iter().collect();
        let free: u64 = eligible.iter().map(|&d| self.free[d]).sum();
        let chosen = choose(&candidates, n, |freed| free + eligible.iter().map(|&d| freed[d]).sum::<u64>() >= blocks)?;
        Some((chosen.iter().map(|&i| candidates[i].seq).collect(), Target::Span))
    }

    /// Victims that make room for a suspended workload of `priority` to take `demand`
    /// again (the same blocks on the same devices). `None`: it cannot resume yet.
    pub(crate) fn victims_for_resume(&self, priority: Priority, demand: &[Share]) -> Option<Vec<u64>> {
        let n = self.pool.inventory.devices.len();
        if demand.iter().any(|s| self.free[s.device] + self.running_below(s.device, priority) < s.blocks) {
            return None;
        }
        let candidates = self.victims_below(priority, |x| demand.iter().any(|s| s.device == x));
        let candidates: Vec<&Candidate> = candidates.iter().collect();
        let free = &self.free;
        let chosen =
            choose(&candidates, n, |freed| demand.iter().all(|s| free[s.device] + freed[s.device] >= s.blocks))?;
        Some(chosen.iter().map(|&i| candidates[i].seq).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(seq: u64, priority: i64, blocks: u64) -> Candidate {
        Candidate { seq, priority: Priority::new(priority).unwrap(), shares: vec![Share { device: 0, blocks }] }
    }

    fn pick(cands: &[Candidate], free: u64, need: u64) -> Option<Vec<u64>> {
        let cands: Vec<&Candidate> = cands.iter().collect();
        choose(&cands, 1, |freed| free + freed[0] >= need).map(|ix| ix.iter().map(|&i| cands[i].seq).collect())
    }

    #[test]
    fn lowest_priority_first_and_only_what_is_needed() {
        // In preemption order: priority 1 (two of them, the younger first), then priority 3.
        let cands = [cand(2, 1, 2), cand(1, 1, 2), cand(3, 3, 10)];
        assert_eq!(pick(&cands, 0, 2), Some(vec![2]), "the younger of the lowest");
        assert_eq!(pick(&cands, 0, 4), Some(vec![2, 1]));
        assert_eq!(pick(&cands, 1, 3), Some(vec![2]), "free blocks count");
        // 5 blocks: the priority-3 workload must go, and then neither priority-1 one is needed.
        assert_eq!(pick(&cands, 0, 5), Some(vec![3]));
        assert_eq!(pick(&cands, 0, 15), None);
        assert_eq!(pick(&cands, 9, 5), Some(vec![]), "nothing to preempt when it fits");
    }
}
