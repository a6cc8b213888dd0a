//! The compute governor: every kernel launch path calls [`launch`] (or [`launch_many`]) with
//! what it is about to queue. Without a compute limit that is one load of the mode and one
//! of the share per device, then the driver call. With a limit:
//!
//! 1. **Capture passes through**: a launch into a stream being captured only adds a node
//!    to the graph being built; nothing is inserted and nothing is charged (the graph's
//!    launch is governed).
//! 2. **Harvest**: the CUDA events recorded after earlier launches that have completed are
//!    read (never waited for), and the GPU time between a launch's start event (or the end
//!    of the launch before it on the same stream, when the stream was busy) and its end
//!    event is charged to the vGPU's ledger in the shared usage file
//!    ([`vgpu_abi::compute::charge`]) and to this process's record.
//! 3. **Admission**: the launch waits (the thread sleeps, never spins) until the vGPU's
//!    ledger plus this process's unmeasured work in flight (estimated from what each kernel
//!    and grid measured before) fit the budget ([`vgpu_abi::compute::wait_ns`]); at most [`MAX_IN_FLIGHT`] launches
//!    of a process are unmeasured at once.
//! 4. **Measure**: the driver is called once; an end event is recorded after the launch
//!    on its stream (and a start event before it, when the stream was idle). Once a kernel
//!    and grid's exclusive time is well established, only one launch in [`SAMPLE_EVERY`]
//!    is measured; the others are charged that time as they are queued.
//!
//! **Contention.** When several contexts share a GPU, the GPU time-slices between them and
//! the events around one context's kernel also span the other contexts' slices (measured on
//! an H100: two processes of 8192² bf16 matmuls, 1.63 ms each alone, 2.96 ms between
//! events when both run). Charging that would hold every tenant far below its share. So
//! each kernel and grid has a learned exclusive duration (the GPU runs a given grid of a
//! given kernel in about the same time whenever it has the GPU to itself), and a
//! measurement far above it is charged the learned duration instead (see `learn`).
//!
//! Under contention NVML's per-process utilization corrects what slips through on average
//! (`meter`).
//!
//! **Allowance.** A vGPU's share applies as is in `strict` mode while the GPU is not
//! oversubscribed. Otherwise (a `fair` vGPU, or shares on the GPU summing above 100 %),
//! the GPU's board ([`vgpu_abi::board`]) tells what the other vGPUs want and use, and
//! [`vgpu_abi::compute::allowance_ppm`] turns the share into an allowance.

use std::collections::HashMap;
use std::ffi::c_uint;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

use vgpu_abi::board::{Board, MAX_COMPETITORS};
use vgpu_abi::compute::{self as arith, Competitor, Policy, PPM};
use vgpu_abi::layout::{now_mono_ns, MAX_DEVICES};
use vgpu_abi::turn;

use super::devices::{self, Target};
use crate::ffi::*;
use crate::log::vgpu_log_once;
use crate::real;
use crate::spinlock::SpinLock;
use crate::state::{self, Mode, Vgpu};

/// What a launch queues, for the governor's estimate of its GPU time.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// A kernel grid: `blocks` thread blocks of `threads` threads each.
    Kernel { function: CUfunction, blocks: u64, threads: u64 },
    /// A cooperative kernel grid (all blocks resident at once).
    Cooperative { function: CUfunction, blocks: u64, threads: u64 },
    /// An instantiated graph.
    Graph { exec: CUgraphExec },
}

impl Work {
    /// Blocks and threads per block of a launch shape (saturating; zeros stay zero: the driver
    /// rejects such a launch itself).
    pub fn grid(grid: [c_uint; 3], block: [c_uint; 3]) -> (u64, u64) {
        let product = |v: [c_uint; 3]| v.iter().fold(1u64, |acc, &x| acc.saturating_mul(u64::from(x)));
        (product(grid), product(block))
    }

    /// The key under which its exclusive duration is learned: the kernel (or graph) and
    /// its grid.
    fn key(&self) -> u64 {
        let (a, b, c) = match *self {
            Work::Kernel { function, blocks, threads } => (function as u64, blocks, threads),
            Work::Cooperative { function, blocks, threads } => (function as u64, blocks, threads ^ 0x5a5a),
            Work::Graph { exec } => (exec as u64, 0, 0xffff_ffff),
        };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in [a, b, c] {
            h ^= v;
            h = h.wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
        }
        h
    }
}

/// Most launches of one process whose GPU time is not measured yet.
pub const MAX_IN_FLIGHT: usize = 256;
/// Longest single sleep of a waiting launch before it looks at the ledger again.
const MAX_SLEEP_NS: u64 = 2_000_000;
/// How often a process publishes on the GPU's board and re-reads the other vGPUs' slots.
const BOARD_REFRESH_NS: u64 = 20_000_000;
/// A launch found this late (ns) moves the vGPU's published queue end (`Governor::harvest`).
const LATE_NS: u64 = 50_000;
/// Taking turns, a launch of unknown duration looks again this often (ns) for the work in
/// flight to be measured (`Governor::turn`)…
const UNKNOWN_POLL_NS: u64 = 20_000;
/// …for at most this long (ns): a long first kernel does not hold the next one back (what
/// it queued unseen is found late at a harvest, `Governor::harvest`).
const UNKNOWN_WAIT_NS: u64 = 2_000_000;
/// A vGPU that waited for its budget counts as wanting more for this long.
const HUNGRY_NS: u64 = 300_000_000;
/// A kernel and grid measured this often is charged its learned time between measurements…
const SETTLED_SAMPLES: u32 = 16;
/// …and measured once every this many launches.
const SAMPLE_EVERY: u32 = 8;
/// A measurement at most this much (percent) of the learned exclusive duration ran alone.
const BAND_PCT: u64 = 115;
/// Weight (1/AVERAGE) of a lone measurement in the learned exclusive duration.
const AVERAGE: u64 = 8;
/// With no lone measurement for [`RISE_AFTER_NS`], the learned exclusive duration rises by
/// 1/RISE at most every [`RISE_EVERY_NS`] (about ×1.4 a second): a kernel that really got
/// slower is followed; contention, which leaves lone measurements now and then, is not.
const RISE: u64 = 32;
const RISE_AFTER_NS: u64 = 1_000_000_000;
const RISE_EVERY_NS: u64 = 100_000_000;
/// Events kept for reuse per context.
const EVENT_POOL: usize = 2 * MAX_IN_FLIGHT;

/// Govern one launch of `work` into `stream` in `mode` (the hook's `config::mode()`); `call`
/// performs the driver call (exactly once).
#[inline(always)]
pub fn launch(mode: Mode, stream: CUstream, work: Work, call: impl FnOnce() -> CuResult) -> CuResult {
    match mode {
        Mode::Enforce(vgpu) if any_limited(vgpu) || !processes_alone(vgpu) => launch_limited(vgpu, &[(stream, work)], call),
        _ => call(),
    }
}

/// Govern a launch that queues work into several streams at once
/// (`cuLaunchCooperativeKernelMultiDevice`) in `mode`; `call` performs the driver call exactly
/// once.
#[inline(always)]
pub fn launch_many(mode: Mode, items: &[(CUstream, Work)], call: impl FnOnce() -> CuResult) -> CuResult {
    match mode {
        Mode::Enforce(vgpu) if any_limited(vgpu) || !processes_alone(vgpu) => launch_limited(vgpu, items, call),
        _ => call(),
    }
}

/// Nothing to govern for a launch now in `mode`: no vGPU, or no compute limit on any of its
/// devices. The launch exports check this before anything else (`fast if` in `governed.rs`,
/// through `hooks::launch::unlimited`).
#[inline(always)]
pub fn unlimited(mode: Mode) -> bool {
    match mode {
        Mode::Enforce(vgpu) => !any_limited(vgpu) && processes_alone(vgpu),
        _ => true,
    }
}

// ---- turns between the processes of one vGPU -----------------------------------------------

/// This process has looked for its vGPU's process-turn words (`turn::processes`).
static PROCESS_TURNS_READY: AtomicBool = AtomicBool::new(false);
/// Per device: the vGPU's process-turn word in its board slot (null: none, or turns off).
static PROCESS_TURN_WORD: [AtomicPtr<AtomicU32>; MAX_DEVICES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];
/// Per device: the word's value while this process launches alone there (`alone(id)`), or
/// `NOT_ALONE` (bit 31 is never set in a word).
static PROCESS_TURN_ALONE: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(NOT_ALONE) }; MAX_DEVICES];
const NOT_ALONE: u32 = u32::MAX;

/// An unlimited launch needs no turns: this process launches alone on each device of the
/// vGPU (its word says `alone(id)`, or there is no word). A load and a compare per device;
/// before the process looked for its words (its first launch), no.
#[inline(always)]
fn processes_alone(vgpu: &Vgpu) -> bool {
    if !PROCESS_TURNS_READY.load(Ordering::Acquire) {
        return false;
    }
    (0..vgpu.usage.device_count().min(MAX_DEVICES)).all(|d| {
        let word = PROCESS_TURN_WORD[d].load(Ordering::Relaxed);
        // SAFETY: a non-null pointer here points into a board mapping the governor owns and
        // never unmaps (the governor is leaked, never freed).
        word.is_null() || unsafe { (*word).load(Ordering::Relaxed) } == PROCESS_TURN_ALONE[d].load(Ordering::Relaxed)
    })
}

/// Whether this process takes turns with the vGPU's other processes on `device` now.
fn processes_take_turns(device: usize) -> bool {
    let word = PROCESS_TURN_WORD[device].load(Ordering::Relaxed);
    // SAFETY: as in `processes_alone`.
    !word.is_null() && unsafe { (*word).load(Ordering::Relaxed) } != PROCESS_TURN_ALONE[device].load(Ordering::Relaxed)
}

/// Whether any device of the vGPU has a compute limit now (shares change live).
#[inline(always)]
fn any_limited(vgpu: &Vgpu) -> bool {
    vgpu.usage.any_compute_limited()
}

#[inline(never)]
fn launch_limited(vgpu: &'static Vgpu, items: &[(CUstream, Work)], call: impl FnOnce() -> CuResult) -> CuResult {
    // The governor's own failures never stop the program: a panic before the driver call
    // means "launch ungoverned", one after it is swallowed (the driver's answer stands).
    let tickets = catch_unwind(AssertUnwindSafe(|| prepare(vgpu, items))).unwrap_or_else(|_| {
        vgpu_log_once!("internal error in the compute governor; this launch is not governed");
        Tickets::default()
    });
    let rc = call();
    if tickets.count > 0 {
        let _ = catch_unwind(AssertUnwindSafe(|| finish(vgpu, &tickets, rc)));
    }
    rc
}

/// What [`prepare`] decided for each item of a launch.
#[derive(Default)]
struct Tickets {
    count: usize,
    items: [Option<Ticket>; 4],
}

#[derive(Clone, Copy)]
struct Ticket {
    ctx: CUcontext,
    stream: CUstream,
    device: usize,
    key: u64,
    estimate: u64,
    /// Recorded before the launch (the stream was idle), or `None` to chain from the end of
    /// the launch before it on the same stream.
    start: Option<CUevent>,
    /// Measure it with events; otherwise it is charged its learned exclusive time.
    measure: bool,
    /// When the vGPU's queue on the GPU was published to end once this launch was queued
    /// (monotonic ns; 0: not published).
    queued_until: u64,
}

// ---- per-process state ------------------------------------------------------------------

/// One launch whose GPU time is not yet measured.
struct Pending {
    device: usize,
    key: u64,
    estimate: u64,
    start: Option<CUevent>,
    end: CUevent,
    /// It should have ended by then ([`Ticket::queued_until`], moved on as it is found late).
    queued_until: u64,
}

/// A stream's launches in flight, in launch order.
#[derive(Default)]
struct StreamState {
    pending: std::collections::VecDeque<Pending>,
    /// End event of the last launch harvested on this stream, kept while the launch after
    /// it may chain from it.
    last_end: Option<CUevent>,
    /// End event of the last launch queued on this stream.
    tail_end: Option<CUevent>,
    /// Launches charged by estimate were queued after `tail_end`: the next measured launch
    /// must not chain from it (its span would include them).
    unmeasured_after_tail: bool,
}

/// A context's event pool and streams.
#[derive(Default)]
struct ContextState {
    free_events: Vec<CUevent>,
    streams: HashMap<u64, StreamState>,
}

/// What has been learned about one kernel and grid.
#[derive(Clone, Copy)]
struct Learned {
    /// Exclusive duration, ns.
    exclusive_ns: u64,
    samples: u32,
    /// Launches charged by estimate since the last measured one.
    since_measured: u32,
    /// Last lone (in-band) measurement, and last rise of the estimate (monotonic ns).
    last_lone_ns: u64,
    last_rise_ns: u64,
}

/// One device's view of the GPU's board.
struct BoardView {
    board: Option<Board>,
    next_refresh_ns: u64,
    next_open_ns: u64,
    allowance_ppm: u64,
    hungry_until_ns: u64,
    /// Other vGPUs were active on the GPU at the last refresh, or one of higher priority was
    /// on it (resting or not): take turns.
    peers_active: bool,
    /// A launch waited `turn::MAX_WAIT_NS` for turns (a holder that never lets go, dead or
    /// lying): no turns on this GPU until then (monotonic ns).
    turns_off_until_ns: u64,
}

impl BoardView {
    const fn new() -> BoardView {
        BoardView {
            board: None,
            next_refresh_ns: 0,
            next_open_ns: 0,
            allowance_ppm: PPM,
            hungry_until_ns: 0,
            peers_active: false,
            turns_off_until_ns: 0,
        }
    }
}

struct Governor {
    contexts: HashMap<u64, ContextState>,
    learned: HashMap<u64, Learned>,
    /// Unmeasured launches and their estimated GPU time, per device.
    in_flight: usize,
    in_flight_ns: [u64; MAX_DEVICES],
    /// Average measured GPU time per launch: the estimate of a launch never seen before.
    average_ns: u64,
    boards: Vec<BoardView>,
    /// Per device: turns between the vGPU's processes (`turn::processes`), if it has a slot.
    process_turns: Vec<Option<ProcessTurns>>,
}

/// This process's side of the turns between its vGPU's processes on one device.
struct ProcessTurns {
    /// Its own mapping of the vGPU's slot (the word's pointer in `PROCESS_TURN_WORD` points
    /// into it; never dropped).
    board: Board,
    local: turn::processes::Local,
    /// The launch being admitted is the last of its turn: once queued, hand the turn over.
    last_of_turn: bool,
}

static GOVERNOR: AtomicPtr<SpinLock<Governor>> = AtomicPtr::new(std::ptr::null_mut());

fn governor() -> &'static SpinLock<Governor> {
    let p = GOVERNOR.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: GOVERNOR only ever holds leaked, never-freed boxes.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(SpinLock::new(Governor {
        contexts: HashMap::new(),
        learned: HashMap::new(),
        in_flight: 0,
        in_flight_ns: [0; MAX_DEVICES],
        average_ns: 0,
        boards: (0..MAX_DEVICES).map(|_| BoardView::new()).collect(),
        process_turns: (0..MAX_DEVICES).map(|_| None).collect(),
    })));
    match GOVERNOR.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just leaked.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` was never shared; the winner is a leaked box.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            unsafe { &*winner }
        }
    }
}

/// Fork child: the parent's events and streams mean nothing here (CUDA must be initialised
/// again); start afresh. The parent's state is leaked, not freed (another thread of the
/// parent may have held its lock at the fork).
pub fn reset_in_child() {
    GOVERNOR.store(std::ptr::null_mut(), Ordering::Release);
    PROCESS_TURNS_READY.store(false, Ordering::Release);
    for d in 0..MAX_DEVICES {
        PROCESS_TURN_WORD[d].store(std::ptr::null_mut(), Ordering::Release);
        PROCESS_TURN_ALONE[d].store(NOT_ALONE, Ordering::Release);
    }
    super::meter::reset_in_child();
}

/// Keep `e` in a context's pool for reuse, or destroy it when the pool is full.
fn give_back(pool: &mut Vec<CUevent>, e: CUevent) {
    if pool.len() < EVENT_POOL {
        pool.push(e);
    } else {
        // SAFETY: an event this governor created and no longer uses.
        unsafe { real::cuEventDestroy_v2(e) };
    }
}

// ---- the launch ---------------------------------------------------------------------------

fn prepare(vgpu: &'static Vgpu, items: &[(CUstream, Work)]) -> Tickets {
    let mut tickets = Tickets::default();
    if !PROCESS_TURNS_READY.load(Ordering::Acquire) {
        governor().lock().find_process_turns(vgpu);
    }
    for &(stream, work) in items.iter().take(tickets.items.len()) {
        if capturing(stream) {
            continue;
        }
        let device = match devices::current(vgpu) {
            Ok(Target::Device(d)) => d,
            _ => continue,
        };
        let base = arith::pct_to_ppm(vgpu.usage.compute_pct(device));
        // Unlimited: governed only to take turns with the vGPU's other processes (its work
        // measured for the hand-overs, never held to a budget).
        let unlimited = base >= PPM;
        if unlimited && !processes_take_turns(device) {
            continue;
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { real::cuCtxGetCurrent(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
            continue;
        }
        if !unlimited {
            super::meter::ensure_started(vgpu);
        }
        if let Some(ticket) = admit(vgpu, ctx, stream, device, work, unlimited) {
            tickets.items[tickets.count] = Some(ticket);
            tickets.count += 1;
        }
    }
    tickets
}

/// Whether `stream` is being captured into a graph (then the launch only builds the graph).
fn capturing(stream: CUstream) -> bool {
    let mut status: c_uint = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a valid out-pointer; the stream is the program's own argument.
    let rc = unsafe { real::cuStreamIsCapturing(stream, &mut status) };
    rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// Wait until the launch fits the budget, then take its start event. `None`: do not
/// govern it (no event could be had).
fn admit(vgpu: &'static Vgpu, ctx: CUcontext, stream: CUstream, device: usize, work: Work, unlimited: bool) -> Option<Ticket> {
    let key = work.key();
    let ledger = vgpu.usage.ledger(device);
    let mut waited_ns = 0u64;
    let mut turn_waited_ns = 0u64;
    let mut process_waited_ns = 0u64;
    let lock = governor();
    loop {
        let mut g = lock.lock();
        let now = now_mono_ns();
        // An unlimited vGPU neither publishes on the board (the others' allowances do not
        // count it) nor waits for a budget or for the other vGPUs' turns.
        let allowance = if unlimited { PPM } else { g.allowance(vgpu, device, now) };
        g.harvest(vgpu, now);
        let estimate = g.estimate(key);
        // The launch itself is paid when it is measured; what must fit now is the ledger
        // plus this process's earlier work that is queued and not yet measured.
        let mut wait = if unlimited { 0 } else { arith::wait_ns(ledger.tat_ns.load(Ordering::Acquire), g.in_flight_ns[device], allowance, now) };
        if g.in_flight >= MAX_IN_FLIGHT {
            wait = wait.max(50_000);
        }
        // Turns between the vGPU's own processes: one of them has work on the GPU at a time.
        let process_turn = if wait == 0 { g.process_turn(device, now) } else { None };
        if let Some(until) = process_turn {
            drop(g);
            let slept = nap_until(until, now);
            process_waited_ns = process_waited_ns.saturating_add(slept);
            continue;
        }
        if wait == 0 && !unlimited {
            // Taking turns, a vGPU without the turn asks for one only with budget for a
            // turn's worth of work (`turn::min_work_ns`): hand-overs stay rare, and a lower
            // priority beside it gets runs long enough to use its share.
            wait = g.turn_budget_wait(vgpu, device, now, allowance);
        }
        // Turns: only with other vGPUs active on the GPU; out of budget, the turn goes.
        let turn = if unlimited {
            None
        } else if wait == 0 {
            g.turn(vgpu, device, now, turn_waited_ns, estimate == 0)
        } else {
            g.release_turn(device);
            None
        };
        if let Some(until) = turn {
            drop(g);
            turn_waited_ns = turn_waited_ns.saturating_add(nap_until(until, now));
            continue;
        }
        if wait == 0 {
            if waited_ns > 0 {
                ledger.throttled_ns.fetch_add(waited_ns, Ordering::Relaxed);
                ledger.throttled_launches.fetch_add(1, Ordering::Relaxed);
            }
            if turn_waited_ns + process_waited_ns > 0 {
                vgpu.usage.turn_counters(device)[1].fetch_add(turn_waited_ns + process_waited_ns, Ordering::Relaxed);
            }
            // What it queues, for the hand-overs of turns (between vGPUs, between its
            // processes); published even alone: a vGPU that arrives, or wakes, finds how
            // long the GPU stays busy with this one's work.
            let mut queued_until = 0;
            if let Some(pt) = g.process_turns[device].as_mut() {
                queued_until = pt.board.queue(estimate, now);
                if std::mem::take(&mut pt.last_of_turn) {
                    turn::processes::hand_over(pt.board.process_turn(), &mut pt.local, now);
                }
            } else if let Some(board) = g.boards[device].board.as_ref() {
                queued_until = board.queue(estimate, now);
            }
            if let Some(board) = g.boards[device].board.as_ref().filter(|_| g.boards[device].peers_active) {
                // The launch after this one (once this one ran) would have to wait for the
                // budget: this is the last of the turn; the next vGPU waits for its drain.
                let in_flight = g.in_flight_ns[device].saturating_add(estimate.saturating_mul(2));
                if arith::wait_ns(ledger.tat_ns.load(Ordering::Acquire), in_flight, allowance, now.saturating_add(estimate)) > 0 {
                    board.release_turn();
                }
            }
            let measure = g.should_measure(key, now);
            let start = if measure {
                let start = g.start_event(ctx, stream)?;
                g.in_flight += 1;
                g.in_flight_ns[device] = g.in_flight_ns[device].saturating_add(estimate);
                start
            } else {
                None
            };
            return Some(Ticket {
                ctx,
                stream,
                device,
                key,
                estimate,
                start,
                measure,
                queued_until,
            });
        }
        g.boards[device].hungry_until_ns = now + HUNGRY_NS;
        drop(g);
        let nap = wait.min(MAX_SLEEP_NS);
        std::thread::sleep(Duration::from_nanos(nap));
        waited_ns = waited_ns.saturating_add(nap);
    }
}

/// Sleep until about `until` (monotonic ns; it is `now`): close to it, yield rather than
/// oversleep it (every hand-over would leave the GPU idle that long). Returns the time spent.
fn nap_until(until: u64, now: u64) -> u64 {
    let left = until.saturating_sub(now);
    if left <= turn::SPIN_NS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_nanos((left - turn::SPIN_NS).min(turn::POLL_NS.max(MAX_SLEEP_NS))));
    }
    now_mono_ns().saturating_sub(now)
}

/// Whether vGPUs take turns (`VGPU_TURNS=off` in the shim's environment turns them off: the
/// benchmarks' and tests' "before", the GPU's own time-slicing alone).
fn turns_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("VGPU_TURNS").is_none_or(|v| v != "off"))
}

/// After the driver call: record the end event, or give the reservation back.
fn finish(vgpu: &'static Vgpu, tickets: &Tickets, rc: CuResult) {
    let mut g = governor().lock();
    for t in tickets.items.iter().take(tickets.count).flatten() {
        if !t.measure {
            if rc == CUDA_SUCCESS {
                g.stream(t.ctx, t.stream).unmeasured_after_tail = true;
                g.charge(vgpu, t.device, super::meter::correct(t.device, t.estimate), now_mono_ns());
            }
            continue;
        }
        if rc != CUDA_SUCCESS {
            g.cancel(t);
            continue;
        }
        let Some(end) = g.event(t.ctx) else {
            g.cancel(t);
            continue;
        };
        // SAFETY: an event of this context and the program's stream, right after its launch.
        if unsafe { real::cuEventRecord(end, t.stream) } != CUDA_SUCCESS {
            g.recycle(t.ctx, end);
            g.cancel(t);
            continue;
        }
        let stream = g.stream(t.ctx, t.stream);
        stream.tail_end = Some(end);
        stream.pending.push_back(Pending {
            device: t.device,
            key: t.key,
            estimate: t.estimate,
            start: t.start,
            end,
            queued_until: t.queued_until,
        });
    }
}

impl Governor {
    fn stream(&mut self, ctx: CUcontext, stream: CUstream) -> &mut StreamState {
        self.contexts
            .entry(ctx as u64)
            .or_default()
            .streams
            .entry(stream as u64)
            .or_default()
    }

    /// A free event of `ctx` (created on demand while the context is current).
    fn event(&mut self, ctx: CUcontext) -> Option<CUevent> {
        let state = self.contexts.entry(ctx as u64).or_default();
        if let Some(e) = state.free_events.pop() {
            return Some(e);
        }
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the calling thread's current context is `ctx`.
        let rc = unsafe { real::cuEventCreate(&mut e, CU_EVENT_DEFAULT) };
        if rc != CUDA_SUCCESS || e.is_null() {
            vgpu_log_once!("cannot create CUDA events ({rc}); compute is not governed while they are missing");
            return None;
        }
        Some(e)
    }

    fn recycle(&mut self, ctx: CUcontext, e: CUevent) {
        give_back(&mut self.contexts.entry(ctx as u64).or_default().free_events, e);
    }

    /// The start event of a launch into `stream`: `Some(None)` to chain from the launch
    /// before it (the stream is still busy with it), `Some(Some(e))` for a fresh event
    /// recorded now (the stream is idle), `None` if no event could be had.
    fn start_event(&mut self, ctx: CUcontext, stream: CUstream) -> Option<Option<CUevent>> {
        let state = self.stream(ctx, stream);
        // Everything queued on the stream was harvested: it is idle, no need to ask. After
        // launches charged by estimate, never chain: the span would include them.
        let fresh = state.pending.is_empty() || state.unmeasured_after_tail;
        state.unmeasured_after_tail = false;
        let tail = state.tail_end;
        if let Some(tail) = tail.filter(|_| !fresh) {
            // SAFETY: an event this governor recorded and still owns.
            if unsafe { real::cuEventQuery(tail) } == CUDA_ERROR_NOT_READY {
                return Some(None);
            }
        }
        let e = self.event(ctx)?;
        // SAFETY: an event of this context; the program's stream.
        if unsafe { real::cuEventRecord(e, stream) } != CUDA_SUCCESS {
            self.recycle(ctx, e);
            return None;
        }
        Some(Some(e))
    }

    /// A launch the driver refused: nothing ran.
    fn cancel(&mut self, t: &Ticket) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_ns[t.device] = self.in_flight_ns[t.device].saturating_sub(t.estimate);
        if let Some(e) = t.start {
            self.recycle(t.ctx, e);
        }
    }

    fn estimate(&self, key: u64) -> u64 {
        self.learned.get(&key).map_or(self.average_ns, |l| l.exclusive_ns)
    }

    /// Charge every launch whose end event has completed (never waits). A launch that
    /// should have ended a while ago and has not (its first kernel's duration was not known
    /// yet, another vGPU's work ran before it, a switch) makes the vGPU's published queue
    /// end that much later, so that the others wait for its real drain.
    fn harvest(&mut self, vgpu: &'static Vgpu, now: u64) {
        let mut done: Vec<(usize, u64, u64)> = Vec::new(); // (device, key, measured)
        let mut late: [u64; MAX_DEVICES] = [0; MAX_DEVICES];
        for cstate in self.contexts.values_mut() {
            let ContextState { free_events, streams } = cstate;
            for stream in streams.values_mut() {
                while let Some(front) = stream.pending.front() {
                    // SAFETY: an event this governor recorded and owns.
                    let q = unsafe { real::cuEventQuery(front.end) };
                    if q == CUDA_ERROR_NOT_READY {
                        if front.queued_until != 0 && now > front.queued_until.saturating_add(LATE_NS) {
                            let d = front.device.min(MAX_DEVICES - 1);
                            late[d] = late[d].max(now - front.queued_until);
                        }
                        break;
                    }
                    let Some(p) = stream.pending.pop_front() else { break };
                    let start = p.start.or(stream.last_end);
                    let mut ms: f32 = 0.0;
                    let measured = match start {
                        // SAFETY: two completed events of one context; a valid out-pointer.
                        Some(s) if q == CUDA_SUCCESS && unsafe { real::cuEventElapsedTime(&mut ms, s, p.end) } == CUDA_SUCCESS => {
                            (f64::from(ms.max(0.0)) * 1e6) as u64
                        }
                        _ => p.estimate,
                    };
                    if let Some(s) = p.start {
                        give_back(free_events, s);
                    }
                    if let Some(old) = stream.last_end.replace(p.end) {
                        give_back(free_events, old);
                    }
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.in_flight_ns[p.device] = self.in_flight_ns[p.device].saturating_sub(p.estimate);
                    done.push((p.device, p.key, measured));
                }
            }
        }
        if late.iter().any(|&ns| ns != 0) {
            // Everything queued after it on the device is that late too (once: the launches
            // in flight move with the queue's end).
            for (device, &ns) in late.iter().enumerate().filter(|(_, &ns)| ns != 0) {
                if let Some(pt) = self.process_turns[device].as_ref() {
                    pt.board.queue_late(ns);
                } else if let Some(board) = self.boards[device].board.as_ref() {
                    board.queue_late(ns);
                }
            }
            for p in self.contexts.values_mut().flat_map(|c| c.streams.values_mut()).flat_map(|s| s.pending.iter_mut()) {
                if p.queued_until != 0 {
                    p.queued_until = p.queued_until.saturating_add(late[p.device.min(MAX_DEVICES - 1)]);
                }
            }
        }
        if done.is_empty() {
            return;
        }
        let mut charges: [u64; MAX_DEVICES] = [0; MAX_DEVICES];
        for (device, key, measured) in done {
            let charged = super::meter::correct(device, self.learn(key, measured, now));
            charges[device] = charges[device].saturating_add(charged);
        }
        for (device, &ns) in charges.iter().enumerate().take(vgpu.usage.device_count()) {
            if ns != 0 {
                self.charge(vgpu, device, ns, now);
            }
        }
    }

    /// Charge `ns` of GPU time on `device` to the vGPU's ledger and this process's record.
    fn charge(&self, vgpu: &'static Vgpu, device: usize, ns: u64, now: u64) {
        arith::charge(vgpu.usage.ledger(device), ns, self.share(vgpu, device), now);
        if let Some(record) = state::record(vgpu) {
            vgpu.usage.charge_process(record, device, ns);
        }
    }

    /// Whether a launch of `key` gets events. A kernel and grid whose exclusive time is
    /// well established (at least [`SETTLED_SAMPLES`] measurements, a lone one in the last
    /// second) is measured once every [`SAMPLE_EVERY`] launches and otherwise charged that
    /// time when it is queued: two event records, a query and an elapsed-time call fewer.
    fn should_measure(&mut self, key: u64, now: u64) -> bool {
        let Some(l) = self.learned.get_mut(&key) else { return true };
        let settled = l.samples >= SETTLED_SAMPLES && now.saturating_sub(l.last_lone_ns) <= RISE_AFTER_NS;
        if !settled || l.since_measured + 1 >= SAMPLE_EVERY {
            l.since_measured = 0;
            return true;
        }
        l.since_measured += 1;
        false
    }

    /// Learn from one measurement of `key`; returns what to charge for it.
    ///
    /// A measurement within [`BAND_PCT`] of the learned exclusive duration (or below it) is
    /// the kernel running alone: it is charged as measured and averaged into the estimate.
    /// One above the band was stretched by other contexts' time slices: it is charged the
    /// estimate; the estimate rises only after a second without lone measurements ([`RISE`]),
    /// so a kernel that really got slower (lower clocks) is followed and contention is not.
    /// (A running minimum would charge noisy kernels below their mean.)
    fn learn(&mut self, key: u64, measured: u64, now: u64) -> u64 {
        let entry = self.learned.entry(key).or_insert(Learned {
            exclusive_ns: measured,
            samples: 0,
            since_measured: 0,
            last_lone_ns: now,
            last_rise_ns: now,
        });
        let estimate = entry.exclusive_ns.max(1);
        let charged = if entry.samples == 0 {
            measured
        } else if u128::from(measured) * 100 <= u128::from(estimate) * u128::from(BAND_PCT) {
            entry.exclusive_ns = estimate - estimate / AVERAGE + measured / AVERAGE;
            entry.last_lone_ns = now;
            measured
        } else {
            // Stretched. Only when no lone measurement came for a while may the kernel
            // really have become slower (lower clocks): then rise, a little at a time.
            if now.saturating_sub(entry.last_lone_ns) > RISE_AFTER_NS && now.saturating_sub(entry.last_rise_ns) > RISE_EVERY_NS {
                entry.exclusive_ns = estimate.saturating_add(estimate / RISE + 1);
                entry.last_rise_ns = now;
            }
            estimate
        };
        entry.samples = entry.samples.saturating_add(1);
        self.average_ns = if self.average_ns == 0 {
            charged
        } else {
            (self.average_ns * 7 + charged) / 8
        };
        if self.learned.len() > 4096 {
            self.learned.clear();
        }
        charged
    }

    /// The allowance last decided for `device` (what charges are scaled by).
    fn share(&self, vgpu: &Vgpu, device: usize) -> u64 {
        let base = arith::pct_to_ppm(vgpu.usage.compute_pct(device));
        let granted = self.boards[device].allowance_ppm;
        match vgpu.usage.policy(device) {
            Policy::Strict => granted.min(base),
            Policy::Fair => granted,
        }
        .max(1)
    }

    /// Turns (`vgpu_abi::turn`) at a launch that fits the budget: `None` to launch now,
    /// `Some(until)` to look again by then. Without turns to take
    /// (`BoardView::peers_active`): `None`, nothing read. `waited_ns`: how long this launch
    /// has waited for turns so far.
    /// `unknown`: nothing is known of how long the launch runs (the process's first
    /// kernels): it goes once the work in flight has been measured (or after
    /// [`UNKNOWN_WAIT_NS`]), so that what it queues is known to the others (a storm of its
    /// first kernels would queue unseen).
    fn turn(&mut self, vgpu: &'static Vgpu, device: usize, now: u64, waited_ns: u64, unknown: bool) -> Option<u64> {
        let view = &self.boards[device];
        let board = view.board.as_ref().filter(|_| view.peers_active)?;
        let counters = vgpu.usage.turn_counters(device);
        if waited_ns >= turn::MAX_WAIT_NS {
            // A dead or lying holder cannot stall this vGPU: go without a turn, and take no
            // turns on this GPU for a while (a liar costs one wait, not one per launch).
            board.stop_waiting();
            board.release_turn();
            self.boards[device].peers_active = false;
            self.boards[device].turns_off_until_ns = now.saturating_add(turn::DISTRUST_NS);
            return None;
        }
        let mut peers = [turn::Peer::default(); MAX_COMPETITORS];
        for _ in 0..2 {
            let n = board.turn_peers(now, &mut peers);
            let me = board.own_turn(vgpu.usage.priority(device));
            let d = turn::decide(&me, &peers[..n], now);
            match d {
                turn::Decision::Go if unknown && self.in_flight > 0 && waited_ns < UNKNOWN_WAIT_NS => {
                    return Some(now.saturating_add(UNKNOWN_POLL_NS));
                }
                turn::Decision::Go => return None,
                turn::Decision::Claim => {
                    let share = arith::pct_to_ppm(vgpu.usage.compute_pct(device));
                    let max = turn::max_turn_ns(vgpu.usage.turn_max_ns(device), &me, &peers[..n]);
                    // What it banked: its credit (wall time, at most the burst) at its allowance.
                    let tat = vgpu.usage.ledger(device).tat_ns.load(Ordering::Acquire);
                    let credit = now.saturating_sub(tat).min(vgpu_abi::compute::BURST_NS);
                    let banked = u64::try_from(u128::from(credit) * u128::from(self.share(vgpu, device)) / u128::from(PPM)).unwrap_or(u64::MAX);
                    let length = turn::turn_with_budget_ns(share, max, banked.saturating_sub(self.in_flight_ns[device]));
                    board.claim_turn(now.saturating_add(length), turn::queue_start(&me, &peers[..n], now));
                    if waited_ns > 0 {
                        // Handed over once the others' work drained: no switch on the GPU.
                        counters[0].fetch_add(1, Ordering::Relaxed);
                        counters[2].fetch_add(1, Ordering::Relaxed);
                    } else if me.turn_until_ns != 0 {
                        // Its own turn ran out with nobody waiting: kept, no switch.
                        counters[2].fetch_add(1, Ordering::Relaxed);
                    } else {
                        counters[0].fetch_add(1, Ordering::Relaxed);
                    }
                    // Decide again: a claim made at the same moment is on the board now.
                }
                turn::Decision::Wait { until, release } => {
                    if release {
                        board.release_turn();
                    }
                    board.wait_for_turn(now);
                    return Some(until);
                }
            }
        }
        None
    }

    /// How long a vGPU that does not hold the turn waits before asking for one: until its
    /// budget covers `turn::min_work_ns` of work (0 without other active vGPUs, holding, or
    /// after a rest of `turn::REST_NS`: a latency-sensitive request is not held back).
    fn turn_budget_wait(&self, vgpu: &'static Vgpu, device: usize, now: u64, allowance: u64) -> u64 {
        let view = &self.boards[device];
        let Some(board) = view.board.as_ref().filter(|_| view.peers_active) else { return 0 };
        let own = board.own_turn(0);
        // Holding the turn, or arriving after a rest (a request of a service): no gathering.
        if own.turn_until_ns > now || own.queued_until_ns.saturating_add(turn::REST_NS) < now {
            return 0;
        }
        let work = turn::min_work_ns(allowance).max(self.in_flight_ns[device]);
        arith::wait_ns(vgpu.usage.ledger(device).tat_ns.load(Ordering::Acquire), work, allowance, now)
    }

    /// Look for the vGPU's process-turn word on each of its devices (once per process): its
    /// own mapping of the vGPU's slot there. An unlimited process that finds the word unused
    /// says it launches alone (and keeps its fast path); `VGPU_TURNS=off`: none.
    fn find_process_turns(&mut self, vgpu: &'static Vgpu) {
        if PROCESS_TURNS_READY.load(Ordering::Acquire) {
            return;
        }
        if turns_enabled() {
            let now = now_mono_ns();
            let id = turn::processes::id_from(u64::from(std::process::id()) << 32 ^ now);
            for d in 0..vgpu.usage.device_count().min(MAX_DEVICES) {
                let Some(board) = vgpu.usage.path().parent().and_then(|dir| Board::open(dir, vgpu.usage.device_uuid(d)).ok()) else {
                    continue;
                };
                let word = board.process_turn();
                let alone = turn::processes::alone(id);
                let unlimited = arith::pct_to_ppm(vgpu.usage.compute_pct(d)) >= PPM;
                if unlimited && word.compare_exchange(0, alone, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    PROCESS_TURN_ALONE[d].store(alone, Ordering::Relaxed);
                }
                PROCESS_TURN_WORD[d].store((word as *const AtomicU32).cast_mut(), Ordering::Release);
                self.process_turns[d] = Some(ProcessTurns {
                    board,
                    local: turn::processes::Local { id, ..Default::default() },
                    last_of_turn: false,
                });
            }
        }
        PROCESS_TURNS_READY.store(true, Ordering::Release);
    }

    /// Turns between the vGPU's processes at a launch on `device` that may go now: `None`
    /// to launch, `Some(until)` to look again by then.
    fn process_turn(&mut self, device: usize, now: u64) -> Option<u64> {
        let pt = self.process_turns[device].as_mut()?;
        let queued = pt.board.queued_until();
        pt.last_of_turn = false;
        match turn::processes::step(pt.board.process_turn(), &mut pt.local, queued, now) {
            turn::processes::Step::Go { alone } => {
                let word = if alone { turn::processes::alone(pt.local.id) } else { NOT_ALONE };
                PROCESS_TURN_ALONE[device].store(word, Ordering::Relaxed);
                None
            }
            turn::processes::Step::GoLast => {
                PROCESS_TURN_ALONE[device].store(NOT_ALONE, Ordering::Relaxed);
                pt.last_of_turn = true;
                None
            }
            turn::processes::Step::Wait { until } => {
                PROCESS_TURN_ALONE[device].store(NOT_ALONE, Ordering::Relaxed);
                Some(until)
            }
        }
    }

    /// Out of budget: give the turn up at once (the others need not wait for it).
    fn release_turn(&self, device: usize) {
        if let Some(board) = self.boards[device].board.as_ref().filter(|_| self.boards[device].peers_active) {
            board.release_turn();
        }
    }

    /// The vGPU's allowance on `device` now (ppm): its share, or what the GPU's board
    /// grants it in `fair` mode or when the GPU is oversubscribed.
    fn allowance(&mut self, vgpu: &'static Vgpu, device: usize, now: u64) -> u64 {
        let base = arith::pct_to_ppm(vgpu.usage.compute_pct(device));
        let view = &mut self.boards[device];
        if now < view.next_refresh_ns {
            return self.share(vgpu, device);
        }
        view.next_refresh_ns = now + BOARD_REFRESH_NS;
        view.allowance_ppm = base;
        if view.board.is_none() && now >= view.next_open_ns {
            // Its own slot file, made by `vgpu` with the vGPU; missing or damaged: keep the share.
            view.next_open_ns = now + 5_000_000_000;
            view.board = vgpu
                .usage
                .path()
                .parent()
                .and_then(|dir| Board::open(dir, vgpu.usage.device_uuid(device)).ok());
        }
        let Some(board) = &mut view.board else { return base };
        let ledger = vgpu.usage.ledger(device);
        let measured = arith::recent_share_ppm(ledger, now);
        let usage = measured.unwrap_or(0);
        let policy = vgpu.usage.policy(device);
        // Using (nearly) all it is granted also means wanting more.
        let busy = usage + usage / 16 >= view.allowance_ppm.min(base);
        let hungry_until = if busy { now + HUNGRY_NS } else { view.hungry_until_ns };
        view.hungry_until_ns = view.hungry_until_ns.max(hungry_until);
        let me = Competitor {
            share_ppm: base,
            priority: vgpu.usage.priority(device),
            policy,
            hungry: view.hungry_until_ns > now,
            usage_ppm: measured.unwrap_or(arith::USAGE_UNKNOWN),
        };
        board.publish(me, view.hungry_until_ns, now);
        // Itself first, then the other vGPUs that published within a second (read, never mapped).
        let mut all = [me; MAX_COMPETITORS];
        let n = board.snapshot(me, now, &mut all);
        // Turns with the others active on the GPU, and with a vGPU of higher priority even
        // while it rests: its next request finds at most `turn::QUEUE_AHEAD_NS` queued.
        let others = n > 1 || board.outranked(me.priority);
        view.peers_active = others && turns_enabled() && now >= view.turns_off_until_ns;
        if !view.peers_active {
            board.release_turn();
            board.stop_waiting();
        }
        view.allowance_ppm = arith::allowance_ppm(&all[..n], 0).max(1);
        view.allowance_ppm
    }
}
