//! Terminating processes the audits condemn: SIGTERM once, SIGKILL `kill_after` later if the
//! same process (pid and start time) still runs. Signals go through a pidfd, so a recycled
//! pid is never hit.

use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use crate::event::Event;

/// One process being terminated.
#[derive(Debug, Clone)]
struct Pending {
    process: ProcessId,
    /// Who it belonged to, for the log ("workload train (a1b2c3d4)" or "unmanaged").
    whose: String,
    kill_at: Instant,
    killed: bool,
}

/// The processes sent SIGTERM and not yet gone.
#[derive(Debug, Default)]
pub struct Terminations {
    pending: Vec<Pending>,
}

impl Terminations {
    pub fn is_pending(&self, process: ProcessId) -> bool {
        self.pending.iter().any(|p| p.process == process)
    }

    /// How many are being terminated.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// SIGTERM `process` now, unless it is already being terminated; SIGKILL it at
    /// `now + kill_after` (at once when that is zero). Returns the event to log, None when
    /// it was pending already or is gone.
    pub fn terminate(&mut self, process: ProcessId, whose: &str, reason: &str, now: Instant, kill_after: Duration) -> Option<Event> {
        if self.is_pending(process) {
            return None;
        }
        let signal = if kill_after.is_zero() { libc::SIGKILL } else { libc::SIGTERM };
        match vgpu_store::supervise::signal_exact(process, signal) {
            Ok(true) => {
                self.pending.push(Pending { process, whose: whose.to_string(), kill_at: now + kill_after, killed: kill_after.is_zero() });
                let what = if kill_after.is_zero() { "SIGKILL" } else { "SIGTERM" };
                Some(Event::info(format!("{what} to pid {} of {whose}: {reason}", process.pid)))
            }
            Ok(false) => None,
            Err(e) => Some(Event::warn(format!("cannot signal pid {} of {whose}: {e}", process.pid))),
        }
    }

    /// SIGKILL those whose time is up; forget those that are gone.
    pub fn tick(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        self.pending.retain_mut(|p| {
            if !p.process.is_alive() {
                return false;
            }
            if !p.killed && now >= p.kill_at {
                p.killed = true;
                match vgpu_store::supervise::signal_exact(p.process, libc::SIGKILL) {
                    Ok(true) => events.push(Event::info(format!("SIGKILL to pid {} of {}: still running after SIGTERM", p.process.pid, p.whose))),
                    Ok(false) => return false,
                    Err(e) => events.push(Event::warn(format!("cannot SIGKILL pid {} of {}: {e}", p.process.pid, p.whose))),
                }
            }
            true
        });
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(ignore_term: bool) -> std::process::Child {
        let script = if ignore_term { "trap '' TERM; echo ready; while :; do sleep 0.05; done" } else { "echo ready; while :; do sleep 0.05; done" };
        let mut c = std::process::Command::new("sh").args(["-c", script]).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(c.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        c
    }

    fn id(c: &std::process::Child) -> ProcessId {
        ProcessId { pid: c.id(), start_time: vgpu_abi::process::start_time(c.id()).unwrap() }
    }

    #[test]
    fn sigterm_once_then_sigkill_after_the_delay() {
        let mut c = child(true);
        let mut t = Terminations::default();
        let now = Instant::now();
        let e = t.terminate(id(&c), "workload w (x)", "over memory quota", now, Duration::from_secs(5)).unwrap();
        assert!(e.message.starts_with("SIGTERM to pid") && e.message.contains("over memory quota"), "{e:?}");
        assert!(t.terminate(id(&c), "workload w (x)", "again", now, Duration::from_secs(5)).is_none(), "signalled once");
        assert!(t.tick(now + Duration::from_secs(1)).is_empty(), "it ignores SIGTERM; not yet time");
        let events = t.tick(now + Duration::from_secs(5));
        assert!(events.iter().any(|e| e.message.starts_with("SIGKILL to pid")), "{events:?}");
        let status = c.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        assert!(t.tick(now + Duration::from_secs(6)).is_empty());
        assert!(t.is_empty(), "forgotten once gone");
    }

    #[test]
    fn a_recycled_pid_is_not_signalled() {
        let mut c = child(false);
        let mut wrong = id(&c);
        wrong.start_time += 1;
        let mut t = Terminations::default();
        assert!(t.terminate(wrong, "w", "r", Instant::now(), Duration::ZERO).is_none());
        assert!(c.try_wait().unwrap().is_none(), "still running");
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
