//! The compute governor's arithmetic, shared by the shim (which enforces it) and the CLI
//! (which shows it): the GPU-time budget of a vGPU on one device, as a generic cell-rate
//! algorithm (GCRA) on one shared atomic, and how a share becomes an allowance when vGPUs
//! compete for a GPU (policies, priority).
//!
//! A share `P` (parts per million of the GPU's time) means: over any window, the GPU time
//! charged to the vGPU is at most `P × window` plus one burst. Charging `t` ns of measured
//! GPU time moves the vGPU's theoretical arrival time (`tat`) by `t / P`; new work may be
//! queued while `tat + in_flight / P` is not in the future. A kernel longer than the window
//! therefore owes `t·(1−P)/P` of idle time after it, whatever its length.
//!
//! Everything here is lock-free and allocation-free.

use std::sync::atomic::Ordering;

use crate::layout::ComputeLedger;

/// Parts per million: shares and utilisations are integers in `0..=PPM`.
pub const PPM: u64 = 1_000_000;

/// Length of the measurement window `vgpu ps` reports (ns).
pub const WINDOW_NS: u64 = 1_000_000_000;

/// Credit an idle vGPU may bank, in wall-clock ns beyond the start of the work being
/// charged: absorbs the jitter between when work ran and when its events were harvested.
pub const BURST_NS: u64 = 20_000_000;

/// A measured share is shown while its window ended less than this long ago.
pub const SHARE_FRESH_NS: u64 = 3 * WINDOW_NS;

/// How a vGPU's share is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Policy {
    /// Never above the share (what a paying tenant expects).
    #[default]
    Strict,
    /// The share is a guaranteed floor; GPU time nobody else wants goes to the vGPUs that
    /// want more, in proportion to their shares (work-conserving).
    Fair,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::Strict, Policy::Fair];

    /// The code stored in the usage file and on the board.
    pub const fn code(self) -> u32 {
        match self {
            Policy::Strict => 0,
            Policy::Fair => 1,
        }
    }

    /// Unknown codes (a damaged or newer file) read as strict: never more than the share.
    pub const fn from_code(code: u32) -> Policy {
        match code {
            1 => Policy::Fair,
            _ => Policy::Strict,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Policy::Strict => "strict",
            Policy::Fair => "fair",
        }
    }

    pub fn parse(text: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == text)
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Percent → parts per million (100 % and above: [`PPM`]).
pub const fn pct_to_ppm(pct: u32) -> u64 {
    if pct >= 100 {
        PPM
    } else {
        pct as u64 * (PPM / 100)
    }
}

/// Wall-clock time that `gpu_ns` of GPU time costs at `share_ppm` (`gpu_ns / P`).
#[inline]
pub fn wall_cost_ns(gpu_ns: u64, share_ppm: u64) -> u64 {
    let share = share_ppm.clamp(1, PPM);
    ((u128::from(gpu_ns) * u128::from(PPM)) / u128::from(share)).min(u128::from(u64::MAX)) as u64
}

/// The new theoretical arrival time after charging `cost_ns` measured at `now` (pure).
/// The work being charged started no earlier than `now − cost_ns`; credit older than that
/// by more than [`BURST_NS`] is forfeit (an idle vGPU does not bank unlimited time).
#[inline]
pub fn next_tat(tat: u64, cost_ns: u64, share_ppm: u64, now: u64) -> u64 {
    let floor = now.saturating_sub(cost_ns).saturating_sub(BURST_NS);
    tat.max(floor).saturating_add(wall_cost_ns(cost_ns, share_ppm))
}

/// How long work of `pending_ns` estimated GPU time (what the caller has queued and not
/// yet had measured, plus the launch it asks about) must wait at `now` (pure; 0 = go).
#[inline]
pub fn wait_ns(tat: u64, pending_ns: u64, share_ppm: u64, now: u64) -> u64 {
    tat.saturating_add(wall_cost_ns(pending_ns, share_ppm)).saturating_sub(now)
}

/// Charge `cost_ns` of measured GPU time to `ledger` at share `share_ppm` (lock-free; any
/// number of processes at once). Also rolls the `ps` measurement window.
pub fn charge(ledger: &ComputeLedger, cost_ns: u64, share_ppm: u64, now: u64) {
    let _ = ledger.tat_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
        Some(next_tat(tat, cost_ns, share_ppm, now))
    });
    ledger.charged_ns.fetch_add(cost_ns, Ordering::Relaxed);
    roll_window(ledger, now);
    ledger.window_charged_ns.fetch_add(cost_ns, Ordering::Relaxed);
}

/// End the measurement window if it is over (one process wins the swap and publishes).
pub fn roll_window(ledger: &ComputeLedger, now: u64) {
    let start = ledger.window_start_ns.load(Ordering::Acquire);
    if start == 0 {
        let _ = ledger
            .window_start_ns
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        return;
    }
    let length = now.saturating_sub(start);
    if length < WINDOW_NS {
        return;
    }
    if ledger
        .window_start_ns
        .compare_exchange(start, now, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        let charged = ledger.window_charged_ns.swap(0, Ordering::AcqRel);
        let share = (u128::from(charged) * u128::from(PPM) / u128::from(length.max(1))) as u64;
        ledger.last_share_ppm.store(share, Ordering::Relaxed);
        ledger.last_window_end_ns.store(now, Ordering::Release);
    }
}

/// The share the vGPU used in its last window, if that window ended recently.
pub fn recent_share_ppm(ledger: &ComputeLedger, now: u64) -> Option<u64> {
    let end = ledger.last_window_end_ns.load(Ordering::Acquire);
    (end != 0 && now.saturating_sub(end) <= SHARE_FRESH_NS).then(|| ledger.last_share_ppm.load(Ordering::Relaxed))
}

/// What one vGPU on a GPU's board shows the others (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Competitor {
    pub share_ppm: u64,
    pub priority: u32,
    pub policy: Policy,
    /// It had to wait for its budget recently: it wants more than it gets.
    pub hungry: bool,
    /// Its recent use of the GPU, ppm; [`USAGE_UNKNOWN`] before its first window closed
    /// (then it counts as using its whole share).
    pub usage_ppm: u64,
}

/// `Competitor::usage_ppm` of a vGPU that has not measured a whole window yet.
pub const USAGE_UNKNOWN: u64 = u64::MAX;

/// Least allowance a vGPU keeps when higher priorities take the GPU: 1/20 of its share
/// (nobody starves).
pub const STARVATION_FLOOR_DIVISOR: u64 = 20;

/// The allowance (ppm of the GPU's time) of `me` given every active vGPU on the GPU
/// (`all` includes `me` at index `me`). Pure.
///
/// 1. Oversubscription (shares sum above the GPU): vGPUs are served in priority order;
///    each gets its share or what the higher priorities left, whichever is smaller, but
///    never less than 1/[`STARVATION_FLOOR_DIVISOR`] of its share.
/// 2. `fair`: while `me` is hungry, GPU time the others leave is added to its grant, in
///    proportion to the grants of the hungry `fair` vGPUs. An active vGPU leaves nothing of
///    its grant (it may be held below it by the GPU's queue rather than by its budget)
///    unless it uses less than a quarter of it; then it keeps twice what it uses.
/// 3. `strict` never goes above the share.
pub fn allowance_ppm(all: &[Competitor], me: usize) -> u64 {
    let Some(mine) = all.get(me) else { return PPM };
    let grant = |i: usize| -> u64 {
        let c = &all[i];
        let total: u64 = all.iter().map(|o| o.share_ppm.min(PPM)).sum();
        if total <= PPM {
            return c.share_ppm.min(PPM);
        }
        // Served by priority: higher first; equal priorities split what is left by share.
        let higher: u64 = all
            .iter()
            .filter(|o| o.priority > c.priority)
            .map(|o| o.share_ppm.min(o.usage_ppm.max(if o.hungry { o.share_ppm } else { 0 })).min(PPM))
            .sum();
        let left = PPM.saturating_sub(higher);
        let equal: u64 = all
            .iter()
            .filter(|o| o.priority == c.priority)
            .map(|o| o.share_ppm.min(PPM))
            .sum::<u64>()
            .max(1);
        let portion = if equal <= left {
            c.share_ppm.min(PPM)
        } else {
            (u128::from(left) * u128::from(c.share_ppm.min(PPM)) / u128::from(equal)) as u64
        };
        portion.max(c.share_ppm / STARVATION_FLOOR_DIVISOR).max(1)
    };
    let my_grant = grant(me);
    if mine.policy == Policy::Strict || !mine.hungry {
        return my_grant;
    }
    // What the others hold on to: an active vGPU keeps its grant (it may be held below it
    // by the GPU's own queueing, not by its budget, and a floor is a floor), unless it uses
    // less than a quarter of it (then twice what it uses).
    let mut used = 0u64;
    let mut hungry_fair = 0u64;
    for (i, c) in all.iter().enumerate() {
        let g = grant(i);
        if c.hungry && c.policy == Policy::Fair {
            hungry_fair += g;
        }
        let light = !c.hungry && c.usage_ppm.saturating_mul(4) < g;
        used += if light { g.min(c.usage_ppm.saturating_mul(2)) } else { g };
    }
    let spare = PPM.saturating_sub(used);
    let extra = (u128::from(spare) * u128::from(my_grant) / u128::from(hungry_fair.max(1))) as u64;
    (my_grant + extra).min(PPM)
}

#[cfg(test)]
mod tests;
