//! Suspending a workload (`vgpu suspend`, pool preemption) and resuming it.
//!
//! **Suspend**: where the driver has the CUDA checkpoint API (driver 570+) and `[suspend]
//! checkpoint` allows it, every CUDA process of the workload is locked (its calls blocked,
//! its GPU work drained) and checkpointed (its device memory copied to host memory, the
//! GPU's released), and then the cgroup is frozen. The driver does this work through a
//! thread of each process, which must run meanwhile: checkpoint before freezing, thaw
//! before restoring. Where the API is missing or refuses a process (UVM or IPC memory, a
//! lock that times out …), whatever was checkpointed is restored and the cgroup is only
//! frozen, its memory held on the GPU; the returned [`SuspendedMemory`] says which, and
//! why, for the record, `vgpu ps` and admission.
//!
//! **Resume**: thaw, restore every checkpointed process (its memory back at the same
//! addresses), unlock. A restore the GPU has no room for (memory taken outside vgpu) puts
//! back what was restored and freezes the cgroup again: the workload stays suspended,
//! never half-resumed.
//!
//! Both work from the driver's per-process states (running, locked, checkpointed), not
//! from what this process did, so `recovery.rs` calls them to finish or undo a change
//! that a killed vgpu left half-done.

mod driver;
pub mod stopped;

use thiserror::Error;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::CgroupError;

use vgpu_cgroups::FreezerState;
use vgpu_gpu::checkpoint::CheckpointError;
use vgpu_gpu::checkpoint::Checkpointer;
use vgpu_gpu::checkpoint::ProcessState;
use vgpu_store::state::SuspendedMemory;

pub use driver::configure;

/// The driver's answers for a pid that is not a CUDA process: `CUDA_ERROR_INVALID_VALUE`
/// (what cuda.h documents) and `CUDA_ERROR_NOT_INITIALIZED` (what drivers 570–580 also
/// answer for a process that never initialised CUDA).
const NOT_A_CUDA_PROCESS: [u32; 2] = [1, 3];

/// How often suspend looks again for CUDA processes that started while it checkpointed.
const ROUNDS: usize = 3;

#[derive(Debug, Error)]
pub enum SuspendError {
    /// The freezer failed; the processes checkpointed were restored and run again.
    #[error("cannot freeze it: {0}")]
    Freeze(#[source] CgroupError),
    #[error("cannot read its processes: {0}")]
    Processes(#[source] CgroupError),
}

#[derive(Debug, Error)]
pub enum ResumeError {
    #[error("cannot thaw it: {0}")]
    Thaw(#[source] CgroupError),
    /// A restore failed: what was restored is checkpointed again and the cgroup frozen
    /// again, so it is still suspended with its memory on the host.
    #[error("its memory cannot be put back on the GPU ({0}); it stays suspended")]
    Restore(String),
}

/// Whether suspending now would move memory off the GPUs (the API is there and allowed),
/// or why not. A process may still refuse when it is tried.
pub fn releases_memory() -> Result<(), String> {
    driver::checkpointer().map(|_| ())
}

/// Suspend the workload in `cgroup`: checkpoint its CUDA processes where the driver can,
/// then freeze. Returns where its memory is. A cgroup frozen already (a throttle's off
/// phase) is thawed first: the driver needs its processes running.
pub fn suspend(cgroup: &Cgroup) -> Result<SuspendedMemory, SuspendError> {
    suspend_counted(cgroup).map(|(memory, _)| memory)
}

/// [`suspend`], and how many CUDA processes were checkpointed when the memory went to the
/// host: 0 for a workload with no CUDA context, which had no device memory to move
/// (`vgpu suspend` says so rather than "its device memory is in host memory").
pub fn suspend_counted(cgroup: &Cgroup) -> Result<(SuspendedMemory, usize), SuspendError> {
    let device = |why| Ok((SuspendedMemory::Device { why }, 0));
    if cgroup.state().map_err(SuspendError::Freeze)? != FreezerState::Thawed {
        cgroup.thaw().map_err(SuspendError::Freeze)?;
    }
    let ckpt = match driver::checkpointer() {
        Ok(ckpt) => ckpt,
        Err(why) => {
            cgroup.freeze().map_err(SuspendError::Freeze)?;
            return device(why);
        }
    };
    let (checkpointer, timeout) = ckpt;
    for _ in 0..ROUNDS {
        if let Err(why) = checkpoint_all(checkpointer, cgroup, timeout)? {
            // Run as it was, then hold its memory frozen.
            if let Err((e, _)) = restore_all(checkpointer, cgroup) {
                tracing::warn!("cannot put back what was checkpointed of {}: {e}", cgroup.name());
            }
            cgroup.freeze().map_err(SuspendError::Freeze)?;
            return device(why);
        }
        vgpu_store::stop_point::stop_point("suspend:checkpointed");
        if let Err(e) = cgroup.freeze() {
            let _ = restore_all(checkpointer, cgroup);
            return Err(SuspendError::Freeze(e));
        }
        // A process that started CUDA while the others were checkpointed holds memory:
        // thaw, take it too, and freeze again.
        if let Some(count) = checkpointed_count(checkpointer, cgroup)? {
            return Ok((SuspendedMemory::Host, count));
        }
        cgroup.thaw().map_err(SuspendError::Freeze)?;
    }
    if let Err((e, _)) = restore_all(checkpointer, cgroup) {
        tracing::warn!("cannot put back what was checkpointed of {}: {e}", cgroup.name());
    }
    cgroup.freeze().map_err(SuspendError::Freeze)?;
    device("its processes kept starting CUDA while it was being checkpointed".into())
}

/// Resume the workload in `cgroup`: thaw, then restore and unlock its checkpointed or
/// locked processes. `memory` is what its record says: a workload known to hold its
/// memory on the GPU (or a driver without the API) is only thawed.
///
/// Returns how many processes were restored or unlocked: recovery says so when a killed
/// change had left some.
pub fn resume(cgroup: &Cgroup, memory: Option<&SuspendedMemory>) -> Result<usize, ResumeError> {
    cgroup.thaw().map_err(ResumeError::Thaw)?;
    let checkpointer = match driver::checkpointer() {
        Ok((c, _)) => c,
        Err(why) if memory == Some(&SuspendedMemory::Host) => {
            let _ = cgroup.freeze();
            return Err(ResumeError::Restore(why));
        }
        Err(_) => return Ok(0),
    };
    match restore_all(checkpointer, cgroup) {
        Ok(count) => Ok(count),
        Err((why, restored)) => {
            for pid in restored {
                if let Err(e) = checkpointer.checkpoint(pid) {
                    tracing::warn!("cannot checkpoint process {pid} again: {e}");
                }
            }
            let _ = cgroup.freeze();
            Err(ResumeError::Restore(why))
        }
    }
}

/// Let a suspended workload run so that it can act on a signal to end: thaw, and restore
/// and unlock what can be. A process whose memory does not fit back stays checkpointed
/// (its CUDA calls block; the signal still ends it) rather than frozen.
pub fn wake(cgroup: &Cgroup) -> Result<(), CgroupError> {
    cgroup.thaw()?;
    if let Ok((checkpointer, _)) = driver::checkpointer() {
        if let Err((why, _)) = restore_all(checkpointer, cgroup) {
            tracing::warn!("{} runs again to end, some of its processes still checkpointed: {why}", cgroup.name());
        }
    }
    Ok(())
}

/// Where the memory of a frozen workload is, from the driver's states: on the host if
/// every CUDA process is checkpointed (recovery, when a change died before recording it).
pub fn memory_of(cgroup: &Cgroup) -> SuspendedMemory {
    let held = |why: String| SuspendedMemory::Device { why };
    match driver::checkpointer() {
        Err(why) => held(why),
        Ok((checkpointer, _)) => match all_checkpointed(checkpointer, cgroup) {
            Ok(true) => SuspendedMemory::Host,
            Ok(false) => held("a suspension cut short left some of its processes on the GPU".into()),
            Err(e) => held(e.to_string()),
        },
    }
}

/// The CUDA processes of the cgroup, each with its state. A process the driver does not
/// know as a CUDA process is left out; another error is the caller's reason to stop.
fn cuda_processes(checkpointer: &Checkpointer, cgroup: &Cgroup) -> Result<Result<Vec<(u32, ProcessState)>, String>, SuspendError> {
    let pids = cgroup.pids().map_err(SuspendError::Processes)?;
    let mut out = Vec::new();
    for pid in pids.into_iter().filter_map(|p| u32::try_from(p).ok()) {
        match checkpointer.state(pid) {
            Ok(state) => out.push((pid, state)),
            Err(e) if e.code().is_some_and(|c| NOT_A_CUDA_PROCESS.contains(&c)) => {}
            Err(e) => return Ok(Err(e.to_string())),
        }
    }
    Ok(Ok(out))
}

/// Lock every CUDA process, then checkpoint every one not checkpointed yet — all locked
/// first, as CRIU's CUDA plugin does, so that no process is checkpointed while another one
/// still runs work that waits on it. `Ok(Err(why))`: the driver refused one (the others
/// may be locked or checkpointed: the caller restores them).
fn checkpoint_all(checkpointer: &Checkpointer, cgroup: &Cgroup, timeout: std::time::Duration) -> Result<Result<(), String>, SuspendError> {
    let processes = match cuda_processes(checkpointer, cgroup)? {
        Ok(p) => p,
        Err(why) => return Ok(Err(why)),
    };
    let unknown = |pid: u32, state: ProcessState| CheckpointError::Driver {
        call: format!("cuCheckpointProcessGetState(pid {pid})"),
        code: 0,
        name: format!("the process is in state {state:?}"),
    };
    let lock = |&(pid, state): &(u32, ProcessState)| match state {
        ProcessState::Running => checkpointer.lock(pid, timeout),
        ProcessState::Locked | ProcessState::Checkpointed => Ok(()),
        ProcessState::Failed | ProcessState::Other(_) => Err(unknown(pid, state)),
    };
    if let Err(e) = processes.iter().try_for_each(lock) {
        return Ok(Err(e.to_string()));
    }
    if !processes.is_empty() {
        vgpu_store::stop_point::stop_point("suspend:locked");
    }
    let checkpoint = |&(pid, state): &(u32, ProcessState)| match state {
        ProcessState::Checkpointed => Ok(()),
        _ => {
            tracing::info!("checkpointing process {pid} of {}", cgroup.name());
            checkpointer.checkpoint(pid)
        }
    };
    if let Err(e) = processes.iter().try_for_each(checkpoint) {
        return Ok(Err(e.to_string()));
    }
    Ok(Ok(()))
}

/// Whether every CUDA process of the (frozen) cgroup is checkpointed.
/// How many CUDA processes the cgroup has, when every one is checkpointed (none counts).
fn checkpointed_count(checkpointer: &Checkpointer, cgroup: &Cgroup) -> Result<Option<usize>, SuspendError> {
    Ok(match cuda_processes(checkpointer, cgroup)? {
        Ok(processes) => processes.iter().all(|(_, s)| *s == ProcessState::Checkpointed).then_some(processes.len()),
        Err(_) => None,
    })
}

fn all_checkpointed(checkpointer: &Checkpointer, cgroup: &Cgroup) -> Result<bool, SuspendError> {
    Ok(match cuda_processes(checkpointer, cgroup)? {
        Ok(processes) => processes.iter().all(|(_, s)| *s == ProcessState::Checkpointed),
        Err(_) => false,
    })
}

/// Restore every checkpointed process, then unlock every locked one; how many. On a failed
/// restore, nothing is unlocked and the pids restored so far are returned with the reason.
fn restore_all(checkpointer: &Checkpointer, cgroup: &Cgroup) -> Result<usize, (String, Vec<u32>)> {
    let processes = match cuda_processes(checkpointer, cgroup) {
        Ok(Ok(p)) => p,
        Ok(Err(why)) => return Err((why, Vec::new())),
        Err(e) => return Err((e.to_string(), Vec::new())),
    };
    let mut restored = Vec::new();
    for &(pid, state) in &processes {
        if state == ProcessState::Checkpointed {
            tracing::info!("restoring process {pid} of {}", cgroup.name());
            checkpointer.restore(pid).map_err(|e| (e.to_string(), restored.clone()))?;
            restored.push(pid);
            vgpu_store::stop_point::stop_point("resume:restored");
        }
    }
    let mut count = 0;
    for (pid, state) in processes {
        if matches!(state, ProcessState::Checkpointed | ProcessState::Locked) {
            count += 1;
            if let Err(e) = checkpointer.unlock(pid) {
                tracing::warn!("cannot unlock process {pid}: {e}");
            }
        }
    }
    Ok(count)
}
