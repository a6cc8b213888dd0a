//! Moving the device memory of processes that someone else stopped (a Slurm job step that
//! slurmstepd suspended: SIGTSTP, then SIGSTOP, to every task) to host memory, and back once
//! they run again.
//!
//! vgpu does not stop or continue these processes: it never sends them a signal and never
//! touches their cgroups. But the driver does the checkpoint API's work through a thread of
//! the target process (its restore thread, `cuCheckpointProcessGetRestoreThreadId`), which
//! cannot run while the process is stopped. So, as CRIU's CUDA plugin does, vgpu lets that
//! one thread run under ptrace while the others stay stopped: `PTRACE_SEIZE` (which stops
//! nothing), `PTRACE_INTERRUPT` and a wait (the thread, in its group stop, reports a ptrace
//! stop), `PTRACE_CONT` (it runs; the process's other threads stay in their group stop);
//! after the checkpoint, `PTRACE_INTERRUPT`, a wait, and `PTRACE_DETACH`, which puts the
//! thread back into the group stop if the process is still stopped (the kernel re-arms it on
//! detach), or lets it run if its stopper continued it meanwhile. A signal the thread
//! received while traced is handed back to it on detach, not swallowed.
//!
//! The restore is done the same way: its stopper continued the process, but may stop it
//! again at any time (gang scheduling's time slices), and the driver must not be left
//! waiting on a stopped thread.
//!
//! A checkpointed process stays locked: when its stopper continues it, its CUDA calls block
//! in the driver until [`restore`] puts its memory back and unlocks it. It cannot run CUDA
//! work without its memory.

use std::time::{Duration, Instant};

use vgpu_gpu::checkpoint::{Checkpointer, ProcessState};
use vgpu_store::state::SuspendedMemory;

use super::NOT_A_CUDA_PROCESS;

/// How long vgpu waits for a thread's ptrace stop to be reported before it gives up.
const STOP_REPORT: Duration = Duration::from_secs(2);

/// The `/proc` state letter of process `pid`.
fn state_of(pid: u32) -> Option<u8> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Whether every live process of `pids` is stopped by a signal (`T`), and there is one:
/// what a job scheduler's suspension does. Zombies and gone processes do not count.
pub fn all_stopped(pids: &[u32]) -> bool {
    let states: Vec<u8> = pids.iter().filter_map(|&p| state_of(p)).filter(|s| !matches!(s, b'Z' | b'X')).collect();
    !states.is_empty() && states.iter().all(|&s| s == b'T')
}

/// Whether any of `pids` is stopped by a signal.
pub fn any_stopped(pids: &[u32]) -> bool {
    pids.iter().any(|&p| state_of(p) == Some(b'T'))
}

/// The CUDA processes among `pids`, with their states; `Err(why)` when the driver fails
/// otherwise than "not a CUDA process".
fn cuda_processes(checkpointer: &Checkpointer, pids: &[u32]) -> Result<Vec<(u32, ProcessState)>, String> {
    let mut out = Vec::new();
    for &pid in pids {
        match checkpointer.state(pid) {
            Ok(state) => out.push((pid, state)),
            Err(e) if e.code().is_some_and(|c| NOT_A_CUDA_PROCESS.contains(&c)) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(out)
}

/// `ptrace(request, tid, 0, data)`.
fn ptrace(request: libc::c_uint, tid: libc::pid_t, data: usize) -> Result<(), String> {
    // SAFETY: ptrace(2) requests that take no address and an integer data argument.
    let rc = unsafe { libc::ptrace(request, tid, std::ptr::null_mut::<libc::c_void>(), data as *mut libc::c_void) };
    if rc < 0 {
        return Err(format!("ptrace on thread {tid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A stop of traced thread `tid` reported now, if any: `Some(Ok(signal))` for a
/// signal-delivery stop (the signal it is to receive), `Some(Ok(0))` for any other ptrace
/// stop (a group stop, an interrupt), `Some(Err)` when it ended or cannot be waited for.
fn stop_of(tid: libc::pid_t) -> Option<Result<libc::c_int, String>> {
    let mut status: libc::c_int = 0;
    // SAFETY: waitpid(2) for a thread this thread traces, with a writable status.
    let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if got == 0 {
        return None;
    }
    if got != tid {
        return Some(Err(format!("waiting for thread {tid}: {}", std::io::Error::last_os_error())));
    }
    if !libc::WIFSTOPPED(status) {
        return Some(Err(format!("thread {tid} ended")));
    }
    // With PTRACE_SEIZE, group stops and interrupts are PTRACE_EVENT_STOP (status >> 16);
    // a plain stop is a signal on its way to the thread.
    Some(Ok(if status >> 16 == 0 { libc::WSTOPSIG(status) } else { 0 }))
}

/// Wait (at most [`STOP_REPORT`]) for traced thread `tid` to report a stop; as [`stop_of`].
fn wait_stop(tid: libc::pid_t) -> Result<libc::c_int, String> {
    let deadline = Instant::now() + STOP_REPORT;
    loop {
        if let Some(stop) = stop_of(tid) {
            return stop;
        }
        if Instant::now() > deadline {
            return Err(format!("thread {tid} did not stop within {STOP_REPORT:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The restore threads of stopped processes, made to run under ptrace by the thread that
/// made this (ptrace requests come from the tracing thread only).
struct Running {
    tids: Vec<libc::pid_t>,
}

impl Running {
    /// Let thread `tid` run while its process stays stopped.
    fn add(&mut self, tid: u32) -> Result<(), String> {
        let tid = libc::pid_t::try_from(tid).map_err(|_| format!("thread id {tid} out of range"))?;
        ptrace(libc::PTRACE_SEIZE, tid, 0)?;
        self.tids.push(tid);
        ptrace(libc::PTRACE_INTERRUPT, tid, 0)?;
        let signal = wait_stop(tid)?;
        ptrace(libc::PTRACE_CONT, tid, signal as usize)
    }

    /// Keep them running: a thread stopped for a signal (its stopper's SIGSTOP, say) gets it
    /// (for a stop signal: the rest of its process stops, as the sender meant) and runs on;
    /// one that entered its group stop runs on.
    fn pump(&mut self) {
        self.tids.retain(|&tid| match stop_of(tid) {
            None => true,
            Some(Ok(signal)) => ptrace(libc::PTRACE_CONT, tid, signal as usize).is_ok(),
            Some(Err(_)) => false,
        });
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Stop each (a ptrace stop), then let go: on detach the kernel puts it back into its
        // process's group stop if that still holds. A signal it was stopped for is handed
        // on with the detach.
        for &tid in &self.tids {
            let signal = ptrace(libc::PTRACE_INTERRUPT, tid, 0).and_then(|()| wait_stop(tid)).unwrap_or(0);
            if let Err(e) = ptrace(libc::PTRACE_DETACH, tid, signal as usize) {
                tracing::warn!("cannot let thread {tid} go: {e}");
            }
        }
    }
}

/// Lock every CUDA process, then checkpoint each; on a refusal, put back what was done.
fn lock_and_checkpoint(checkpointer: &Checkpointer, timeout: Duration, processes: &[(u32, ProcessState)]) -> Result<(), String> {
    let result = (|| -> Result<(), String> {
        for &(pid, state) in processes {
            if state == ProcessState::Running {
                checkpointer.lock(pid, timeout).map_err(|e| e.to_string())?;
            }
        }
        for &(pid, state) in processes {
            if state != ProcessState::Checkpointed {
                tracing::info!("checkpointing process {pid}, stopped by its job's scheduler");
                checkpointer.checkpoint(pid).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })();
    if result.is_err() {
        for &(pid, _) in processes {
            if checkpointer.state(pid).is_ok_and(|s| s == ProcessState::Checkpointed) {
                if let Err(e) = checkpointer.restore(pid) {
                    tracing::warn!("cannot put process {pid}'s memory back: {e}");
                }
            }
            if checkpointer.state(pid).is_ok_and(|s| s == ProcessState::Locked) {
                let _ = checkpointer.unlock(pid);
            }
        }
    }
    result
}

/// Run `work` (the driver's calls) in a thread of its own while the restore threads of
/// `processes` run under ptrace, kept running by this thread (the tracer) until it is done;
/// then stop them again and let them go. `Err`: a thread could not be made to run.
fn with_restore_threads<T: Send>(checkpointer: &Checkpointer, processes: &[(u32, ProcessState)], work: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    let mut running = Running { tids: Vec::new() };
    for &(pid, _) in processes {
        let tid = checkpointer.restore_thread_id(pid).map_err(|e| e.to_string())?.unwrap_or(pid);
        running.add(tid).map_err(|why| format!("cannot let the driver's thread of process {pid} run: {why}"))?;
    }
    std::thread::scope(|scope| {
        let work = scope.spawn(work);
        while !work.is_finished() {
            running.pump();
            std::thread::sleep(Duration::from_millis(1));
        }
        work.join().unwrap_or_else(|_| Err("the driver's thread panicked".into()))
    })
}

/// Checkpoint the CUDA processes among `pids`, all stopped by someone else: each one's
/// restore thread is let run meanwhile (see the module's doc), every process locked, then
/// every one checkpointed. Returns where their memory is and how many were checkpointed;
/// when the driver or ptrace refuses, what was checkpointed is restored and the memory is
/// held on the GPU (`Device`, with why).
pub fn checkpoint(pids: &[u32]) -> (SuspendedMemory, usize) {
    let device = |why: String| (SuspendedMemory::Device { why }, 0);
    let (checkpointer, timeout) = match super::driver::checkpointer() {
        Ok(c) => c,
        Err(why) => return device(why),
    };
    let processes = match cuda_processes(checkpointer, pids) {
        Ok(p) => p,
        Err(why) => return device(why),
    };
    if processes.is_empty() {
        return (SuspendedMemory::Host, 0);
    }
    match with_restore_threads(checkpointer, &processes, || lock_and_checkpoint(checkpointer, timeout, &processes)) {
        Ok(()) => (SuspendedMemory::Host, processes.len()),
        Err(why) => device(why),
    }
}

/// Restore and unlock the checkpointed CUDA processes among `pids`, which their stopper
/// continued. Their restore threads are let run under ptrace all the same: a scheduler that
/// stops them again meanwhile (gang scheduling's time slices) cannot leave the driver
/// waiting on a stopped thread. Returns how many; a restore that does not fit leaves the
/// rest checkpointed (their CUDA calls keep waiting) and says why.
pub fn restore(pids: &[u32]) -> Result<usize, String> {
    let (checkpointer, _) = super::driver::checkpointer()?;
    let processes: Vec<(u32, ProcessState)> =
        cuda_processes(checkpointer, pids)?.into_iter().filter(|(_, s)| matches!(s, ProcessState::Checkpointed | ProcessState::Locked)).collect();
    if processes.is_empty() {
        return Ok(0);
    }
    with_restore_threads(checkpointer, &processes, || {
        // Every one restored before any runs CUDA again, as `vgpu resume` does.
        for &(pid, state) in &processes {
            if state == ProcessState::Checkpointed {
                tracing::info!("restoring process {pid}, continued by its job's scheduler");
                checkpointer.restore(pid).map_err(|e| e.to_string())?;
            }
        }
        for &(pid, _) in &processes {
            checkpointer.unlock(pid).map_err(|e| e.to_string())?;
        }
        Ok(processes.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_stopped_by_a_signal_is_stopped_until_continued() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id();
        assert!(!all_stopped(&[pid]) && !any_stopped(&[pid]));
        // SAFETY: kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_stopped(&[pid]) {
            assert!(Instant::now() < deadline, "sleep never stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(any_stopped(&[pid, std::process::id()]) && !all_stopped(&[pid, std::process::id()]));
        assert!(!all_stopped(&[]), "no process is not a stopped step");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) }, 0);
        while any_stopped(&[pid]) {
            assert!(Instant::now() < deadline, "sleep never ran again");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The `/proc` state of `pid`, once it is one of `wanted` (at most 10 s).
    fn wait_state(pid: u32, wanted: &[u8]) -> u8 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = state_of(pid).unwrap_or(b'?');
            if wanted.contains(&state) || Instant::now() > deadline {
                return state;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn kill(pid: u32, signal: libc::c_int) {
        // SAFETY: kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
    }

    /// Pump `running` until `pid`'s state is one of `wanted` (at most 10 s); that state.
    fn pump_until(running: &mut Running, pid: u32, wanted: &[u8]) -> u8 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            running.pump();
            let state = state_of(pid).unwrap_or(b'?');
            if wanted.contains(&state) || Instant::now() > deadline {
                return state;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A child killed when the test ends, pass or fail (a stopped child would hold the test
    /// harness's output open).
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The ptrace dance on a real stopped process: its thread runs while traced, a stop
    /// signal sent meanwhile is handed on (it does not leave the thread in a ptrace stop),
    /// and letting go puts it back into its stop; continued meanwhile, it runs on.
    #[test]
    fn a_stopped_process_runs_while_traced_and_stops_again_when_let_go() {
        let child = Child(std::process::Command::new("sleep").arg("30").spawn().expect("sleep"));
        let pid = child.0.id();
        kill(pid, libc::SIGSTOP);
        assert_eq!(wait_state(pid, b"T"), b'T');

        let mut running = Running { tids: Vec::new() };
        running.add(pid).expect("trace it");
        assert_eq!(pump_until(&mut running, pid, b"S"), b'S', "it runs (sleeps in nanosleep) while traced");
        // Its stopper stops it again: the signal reaches the traced thread, is handed on,
        // and it runs on.
        kill(pid, libc::SIGSTOP);
        for _ in 0..100 {
            running.pump();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pump_until(&mut running, pid, b"S"), b'S', "it runs on, traced");
        drop(running);
        assert_eq!(wait_state(pid, b"T"), b'T', "let go, it is stopped as its stopper left it");

        // Continued while traced: let go, it runs.
        let mut running = Running { tids: Vec::new() };
        running.add(pid).expect("trace it");
        assert_eq!(pump_until(&mut running, pid, b"S"), b'S');
        kill(pid, libc::SIGCONT);
        for _ in 0..100 {
            running.pump();
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(running);
        assert!(matches!(wait_state(pid, b"SR"), b'S' | b'R'), "continued, it runs");
        assert!(!all_stopped(&[pid]));
    }
}
