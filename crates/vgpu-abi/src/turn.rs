//! Turns (issue 27): vGPUs sharing one GPU put their work on it one at a time, so that the
//! GPU does not time-slice between their contexts (every switch costs; two saturating
//! contexts lose ~7 % of an H100). Pure: the decision at a launch from what the GPU's board
//! shows ([`crate::board::Board::turn_peers`]); the shim acts on it.
//!
//! The protocol needs no shared writable state: each vGPU writes only its own slot
//! (`BoardSlot::turn_until_ns`, `queued_until_ns`, `waiting_since_ns`) and reads the
//! others'. At a launch, a vGPU that has other active vGPUs on the GPU:
//!
//! * **holds the turn** (its `turn_until` is ahead): it launches, unless a newer claim of
//!   the same priority is on the board (it lost a race, or was found idle: it yields), or a
//!   vGPU of higher priority waits or has cut in (its turn is cut at this kernel boundary),
//!   or another vGPU's work is still queued (a launch that crossed its claim: it drains
//!   first); while a vGPU of higher priority is on the GPU (active or resting: a service
//!   between requests) it keeps at most [`QUEUE_AHEAD_NS`] of work queued, so that a cut
//!   takes effect within that much;
//! * **does not hold it**: it waits while another vGPU of its priority or higher holds it,
//!   or while a waiting vGPU comes before it (higher priority, then the longer wait, then
//!   the name); when it is next, it waits for the work the others queued to drain (their
//!   `queued_until`, which each keeps from its own kernels' measured durations), then claims
//!   a turn of [`turn_ns`] from its share (its share of a cycle of ¾ of the credit a waiting
//!   vGPU banks; a turn also ends early when the vGPU's budget runs out). A vGPU of higher
//!   priority does not wait for a lower one's turn or drain: it claims at once, and its
//!   kernel follows the lower one's work (at most [`QUEUE_AHEAD_NS`] of it) in the GPU's
//!   queue (one switch, [`SWITCH_NS`], counted into its own queue's end, [`queue_start`])
//!   rather than its program waiting on the CPU.
//!
//! A vGPU without the turn asks for one only once its budget covers [`min_work_ns`] (a run
//! worth a hand-over: a high priority does not cut a lower turn for every kernel its budget
//! allows, and the lower one keeps runs long enough to use its share) — unless its own work
//! ended [`REST_NS`] ago or more: a request after a rest is served at once.
//!
//! A holder with nothing queued for [`IDLE_GRACE_NS`] has given its turn up (it needs to
//! do nothing: the others see it), and a holder whose budget runs out with its next launch
//! releases its turn as it makes this one (the next vGPU then waits only for the drain).
//! Exclusion is best effort: two claims in the same microseconds are settled at the next
//! launch (the newer claim keeps the turn), and a missed one only costs what turns save.
//! Nothing can hold the others for long: a claim lasts at most a turn, a holder that dies
//! stops renewing it, and a launch that has waited [`MAX_WAIT_NS`] for turns goes anyway
//! (a dead or lying tenant cannot stall the others), and its process then takes no turns on
//! that GPU for [`DISTRUST_NS`].

use crate::compute::PPM;

/// A holder whose queued work ended this long ago, and that launched nothing since, has
/// given its turn up (ns).
pub const IDLE_GRACE_NS: u64 = 200_000;
/// While a vGPU of higher priority is on the GPU, a holder keeps at most this much work
/// queued ahead (ns): the latency of cutting its turn. 150 µs: a 2 ms request beside a batch
/// of 20 µs kernels took 1.12× its time alone (300 µs: 1.19×), and the batch kept 98.5 % of
/// its share (`cargo bench --bench turns -- --latency`).
pub const QUEUE_AHEAD_NS: u64 = 150_000;
/// A launch waits at most this long for turns in all; then it goes (ns).
pub const MAX_WAIT_NS: u64 = 200_000_000;
/// After a launch waited [`MAX_WAIT_NS`] in vain, its process takes no turns on that GPU
/// for this long (ns): a holder that never lets go costs the others one such wait, not one
/// per launch.
pub const DISTRUST_NS: u64 = 10_000_000_000;
/// Longest sleep between two looks at the board while waiting for a turn (ns).
pub const POLL_NS: u64 = 200_000;
/// A waiter looks again this long after the holder's queued work ends (when the holder,
/// launching again, may have given its turn up), ns.
pub const RELAUNCH_NS: u64 = 30_000;
/// Turns over this cycle are proportional to the shares (ns): no longer than the credit a
/// waiting vGPU can bank (`crate::compute::BURST_NS`), so that waiting for the others'
/// turns never costs a vGPU its share…
pub const CYCLE_NS: u64 = crate::compute::BURST_NS * 3 / 4;
/// …never shorter than this (ns)…
pub const MIN_TURN_NS: u64 = 1_000_000;
/// …and at most this (ns).
pub const DEFAULT_TURN_NS: u64 = CYCLE_NS;

/// A waiter that is this close to the moment it waits for (the previous holder's drain, the
/// end of a turn) stops sleeping and yields until then (ns): a sleep oversleeps by ~60–100
/// µs, and every hand-over would leave the GPU idle that long.
pub const SPIN_NS: u64 = 60_000;
/// The next holder launches this long after the previous holder's queued work should have
/// ended (ns): that end is computed from the launch's time and the kernels' measured
/// durations, and the kernel starts a few µs after the launch call began; a launch that
/// arrives before the GPU has drained costs a context switch (75 µs on an H100), one that
/// arrives this late costs this much idle.
pub const DRAIN_MARGIN_NS: u64 = 15_000;

/// A vGPU whose own work ended this long ago asks for a turn at once, without gathering
/// [`min_work_ns`] first (a latency-sensitive service's request after a rest), ns.
pub const REST_NS: u64 = 2_000_000;

/// The budget (GPU time, ns) a vGPU of share `share_ppm` gathers before it asks for a turn
/// when it does not hold one: a run worth a hand-over (at most 2 ms, and no more than ⅘ of
/// what it can bank, `crate::compute::BURST_NS` at its share).
pub fn min_work_ns(share_ppm: u64) -> u64 {
    let bankable = u128::from(crate::compute::BURST_NS) * u128::from(share_ppm.min(PPM)) / u128::from(PPM) * 4 / 5;
    (bankable as u64).min(2_000_000)
}

/// The bound on a turn `me` claims among `peers`: `limit_ns` (its `[compute] turn`, `vgpu
/// run --turn`; 0: none) while a vGPU of higher priority is active on the GPU, else
/// [`DEFAULT_TURN_NS`].
pub fn max_turn_ns(limit_ns: u64, me: &Me, peers: &[Peer]) -> u64 {
    if limit_ns != 0 && peers.iter().any(|p| p.priority > me.priority) {
        limit_ns.clamp(MIN_TURN_NS, DEFAULT_TURN_NS)
    } else {
        DEFAULT_TURN_NS
    }
}

/// The length of a turn claimed with `budget_ns` of GPU time in the bank: its share's part
/// of the cycle ([`turn_ns`]), or longer when it banked more while it waited (the others'
/// turns ran longer than theirs: they kept them while it gathered its budget), so that it
/// can spend what it banked and its share does not shrink with the cycle's stretch; bounded
/// by `max_turn_ns`. What it can bank is its share of `crate::compute::BURST_NS`, so the
/// others' credit covers their wait.
pub fn turn_with_budget_ns(share_ppm: u64, max_turn_ns: u64, budget_ns: u64) -> u64 {
    turn_ns(share_ppm, max_turn_ns).max(budget_ns.min(max_turn_ns.max(1)))
}

/// The length of a turn of a vGPU of share `share_ppm`, bounded by `max_turn_ns`.
pub fn turn_ns(share_ppm: u64, max_turn_ns: u64) -> u64 {
    let proportional = u128::from(CYCLE_NS) * u128::from(share_ppm.min(PPM)) / u128::from(PPM);
    (proportional as u64).max(MIN_TURN_NS).min(max_turn_ns.max(1))
}

/// Another active vGPU's turn state on the GPU: its slot's words, its priority from its
/// root-owned limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub priority: u32,
    /// Its name sorts before this vGPU's: ties between the two go to it.
    pub before_me: bool,
    pub turn_until_ns: u64,
    pub queued_until_ns: u64,
    pub waiting_since_ns: u64,
}

impl Peer {
    /// It holds the turn at `now`: claimed until later, and not idle.
    pub fn holds(&self, now: u64) -> bool {
        self.turn_until_ns > now && self.queued_until_ns.saturating_add(IDLE_GRACE_NS) >= now
    }

    /// It waits for a turn (and has not for so long that it must be gone: a waiter goes
    /// after [`MAX_WAIT_NS`], so an older mark is a dead process's).
    fn waiting(&self, now: u64) -> bool {
        self.waiting_since_ns != 0 && now.saturating_sub(self.waiting_since_ns) < 2 * MAX_WAIT_NS
    }
}

/// This vGPU's side: its priority and its own slot's words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Me {
    pub priority: u32,
    pub turn_until_ns: u64,
    pub waiting_since_ns: u64,
    pub queued_until_ns: u64,
}

/// What to do with a launch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Launch (it holds the turn).
    Go,
    /// Claim a turn, then decide again (the board may show a claim made at the same time).
    Claim,
    /// Give the turn up if it holds it, then look again at `until` (monotonic ns) at the
    /// latest.
    Wait { until: u64, release: bool },
}

/// The decision at a launch at `now` for `me` among `peers` (the other vGPUs on the GPU).
pub fn decide(me: &Me, peers: &[Peer], now: u64) -> Decision {
    let poll = now.saturating_add(POLL_NS);
    if me.turn_until_ns > now {
        // A newer claim of the same priority (a race), or a vGPU of higher priority that
        // waits or has cut in: the turn goes at this kernel boundary.
        let newer = peers.iter().any(|p| {
            p.priority == me.priority
                && p.holds(now)
                && (p.turn_until_ns > me.turn_until_ns || (p.turn_until_ns == me.turn_until_ns && p.before_me))
        });
        let outranked = peers.iter().any(|p| p.priority > me.priority && (p.waiting(now) || p.holds(now)));
        if newer || outranked {
            return Decision::Wait { until: now.saturating_add(POLL_NS / 4), release: true };
        }
        // A claim made while another vGPU's last launch was on its way: its work drains first.
        if let Some(q) = peers.iter().map(|p| drain_point(me, p)).filter(|&q| q > now).max() {
            return Decision::Wait { until: q.min(now.saturating_add(MAX_WAIT_NS)), release: false };
        }
        let above_active = peers.iter().any(|p| p.priority > me.priority);
        if above_active && me.queued_until_ns > now.saturating_add(QUEUE_AHEAD_NS) {
            return Decision::Wait { until: me.queued_until_ns - QUEUE_AHEAD_NS, release: false };
        }
        return Decision::Go;
    }
    // Another holds the turn: wait for it, unless it is of lower priority (it gives the turn
    // up at its next launch, and its short queue runs first).
    if let Some(h) = peers.iter().filter(|p| p.holds(now) && p.priority >= me.priority).min_by_key(|p| p.turn_until_ns) {
        let idle_at = h.queued_until_ns.saturating_add(IDLE_GRACE_NS).max(now + 1);
        // Just after its queued work ends: when it launches again it may give the turn up.
        let relaunch = if h.queued_until_ns > now { h.queued_until_ns + RELAUNCH_NS } else { poll };
        return Decision::Wait { until: poll.min(h.turn_until_ns).min(idle_at).min(relaunch), release: false };
    }
    let mine = if me.waiting_since_ns != 0 { me.waiting_since_ns } else { now };
    let ahead = peers.iter().any(|p| {
        p.waiting(now)
            && (p.priority > me.priority
                || (p.priority == me.priority
                    && (p.waiting_since_ns < mine || (p.waiting_since_ns == mine && p.before_me))))
    });
    if ahead {
        return Decision::Wait { until: poll, release: false };
    }
    let drained = peers.iter().map(|p| drain_point(me, p)).max().unwrap_or(0);
    if drained > now {
        return Decision::Wait { until: drained.min(now.saturating_add(MAX_WAIT_NS)), release: false };
    }
    Decision::Claim
}

/// What a switch between two vGPUs' contexts costs the GPU (ns): an H100's, as the
/// simulated driver's default `context_switch` is calibrated.
pub const SWITCH_NS: u64 = 75_000;

/// Where the work `me` queues once it claims a turn at `now` starts on the GPU: now, or
/// after what a vGPU of lower priority still has queued (it followed that work, see
/// [`decide`]) and a switch. Its own queue's end counts from there, so that the others
/// wait for its real drain.
pub fn queue_start(me: &Me, peers: &[Peer], now: u64) -> u64 {
    peers
        .iter()
        .filter(|p| p.priority < me.priority && p.queued_until_ns > now)
        .map(|p| p.queued_until_ns.saturating_add(SWITCH_NS))
        .fold(now, u64::max)
}

/// When `me`'s work may follow what `p` queued: once it has drained (and the margin has
/// passed), so that the GPU never holds two vGPUs' work and does not switch between them;
/// but a vGPU of higher priority follows a lower one's work at once (the lower one keeps
/// at most [`QUEUE_AHEAD_NS`] queued beside it): its kernel waits in the GPU's queue
/// rather than its program on the CPU, where a wake-up can come late, at the price of one
/// switch (which a launch after a wait for the last [`QUEUE_AHEAD_NS`] would pay as well).
fn drain_point(me: &Me, p: &Peer) -> u64 {
    if p.priority < me.priority {
        0
    } else {
        p.queued_until_ns.saturating_add(DRAIN_MARGIN_NS)
    }
}

/// Turns between the processes of **one** vGPU on a GPU (issue 27): two processes are two
/// CUDA contexts, and the GPU time-slices between them as between two vGPUs. The vGPU's
/// processes share one word of its board slot (`BoardSlot::process_turn`, all of them map
/// the slot read-write; nobody else writes it), and the slot's `queued_until_ns`, where
/// every process of the vGPU that takes part adds what it queues (`Board::queue`):
///
/// * `0`: nobody took part yet;
/// * [`alone`]`(id)`: process `id` launches alone; an unlimited one on its fast path,
///   without reading the clock (`vgpu-shim`: a load and a compare per launch);
/// * [`held`]`(id, next)`: process `id` holds the turn, `next` (0: none) waits for it.
///
/// The holder launches; at the end of its turn ([`TURN_NS`]) it hands the turn to `next`
/// if one waits, which launches once the holder's queued work has drained (the slot's
/// `queued_until_ns`, plus [`DRAIN_MARGIN_NS`]), so the GPU never has two of the vGPU's
/// contexts' work queued. A process that finds another holding registers as `next` (when
/// that is free) and waits; one that finds the word `0` or another's `alone` claims the
/// turn. A holder nobody waited for during [`QUIET_NS`] writes `alone(id)` again. A holder
/// whose queued work ended [`IDLE_NS`] ago (idle, or dead) has given its turn up: the
/// next takes it; and no launch waits more than [`MAX_WAIT_NS`] in all. Ids are random 15-bit
/// numbers per process: two processes with the same id only lose what turns save.
pub mod processes {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::{DRAIN_MARGIN_NS, MAX_WAIT_NS, POLL_NS};

    /// A process's turn within its vGPU's (ns): hand-overs every 10 ms cost ~0.5 % (a drain
    /// margin and a wake-up each), where the GPU's own time-slicing switches every 1 ms.
    pub const TURN_NS: u64 = 10_000_000;
    /// A holder that nobody waited for during this long launches alone again (ns).
    pub const QUIET_NS: u64 = 100_000_000;
    /// A holder whose queued work ended this long ago, and that launched nothing since, has
    /// given its turn up (ns), as between vGPUs. Where a holder's synchronize returns later
    /// than that (a host whose CPUs are oversubscribed), the turn goes at every kernel: 50 µs
    /// made two processes hand over at nearly every 1 ms kernel on the 2-CPU development
    /// machine under a load of 7, each hand-over costing the grace and a wake-up.
    pub const IDLE_NS: u64 = super::IDLE_GRACE_NS;
    /// After handing its turn over, a process waits this long before it asks to be next
    /// (ns): a third process that waits (and looks every [`POLL_NS`]) gets its go first.
    pub const DEFER_NS: u64 = 2 * POLL_NS;

    const ID_MASK: u32 = 0x7fff;
    const ALONE: u32 = 0x8000;
    const NEXT_SHIFT: u32 = 16;

    /// The word of process `id` launching alone.
    pub const fn alone(id: u32) -> u32 {
        (id & ID_MASK) | ALONE
    }

    /// The word of process `id` holding the turn, `next` waiting (0: none).
    pub const fn held(id: u32, next: u32) -> u32 {
        (id & ID_MASK) | ((next & ID_MASK) << NEXT_SHIFT)
    }

    /// A process id from `seed` (its pid and the time): 1..=0x7fff.
    pub fn id_from(seed: u64) -> u32 {
        let h = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        ((h >> 40) as u32 % ID_MASK) + 1
    }

    /// A process's own side (process memory, not shared).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Local {
        /// 1..=0x7fff.
        pub id: u32,
        /// Its turn ends then (monotonic ns); 0: it has not started one (handed the turn, it
        /// first waits for the drain).
        pub turn_until_ns: u64,
        /// Since when this launch waits (0: it does not).
        pub waiting_since_ns: u64,
        /// Last time another process waited for its turn, or took one.
        pub contended_ns: u64,
        /// It handed its turn over then: it asks to be next only [`DEFER_NS`] later.
        pub handed_ns: u64,
    }

    /// What to do with a launch.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Step {
        /// Launch. `alone`: the process launches alone now (an unlimited one may take its
        /// fast path again).
        Go { alone: bool },
        /// Launch, the last of its turn: once what it queues is published (the slot's
        /// `queued_until_ns`), hand the turn to the process waiting ([`hand_over`]), which
        /// launches when this launch's work has drained.
        GoLast,
        /// Look again at `until` (monotonic ns) at the latest.
        Wait { until: u64 },
    }

    /// The step of a launch at `now` of the process `me` in `word`, its vGPU's slot's
    /// `queued_until_ns` being `queued_until`. Changes the word by compare-and-swap only.
    pub fn step(word: &AtomicU32, me: &mut Local, queued_until: u64, now: u64) -> Step {
        let id = me.id & ID_MASK;
        for _ in 0..8 {
            let w = word.load(Ordering::Acquire);
            let holder = w & ID_MASK;
            let next = (w >> NEXT_SHIFT) & ID_MASK;
            if w == alone(id) {
                me.waiting_since_ns = 0;
                return Step::Go { alone: true };
            }
            if w == 0 || w & ALONE != 0 {
                // Nobody holds the turn: claim it. Another's `alone`: it launched without
                // turns (its queued work is not known); from now on it waits for them.
                if word.compare_exchange(w, held(id, 0), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    if w == 0 {
                        me.turn_until_ns = now.saturating_add(TURN_NS);
                        me.waiting_since_ns = 0;
                        return Step::Go { alone: false };
                    }
                    // What the other queued (if it published it) drains first.
                    me.turn_until_ns = 0;
                    me.contended_ns = now;
                    if me.waiting_since_ns == 0 {
                        me.waiting_since_ns = now;
                    }
                }
                continue;
            }
            if holder == id {
                if next != 0 {
                    me.contended_ns = now;
                }
                if me.turn_until_ns == 0 {
                    // Handed the turn: the previous holder's work drains first.
                    let drained = queued_until.saturating_add(DRAIN_MARGIN_NS);
                    if drained > now && now.saturating_sub(me.waiting_since_ns) < MAX_WAIT_NS {
                        return Step::Wait { until: drained };
                    }
                    me.turn_until_ns = now.saturating_add(TURN_NS);
                    me.waiting_since_ns = 0;
                    me.contended_ns = now;
                }
                if now < me.turn_until_ns {
                    return Step::Go { alone: false };
                }
                if next != 0 && next != id {
                    // Its turn is over and another waits: this is the last launch of it.
                    return Step::GoLast;
                }
                if now.saturating_sub(me.contended_ns) >= QUIET_NS {
                    if word.compare_exchange(w, alone(id), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        me.turn_until_ns = 0;
                        return Step::Go { alone: true };
                    }
                    continue;
                }
                me.turn_until_ns = now.saturating_add(TURN_NS);
                return Step::Go { alone: false };
            }
            // Another holds the turn.
            me.turn_until_ns = 0;
            if me.waiting_since_ns == 0 {
                me.waiting_since_ns = now;
            }
            me.contended_ns = now;
            let idle = queued_until.saturating_add(IDLE_NS) < now;
            if idle || now.saturating_sub(me.waiting_since_ns) >= MAX_WAIT_NS {
                // Its work ended a while ago and it launched nothing since (idle, or gone),
                // or this launch waited its most: take the turn (keeping whoever is next).
                let keep = if next == id { 0 } else { next };
                if word.compare_exchange(w, held(id, keep), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    me.turn_until_ns = now.saturating_add(TURN_NS);
                    me.waiting_since_ns = 0;
                    return Step::Go { alone: false };
                }
                continue;
            }
            if next == 0
                && now.saturating_sub(me.handed_ns) >= DEFER_NS
                && word.compare_exchange(w, held(holder, id), Ordering::AcqRel, Ordering::Acquire).is_err()
            {
                continue;
            }
            // Just after the holder's queued work ends: it may have handed the turn over with
            // its last launch (then this one goes at once), or launch again.
            let relaunch = if queued_until > now { queued_until + DRAIN_MARGIN_NS } else { queued_until.saturating_add(IDLE_NS + 1) };
            return Step::Wait { until: now.saturating_add(POLL_NS).min(relaunch.max(now + 1)) };
        }
        // The word kept changing under it: launch (a miss costs a switch, not correctness).
        Step::Go { alone: false }
    }

    /// After the last launch of its turn ([`Step::GoLast`]) and its publication: give the
    /// turn to the process waiting next (still its holder, with one waiting).
    pub fn hand_over(word: &AtomicU32, me: &mut Local, now: u64) {
        let id = me.id & ID_MASK;
        let w = word.load(Ordering::Acquire);
        let next = (w >> NEXT_SHIFT) & ID_MASK;
        if w & (ID_MASK | ALONE) != id || next == 0 || next == id {
            return;
        }
        if word.compare_exchange(w, held(next, 0), Ordering::AcqRel, Ordering::Acquire).is_ok() {
            me.turn_until_ns = 0;
            me.handed_ns = now;
            me.waiting_since_ns = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000;

    fn holder(until: u64, queued: u64) -> Peer {
        Peer { priority: 50, turn_until_ns: until, queued_until_ns: queued, ..Peer::default() }
    }

    fn waiter(priority: u32, since: u64) -> Peer {
        Peer { priority, waiting_since_ns: since, ..Peer::default() }
    }

    #[test]
    fn turn_lengths_follow_the_share_within_bounds() {
        assert_eq!(turn_ns(300_000, DEFAULT_TURN_NS), 4_500_000);
        assert_eq!(turn_ns(700_000, DEFAULT_TURN_NS), 10_500_000);
        assert_eq!(turn_ns(10_000, DEFAULT_TURN_NS), MIN_TURN_NS);
        assert_eq!(turn_ns(900_000, 5_000_000), 5_000_000);
    }

    #[test]
    fn the_turn_setting_bounds_a_turn_beside_a_higher_priority_only() {
        let me = Me { priority: 10, ..Me::default() };
        let above = Peer { priority: 90, ..Peer::default() };
        let beside = Peer { priority: 10, ..Peer::default() };
        assert_eq!(max_turn_ns(2_000_000, &me, &[beside, above]), 2_000_000);
        assert_eq!(turn_ns(800_000, max_turn_ns(2_000_000, &me, &[above])), 2_000_000);
        // Beside equals or lower only, or with no setting: the share's part of the cycle.
        assert_eq!(max_turn_ns(2_000_000, &me, &[beside]), DEFAULT_TURN_NS);
        assert_eq!(max_turn_ns(0, &me, &[above]), DEFAULT_TURN_NS);
        assert_eq!(turn_ns(800_000, max_turn_ns(0, &me, &[above])), 12_000_000);
        // Out of range in a file: clamped.
        assert_eq!(max_turn_ns(1, &me, &[above]), MIN_TURN_NS);
        assert_eq!(max_turn_ns(u64::MAX, &me, &[above]), DEFAULT_TURN_NS);
    }

    #[test]
    fn a_turn_covers_what_was_banked_within_the_bound() {
        // 30 %: 4.5 ms of the cycle, but 5.2 ms banked while the other kept its turn.
        assert_eq!(turn_with_budget_ns(300_000, DEFAULT_TURN_NS, 5_200_000), 5_200_000);
        assert_eq!(turn_with_budget_ns(300_000, DEFAULT_TURN_NS, 1_000_000), 4_500_000);
        assert_eq!(turn_with_budget_ns(900_000, DEFAULT_TURN_NS, 18_000_000), DEFAULT_TURN_NS);
        assert_eq!(turn_with_budget_ns(300_000, 2_000_000, 5_200_000), 2_000_000);
    }

    #[test]
    fn a_turn_is_asked_for_with_a_run_worth_a_hand_over() {
        assert_eq!(min_work_ns(700_000), 2_000_000);
        assert_eq!(min_work_ns(100_000), 1_600_000);
        assert_eq!(min_work_ns(10_000), 160_000);
    }

    #[test]
    fn alone_or_nobody_holding_and_nothing_queued_claims() {
        let me = Me { priority: 50, ..Me::default() };
        assert_eq!(decide(&me, &[], NOW), Decision::Claim);
        assert_eq!(decide(&me, &[holder(NOW - 1, NOW - 10 - DRAIN_MARGIN_NS)], NOW), Decision::Claim);
    }

    #[test]
    fn a_holder_goes_and_the_others_wait_for_it() {
        let me = Me { priority: 50, turn_until_ns: NOW + 5_000_000, ..Me::default() };
        assert_eq!(decide(&me, &[waiter(50, NOW - 100)], NOW), Decision::Go);
        // A launch of another that crossed its claim drains first.
        let crossed = Peer { queued_until_ns: NOW + 800, ..waiter(50, NOW - 100) };
        assert_eq!(decide(&me, &[crossed], NOW), Decision::Wait { until: NOW + 800 + DRAIN_MARGIN_NS, release: false });
        let other = Me { priority: 50, ..Me::default() };
        match decide(&other, &[holder(NOW + 5_000_000, NOW + 1_000_000)], NOW) {
            Decision::Wait { until, release: false } => assert_eq!(until, NOW + POLL_NS),
            d => panic!("{d:?}"),
        }
        // Its queued work ends sooner: look again just after (it may give the turn up then).
        match decide(&other, &[holder(NOW + 5_000_000, NOW + 50_000)], NOW) {
            Decision::Wait { until, release: false } => assert_eq!(until, NOW + 50_000 + RELAUNCH_NS),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn an_idle_holder_has_given_its_turn_up_and_the_next_waits_for_the_drain() {
        let me = Me { priority: 50, ..Me::default() };
        // Its work ended more than the grace ago: not holding; nothing queued: claim.
        let idle = holder(NOW + 5_000_000, NOW - IDLE_GRACE_NS - 1);
        assert_eq!(decide(&me, &[idle], NOW), Decision::Claim);
        // A released turn whose work still runs: wait exactly for its end.
        let draining = holder(0, NOW + 700_000);
        assert_eq!(decide(&me, &[draining], NOW), Decision::Wait { until: NOW + 700_000 + DRAIN_MARGIN_NS, release: false });
        // Just drained, within the margin: still waits (a launch that arrives before the
        // GPU drained pays a switch), until the margin has passed.
        let just = holder(0, NOW - 1);
        assert_eq!(decide(&me, &[just], NOW), Decision::Wait { until: NOW - 1 + DRAIN_MARGIN_NS, release: false });
    }

    #[test]
    fn waiters_go_by_priority_then_by_how_long_they_waited() {
        let me = Me { priority: 50, waiting_since_ns: NOW - 1000, ..Me::default() };
        assert!(matches!(decide(&me, &[waiter(60, NOW)], NOW), Decision::Wait { .. }));
        assert!(matches!(decide(&me, &[waiter(50, NOW - 2000)], NOW), Decision::Wait { .. }));
        assert_eq!(decide(&me, &[waiter(50, NOW - 500)], NOW), Decision::Claim);
        assert_eq!(decide(&me, &[waiter(40, NOW - 9000)], NOW), Decision::Claim);
        // A mark older than any wait can last is a dead process's.
        assert_eq!(decide(&me, &[waiter(60, NOW - 2 * MAX_WAIT_NS)], NOW), Decision::Claim);
    }

    #[test]
    fn a_higher_priority_waiter_cuts_the_turn_and_a_newer_claim_wins() {
        let me = Me { priority: 10, turn_until_ns: NOW + 5_000_000, ..Me::default() };
        assert!(matches!(decide(&me, &[waiter(90, NOW - 10)], NOW), Decision::Wait { release: true, .. }));
        // One of higher priority that cut in (it holds a turn now): the turn goes too.
        let cut_in = Peer { priority: 90, ..holder(NOW + 3_000_000, NOW + 2_000_000) };
        assert!(matches!(decide(&me, &[cut_in], NOW), Decision::Wait { release: true, .. }));
        // Between equals, the newer claim wins.
        let me = Me { priority: 50, ..me };
        let newer = holder(NOW + 6_000_000, NOW);
        assert!(matches!(decide(&me, &[newer], NOW), Decision::Wait { release: true, .. }));
        let older = holder(NOW + 4_000_000, NOW - DRAIN_MARGIN_NS);
        assert_eq!(decide(&me, &[older], NOW), Decision::Go);
        // A lower one's claim (a race: it gives the turn up at its next launch) does not cut it.
        let lower = Peer { priority: 10, ..holder(NOW + 6_000_000, NOW) };
        assert_eq!(decide(&me, &[lower], NOW), Decision::Go);
    }

    #[test]
    fn a_higher_priority_follows_a_lower_ones_short_queue_without_waiting_for_its_drain() {
        let me = Me { priority: 90, ..Me::default() };
        // The lower one holds its turn and keeps what it must beside it queued: claim now
        // (the kernel waits in the GPU's queue; the lower one yields at its next launch).
        let batch = Peer { priority: 10, ..holder(NOW + 5_000_000, NOW + QUEUE_AHEAD_NS) };
        assert_eq!(decide(&me, &[batch], NOW), Decision::Claim);
        // More than that queued (a long kernel): claimed at once too (waiting would not
        // start its kernel any sooner: it follows the lower one's work on the GPU anyway).
        let long = Peer { queued_until_ns: NOW + 1_000_000, ..batch };
        assert_eq!(decide(&me, &[long], NOW), Decision::Claim);
        // Holding already, likewise.
        let holding = Me { turn_until_ns: NOW + 2_000_000, ..me };
        assert_eq!(decide(&holding, &[batch], NOW), Decision::Go);
        // An equal waits for the holder, then for the whole drain.
        let equal = Me { priority: 10, ..Me::default() };
        assert!(matches!(decide(&equal, &[batch], NOW), Decision::Wait { release: false, .. }));
        let released = Peer { turn_until_ns: 0, ..batch };
        assert_eq!(
            decide(&equal, &[released], NOW),
            Decision::Wait { until: NOW + QUEUE_AHEAD_NS + DRAIN_MARGIN_NS, release: false }
        );
        // Its own queue counts from the end of the lower one's and a switch; an equal's
        // (drained before it claims) from now.
        assert_eq!(queue_start(&me, &[batch], NOW), NOW + QUEUE_AHEAD_NS + SWITCH_NS);
        assert_eq!(queue_start(&me, &[Peer { queued_until_ns: NOW - 1, ..batch }], NOW), NOW);
        assert_eq!(queue_start(&equal, &[batch], NOW), NOW);
    }

    #[test]
    fn beside_a_higher_priority_the_holder_queues_little_ahead() {
        let me = Me { priority: 10, turn_until_ns: NOW + 5_000_000, queued_until_ns: NOW + 1_000_000, ..Me::default() };
        let quiet = Peer { priority: 90, ..Peer::default() };
        assert_eq!(
            decide(&me, &[quiet], NOW),
            Decision::Wait { until: NOW + 1_000_000 - QUEUE_AHEAD_NS, release: false }
        );
        assert_eq!(decide(&Me { queued_until_ns: NOW + 100_000, ..me }, &[quiet], NOW), Decision::Go);
    }

    mod processes_turns {
        use super::super::processes::*;
        use super::super::{DRAIN_MARGIN_NS, MAX_WAIT_NS};
        use std::sync::atomic::{AtomicU32, Ordering};

        const T0: u64 = 1_000_000_000;

        fn local(id: u32) -> Local {
            Local { id, ..Local::default() }
        }

        #[test]
        fn ids_are_15_bit_and_never_zero() {
            for seed in [0u64, 1, 42, u64::MAX, 0x7fff, 1 << 40] {
                let id = id_from(seed);
                assert!((1..=0x7fff).contains(&id), "{id}");
            }
            assert_ne!(id_from(1), id_from(2));
        }

        #[test]
        fn one_process_claims_then_launches_alone_after_a_quiet_while() {
            let word = AtomicU32::new(0);
            let mut a = local(7);
            assert_eq!(step(&word, &mut a, 0, T0), Step::Go { alone: false });
            assert_eq!(word.load(Ordering::Relaxed), held(7, 0));
            assert_eq!(step(&word, &mut a, T0, T0 + TURN_NS / 2), Step::Go { alone: false });
            // Nobody waited: alone again at the end of its turn, and from then on.
            assert_eq!(step(&word, &mut a, T0, T0 + QUIET_NS), Step::Go { alone: true });
            assert_eq!(word.load(Ordering::Relaxed), alone(7));
            assert_eq!(step(&word, &mut a, T0, T0 + QUIET_NS + 1), Step::Go { alone: true });
        }

        #[test]
        fn two_processes_alternate_after_the_drain() {
            let word = AtomicU32::new(alone(7));
            let (mut a, mut b) = (local(7), local(9));
            // B comes: A's `alone` is claimed; what A queued (until T0 + 500 us) drains first.
            let q = T0 + 500_000;
            assert_eq!(step(&word, &mut b, q, T0), Step::Wait { until: q + DRAIN_MARGIN_NS });
            assert_eq!(word.load(Ordering::Relaxed), held(9, 0));
            assert_eq!(step(&word, &mut b, q, q + DRAIN_MARGIN_NS), Step::Go { alone: false });
            // A waits, and is next.
            let t = q + DRAIN_MARGIN_NS + 100_000;
            let bq = t + 1_000_000;
            assert!(matches!(step(&word, &mut a, bq, t), Step::Wait { .. }));
            assert_eq!(word.load(Ordering::Relaxed), held(9, 7));
            // B keeps its turn until it ends; its launch then is the last of it, and once
            // published it hands the turn to A, and waits itself.
            assert_eq!(step(&word, &mut b, bq, t + 1000), Step::Go { alone: false });
            let end = q + DRAIN_MARGIN_NS + TURN_NS;
            assert_eq!(step(&word, &mut b, bq, end), Step::GoLast);
            assert_eq!(word.load(Ordering::Relaxed), held(9, 7));
            hand_over(&word, &mut b, end);
            assert_eq!(word.load(Ordering::Relaxed), held(7, 0));
            let bq = end + 800_000;
            assert!(matches!(step(&word, &mut b, bq, end + 10), Step::Wait { .. }));
            // A launches once B's queued work drained, not before.
            assert_eq!(step(&word, &mut a, bq, end + 10), Step::Wait { until: bq + DRAIN_MARGIN_NS });
            assert_eq!(step(&word, &mut a, bq, bq + DRAIN_MARGIN_NS), Step::Go { alone: false });
            // B asks to be next only a little later (a third process would get in first).
            assert!(matches!(step(&word, &mut b, bq + 1_000_000, end + 100), Step::Wait { .. }));
            assert_eq!(word.load(Ordering::Relaxed), held(7, 0));
            assert!(matches!(step(&word, &mut b, bq + 1_000_000, end + DEFER_NS), Step::Wait { .. }));
            assert_eq!(word.load(Ordering::Relaxed), held(7, 9));
        }

        #[test]
        fn an_idle_or_dead_holder_loses_the_turn_and_no_wait_is_endless() {
            let word = AtomicU32::new(held(3, 0));
            let mut b = local(9);
            // Its queued work ended more than the grace ago: taken at once.
            assert!(matches!(step(&word, &mut b, T0 - IDLE_NS + 1, T0), Step::Wait { .. }));
            assert_eq!(step(&word, &mut b, T0 - IDLE_NS - 1, T0), Step::Go { alone: false });
            assert_eq!(word.load(Ordering::Relaxed), held(9, 0));
            // A holder that keeps its queue full but never hands over: taken after the most
            // a launch waits.
            let word = AtomicU32::new(held(3, 0));
            let mut c = local(11);
            let full = T0 + MAX_WAIT_NS + 10_000_000;
            assert!(matches!(step(&word, &mut c, full, T0), Step::Wait { .. }));
            assert!(matches!(step(&word, &mut c, full, T0 + MAX_WAIT_NS - 1), Step::Wait { .. }));
            assert_eq!(step(&word, &mut c, full, T0 + MAX_WAIT_NS), Step::Go { alone: false });
            assert_eq!(word.load(Ordering::Relaxed), held(11, 0));
        }
    }
}
