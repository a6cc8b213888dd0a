//! The checkpoint API of CUDA 12.8 / driver 570 (`cuCheckpointProcess*`, cuda.h's
//! "CUDA Checkpointing" group): a controller moves another process (by pid) through
//! RUNNING → LOCKED → CHECKPOINTED → (restore) LOCKED → RUNNING.
//!
//! The state is kept per process in each slot it holds in the shared device files, so the
//! controller and the target are different processes, as on a real system. The target sees
//! it in [`super::process::gate`]: every CUDA call of a process that is not RUNNING blocks
//! until it is unlocked.
//!
//! Errors, following cuda.h's documentation of each function:
//! * `CUDA_ERROR_NOT_INITIALIZED` before the controller's `cuInit`;
//! * `CUDA_ERROR_NOT_SUPPORTED` with `checkpoint = false` in the config (an older driver);
//! * `CUDA_ERROR_INVALID_VALUE` for a pid that is not a live CUDA process (no context or
//!   memory on any device; cuda.h documents INVALID_VALUE, not NOT_FOUND, for all six),
//!   NULL out-pointers and non-zero reserved fields ("must be zeroed");
//! * `CUDA_ERROR_ILLEGAL_STATE` for a transition the process's state does not allow (also
//!   while another controller's operation on it is under way);
//! * lock: `CUDA_ERROR_NOT_READY` when `timeoutMs` passes before the target's calls and
//!   queued kernels are done (cuda.h lists NOT_READY, not TIMEOUT); the target is left
//!   RUNNING, as documented;
//! * restore: `CUDA_ERROR_OUT_OF_MEMORY` when the memory no longer fits on the device (the
//!   process stays CHECKPOINTED; cuda.h lists no code for it, OOM is what the allocation
//!   path returns).
//!
//! **A controller killed mid-operation.** Each slot records the controller that owns its
//! operation (pid + start time, claimed before the state leaves a stable one: see
//! [`crate::state::DeviceState::ckpt_claim`]). Every entry point first resolves, through
//! [`Driver::reclaim_dead`], the operations of controllers that died, as the real driver
//! (which does the work on the target's side) would have ended them: LOCKING → RUNNING
//! (like a timed-out lock), CHECKPOINTING finished (memory to the host, → CHECKPOINTED),
//! RESTORING undone (memory off the device again, → CHECKPOINTED).
//!
//! **The target must run.** The real driver does an operation's work in a thread of the
//! target process (the one `cuCheckpointProcessGetRestoreThreadId` names; CRIU's CUDA plugin
//! lets exactly that thread run while it holds the rest of the process stopped). So while
//! that thread is stopped — by a signal (SIGSTOP, SIGTSTP: `/proc` state `T`) or in a ptrace
//! stop (`t`) — nothing happens: lock waits (and gives up at its timeout with
//! `CUDA_ERROR_NOT_READY`, the target left RUNNING), and checkpoint, restore and unlock wait
//! until it runs ([`wait_until_runs`]).
//!
//! **Copy time.** Checkpoint and restore copy the process's device memory over PCIe at the
//! config's `checkpoint_gbps` ([`copy_time`]). Checkpoint copies first and frees after: the
//! slots stay CHECKPOINTING for the copy with the memory still counted on the device, which
//! it leaves at once at the end. Restore reserves the memory on the device first (so a
//! restore that does not fit fails at once), then stays RESTORING for the copy.

use std::ffi::c_int;
use std::time::Duration;

use cudarc::driver::sys::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUprocessState, CUresult,
};

use vgpu_abi::process::ProcessId;

use super::{entry_ungated, process, CuResult};
use crate::driver::Driver;
use crate::ffi::{self, now_ns};
use crate::state::{ckpt, owner_word, Claim};

/// How often lock looks again at a target whose calls are still in flight.
const LOCK_POLL: Duration = Duration::from_millis(1);

/// The controller's driver: initialized and offering the API.
fn controller() -> CuResult<&'static Driver> {
    let driver = process::with(|p| Ok(p.driver))?;
    if !driver.checkpoint {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(driver)
}

/// The simulated time to copy `bytes` between device and host at `gbps` GB/s (1e9
/// bytes/s): the whole time model of checkpoint and restore.
pub(crate) fn copy_time(bytes: u64, gbps: f64) -> Duration {
    Duration::try_from_secs_f64(bytes as f64 / (gbps * 1e9)).unwrap_or(Duration::MAX)
}

/// This controller as the owner of an operation (pid + start time).
fn me() -> CuResult<u64> {
    ProcessId::current()
        .and_then(owner_word)
        .ok_or(CUresult::CUDA_ERROR_OPERATING_SYSTEM)
}

/// One slot of the target: driver device index and slot index.
type TargetSlot = (usize, usize);

/// The slots of live CUDA process `pid` (dead ones are reclaimed first); INVALID_VALUE if
/// it has none.
fn target(driver: &Driver, pid: c_int) -> CuResult<(u32, Vec<TargetSlot>)> {
    let pid = u32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    driver.reclaim_dead();
    let slots = slots_of(driver, pid);
    if slots.is_empty() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok((pid, slots))
}

fn slots_of(driver: &Driver, pid: u32) -> Vec<TargetSlot> {
    driver
        .devices
        .iter()
        .enumerate()
        .flat_map(|(d, dev)| {
            dev.state
                .slots_of(pid)
                .into_iter()
                .map(move |(s, _)| (d, s))
        })
        .collect()
}

/// The state a process reports: the most advanced of its slots' (they differ only while a
/// slot is taken during a lock).
fn reported(driver: &Driver, pid: u32, slots: &[TargetSlot]) -> u32 {
    slots
        .iter()
        .filter_map(|&(d, s)| driver.device(d)?.state.ckpt_state(s, pid))
        .map(|raw| match raw {
            ckpt::LOCKED | ckpt::CHECKPOINTING => ckpt::LOCKED,
            ckpt::CHECKPOINTED | ckpt::RESTORING => ckpt::CHECKPOINTED,
            _ => ckpt::RUNNING,
        })
        .max()
        .unwrap_or(ckpt::RUNNING)
}

/// Start an operation of `me` on every slot: claim it and move it from `from` to `to`, or
/// none: ILLEGAL_STATE (INVALID_VALUE if the process died meanwhile) after undoing the
/// moves made.
fn begin_all(
    driver: &Driver,
    pid: u32,
    slots: &[TargetSlot],
    me: u64,
    from: u32,
    to: u32,
) -> CuResult {
    for (done, &(d, s)) in slots.iter().enumerate() {
        if !begin(driver, pid, (d, s), me, from, to) {
            end_all(driver, pid, &slots[..done], me, to, from);
            return Err(if slots_of(driver, pid).is_empty() {
                CUresult::CUDA_ERROR_INVALID_VALUE
            } else {
                CUresult::CUDA_ERROR_ILLEGAL_STATE
            });
        }
    }
    Ok(())
}

/// Claim one slot for `me` and move it from `from` to `to`; whether it did (if not, the
/// slot is not kept).
fn begin(driver: &Driver, pid: u32, (d, s): TargetSlot, me: u64, from: u32, to: u32) -> bool {
    let Some(dev) = driver.device(d) else {
        return false;
    };
    if dev.state.ckpt_claim(s, pid, me) != Claim::Taken {
        return false;
    }
    if dev.state.ckpt_transition(s, pid, from, to) {
        return true;
    }
    dev.state.ckpt_release(s, pid, me);
    false
}

/// End an operation of `me`: move the slots that are in `from` to `to`, then give them up.
fn end_all(driver: &Driver, pid: u32, slots: &[TargetSlot], me: u64, from: u32, to: u32) {
    for &(d, s) in slots {
        if let Some(dev) = driver.device(d) {
            dev.state.ckpt_transition(s, pid, from, to);
            dev.state.ckpt_release(s, pid, me);
        }
    }
}

/// Bytes on the device and checkpointed bytes of the slots, summed.
fn bytes_of(driver: &Driver, pid: u32, slots: &[TargetSlot]) -> (u64, u64) {
    slots
        .iter()
        .filter_map(|&(d, s)| Some(driver.device(d)?.state.slot_bytes(s, pid)))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// INVALID_VALUE if `pid` died during an operation (its slots were reclaimed).
fn still_alive(driver: &Driver, pid: u32) -> CuResult {
    if slots_of(driver, pid).is_empty() {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// The `/proc` state letter of thread `tid` of `pid` (of the process when that thread is
/// gone): `T` stopped by a signal, `t` in a ptrace stop.
fn thread_state(pid: u32, tid: u32) -> Option<u8> {
    let stat = std::fs::read(format!("/proc/{pid}/task/{tid}/stat"))
        .or_else(|_| std::fs::read(format!("/proc/{pid}/stat")))
        .ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Whether the driver's thread in `pid` (its restore thread) is stopped, so that it cannot
/// do an operation's work.
fn target_stopped(driver: &Driver, pid: u32, slots: &[TargetSlot]) -> bool {
    let tid = slots
        .iter()
        .find_map(|&(d, s)| driver.device(d)?.state.restore_tid(s, pid))
        .filter(|&t| t > 0)
        .unwrap_or(pid);
    matches!(thread_state(pid, tid), Some(b'T' | b't'))
}

/// Wait until the driver's thread in `pid` runs (see the module's doc); INVALID_VALUE if
/// the process dies meanwhile.
fn wait_until_runs(driver: &Driver, pid: u32) -> CuResult {
    loop {
        driver.reclaim_dead();
        let slots = slots_of(driver, pid);
        if slots.is_empty() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !target_stopped(driver, pid, &slots) {
            return Ok(());
        }
        std::thread::sleep(LOCK_POLL);
    }
}

/// Reserved words of an optional argument struct must be zero.
///
/// # Safety
/// `args` is NULL or points to a readable `T`, a struct of integers only.
unsafe fn reserved_zero<T: Copy>(args: *const T, words: impl Fn(&T) -> Vec<u64>) -> CuResult {
    if args.is_null() {
        return Ok(());
    }
    // SAFETY: non-NULL and readable by this function's contract; every bit pattern of an
    // integer-only struct is valid.
    let value = unsafe { ffi::read(args) }?;
    if words(&value).iter().any(|&w| w != 0) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        if tid.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (pid, slots) = target(driver, pid)?;
        let found = slots
            .iter()
            .find_map(|&(d, s)| driver.device(d)?.state.restore_tid(s, pid))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let found = c_int::try_from(found).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `tid` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(tid, found) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(
    pid: c_int,
    state: *mut CUprocessState,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        if state.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (pid, slots) = target(driver, pid)?;
        let value = reported(driver, pid, &slots);
        // SAFETY: `state` is non-NULL and points to a 4-byte C enum (driver API contract);
        // written as the raw integer.
        Ok(unsafe { ffi::write(state.cast::<u32>(), value) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(
    pid: c_int,
    args: *mut CUcheckpointLockArgs,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        // SAFETY: `args` is NULL or a readable CUcheckpointLockArgs (driver API contract).
        unsafe {
            reserved_zero(args, |a| {
                let mut words = a.reserved1.to_vec();
                words.push(u64::from(a.reserved0));
                words
            })
        }?;
        let timeout_ms = if args.is_null() {
            0
        } else {
            // SAFETY: non-NULL and readable, checked above.
            unsafe { ffi::read(args) }?.timeoutMs
        };
        let me = me()?;
        let (pid, slots) = target(driver, pid)?;
        lock(driver, pid, slots, me, timeout_ms)
    })
}

/// RUNNING → LOCKING (new calls block), wait for the calls in flight and the kernels queued
/// to finish, → LOCKED. A timeout puts it back to RUNNING.
fn lock(
    driver: &Driver,
    pid: u32,
    mut slots: Vec<TargetSlot>,
    me: u64,
    timeout_ms: u32,
) -> CuResult {
    begin_all(driver, pid, &slots, me, ckpt::RUNNING, ckpt::LOCKING)?;
    let deadline =
        (timeout_ms > 0).then(|| now_ns().saturating_add(u64::from(timeout_ms) * 1_000_000));
    loop {
        driver.reclaim_dead();
        // A call in flight may have taken a slot on another device: lock it too.
        for slot in slots_of(driver, pid) {
            if !slots.contains(&slot) && begin(driver, pid, slot, me, ckpt::RUNNING, ckpt::LOCKING)
            {
                slots.push(slot);
            }
        }
        let live: Vec<TargetSlot> = slots
            .iter()
            .copied()
            .filter(|&(d, s)| {
                driver
                    .device(d)
                    .is_some_and(|dev| dev.state.ckpt_state(s, pid).is_some())
            })
            .collect();
        if live.is_empty() {
            end_all(driver, pid, &slots, me, ckpt::LOCKING, ckpt::RUNNING);
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let in_flight: u32 = live
            .iter()
            .filter_map(|&(d, s)| Some(driver.device(d)?.state.in_calls(s, pid)))
            .sum();
        let now = now_ns();
        let queued_until = live
            .iter()
            .filter_map(|&(d, s)| Some(driver.device(d)?.state.slot_busy_until(s)))
            .max()
            .unwrap_or(0);
        if in_flight == 0 && queued_until <= now && !target_stopped(driver, pid, &live) {
            break;
        }
        if deadline.is_some_and(|d| now >= d) {
            end_all(driver, pid, &slots, me, ckpt::LOCKING, ckpt::RUNNING);
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        // Calls in flight, or the driver's thread in it stopped: look again soon; else the
        // queued kernels' end.
        let mut wait = if in_flight > 0 || queued_until <= now {
            LOCK_POLL
        } else {
            Duration::from_nanos(queued_until - now)
        };
        if let Some(d) = deadline {
            wait = wait.min(Duration::from_nanos(d.saturating_sub(now)));
        }
        std::thread::sleep(wait.max(Duration::from_micros(50)));
    }
    end_all(driver, pid, &slots, me, ckpt::LOCKING, ckpt::LOCKED);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(
    pid: c_int,
    args: *mut CUcheckpointCheckpointArgs,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        // SAFETY: `args` is NULL or a readable CUcheckpointCheckpointArgs (driver API contract).
        unsafe { reserved_zero(args, |a| a.reserved.to_vec()) }?;
        let me = me()?;
        let (pid, _) = target(driver, pid)?;
        wait_until_runs(driver, pid)?;
        let slots = slots_of(driver, pid);
        begin_all(driver, pid, &slots, me, ckpt::LOCKED, ckpt::CHECKPOINTING)?;
        // The copy: the memory stays on the device (and in `used`) until it is done.
        let (on_device, _) = bytes_of(driver, pid, &slots);
        std::thread::sleep(copy_time(on_device, driver.checkpoint_gbps));
        for &(d, s) in &slots {
            if let Some(dev) = driver.device(d) {
                dev.state.checkpoint_memory(s, pid);
            }
        }
        end_all(
            driver,
            pid,
            &slots,
            me,
            ckpt::CHECKPOINTING,
            ckpt::CHECKPOINTED,
        );
        still_alive(driver, pid)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(
    pid: c_int,
    args: *mut CUcheckpointRestoreArgs,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        // SAFETY: `args` is NULL or a readable CUcheckpointRestoreArgs (driver API contract).
        unsafe { reserved_zero(args, |a| a.reserved.to_vec()) }?;
        let me = me()?;
        let (pid, _) = target(driver, pid)?;
        wait_until_runs(driver, pid)?;
        let slots = slots_of(driver, pid);
        begin_all(driver, pid, &slots, me, ckpt::CHECKPOINTED, ckpt::RESTORING)?;
        let (_, on_host) = bytes_of(driver, pid, &slots);
        // The memory is reserved on the device first, then copied.
        for (done, &(d, s)) in slots.iter().enumerate() {
            let fits = driver
                .device(d)
                .is_some_and(|dev| dev.state.restore_memory(s, pid, dev.config.memory));
            if !fits {
                for &(d, s) in &slots[..done] {
                    if let Some(dev) = driver.device(d) {
                        dev.state.unrestore_memory(s, pid);
                    }
                }
                end_all(driver, pid, &slots, me, ckpt::RESTORING, ckpt::CHECKPOINTED);
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        std::thread::sleep(copy_time(on_host, driver.checkpoint_gbps));
        end_all(driver, pid, &slots, me, ckpt::RESTORING, ckpt::LOCKED);
        still_alive(driver, pid)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(
    pid: c_int,
    args: *mut CUcheckpointUnlockArgs,
) -> CUresult {
    entry_ungated(|| {
        let driver = controller()?;
        // SAFETY: `args` is NULL or a readable CUcheckpointUnlockArgs (driver API contract).
        unsafe { reserved_zero(args, |a| a.reserved.to_vec()) }?;
        let me = me()?;
        let (pid, _) = target(driver, pid)?;
        wait_until_runs(driver, pid)?;
        let slots = slots_of(driver, pid);
        begin_all(driver, pid, &slots, me, ckpt::LOCKED, ckpt::RUNNING)?;
        for &(d, s) in &slots {
            if let Some(dev) = driver.device(d) {
                dev.state.ckpt_release(s, pid, me);
            }
        }
        Ok(())
    })
}
