//! What `vgpu run` tells its own terminal while its workload runs: when another command
//! suspends it (`vgpu suspend`, a preemption by a higher-priority workload in the compute
//! pool) and when it is resumed, and why. Every suspension and resumption is written to the
//! workload's record, whoever makes it; `vgpu run` looks at that one file every
//! [`LOOK_EVERY`] (its inode and modification time: a record is replaced by a rename; read
//! only when they changed) and says each change of state, so that a person whose training
//! stops for half a minute learns it from their own terminal, not from someone else's.
//!
//! Not inotify: closing an inotify instance waits for the kernel's SRCU grace period (about
//! 17 ms measured here), which every `vgpu run` would pay at its end.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use vgpu_store::state::{Store, SuspendedMemory, Workload, WorkloadState};

/// The watcher of one workload's record; [`Told::stop`] ends it (before the workload's
/// teardown, which is not news).
pub struct Told {
    stop: OwnedFd,
    thread: JoinHandle<()>,
}

impl Told {
    /// Watch workload `w`'s record. None (said at debug level) when no thread or pipe can be
    /// had: the workload runs as ever, its suspensions unsaid.
    pub fn start(store: &Store, w: &Workload) -> Option<Told> {
        let (wake, stop) = match nix::unistd::pipe() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("cannot watch the record of {} for suspensions: {e}", w.id);
                return None;
            }
        };
        let path = store.workload_path(&w.id);
        // The state now: a change from here on is seen.
        let seen = stamp(&path);
        let first = Workload::read(&path).map(|r| r.state).unwrap_or(w.state);
        let (name, id) = (w.name.clone(), w.id.clone());
        let thread = std::thread::Builder::new()
            .name("vgpu-told".into())
            .spawn(move || watch(wake, path, seen, first, &name, &id))
            .ok()?;
        Some(Told { stop, thread })
    }

    /// End the watch and wait for it.
    pub fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// How often the record is looked at: a suspension is said within this.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The record's inode and modification time: what a rename over it or a write changes.
fn stamp(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.ino(), m.mtime(), m.mtime_nsec()))
}

/// Until `wake` reads end of file (its writer dropped), and once more then: every
/// [`LOOK_EVERY`], when the record's stamp changed, read it and say a change between running
/// and suspended.
fn watch(wake: OwnedFd, path: PathBuf, mut seen: Option<(u64, i64, i64)>, mut state: WorkloadState, name: &str, id: &str) {
    let mut since: Option<Instant> = None;
    let every = PollTimeout::try_from(LOOK_EVERY).unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = [PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        // Stopped (or no poll): one last look, so a resumption just before the end is said.
        let last = !matches!(nix::poll::poll(&mut fds, every), Ok(0) | Err(nix::errno::Errno::EINTR));
        let now = stamp(&path);
        if now == seen {
            if last {
                return;
            }
            continue;
        }
        seen = now;
        let Ok(record) = Workload::read(&path) else {
            continue;
        };
        match (state, record.state) {
            (WorkloadState::Suspended, WorkloadState::Suspended) => {}
            (_, WorkloadState::Suspended) => {
                since = Some(Instant::now());
                crate::notice!(
                    "{name} ({id}) is suspended: {}",
                    suspended_line(id, record.suspended_reason.as_deref(), record.suspended_by.as_deref(), record.suspended_memory.as_ref())
                );
            }
            (WorkloadState::Suspended, WorkloadState::Running) => {
                let after = since.take().map(|t| format!(" after {:.1} s", t.elapsed().as_secs_f64())).unwrap_or_default();
                crate::notice!("{name} ({id}) is resumed{after}: it runs again");
            }
            _ => {}
        }
        state = record.state;
        if last {
            return;
        }
    }
}

/// Why and by whom workload `id` was suspended, and where its memory is, from its record's
/// reason, suspender (`vgpu suspend`'s caller) and memory.
fn suspended_line(id: &str, reason: Option<&str>, by: Option<&str>, memory: Option<&SuspendedMemory>) -> String {
    let why = match reason {
        Some("manual") | None => match by {
            Some(who) => format!("by {who} with vgpu suspend (`vgpu resume {id}` resumes it)"),
            None => format!("by vgpu suspend (`vgpu resume {id}` resumes it)"),
        },
        Some("planned") => "waiting for room in the compute pool".to_string(),
        Some(reason) => match reason.strip_prefix("preempted by ") {
            Some(by) => format!("preempted by {by}, which has a higher priority in the compute pool; it resumes when there is room"),
            None => reason.to_string(),
        },
    };
    let memory = match memory {
        Some(SuspendedMemory::Host) => "frozen, its device memory (if any) held in host memory meanwhile".to_string(),
        Some(SuspendedMemory::Device { .. }) => "frozen, its device memory held on the GPU".to_string(),
        None => "frozen".to_string(),
    };
    format!("{why}; {memory}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_who_and_why() {
        assert_eq!(
            suspended_line("1a2b", Some("preempted by urgent"), None, Some(&SuspendedMemory::Host)),
            "preempted by urgent, which has a higher priority in the compute pool; it resumes when there is room; frozen, its device memory (if any) held in host memory meanwhile"
        );
        assert_eq!(
            suspended_line("1a2b", Some("manual"), Some("alice (through sudo)"), Some(&SuspendedMemory::Device { why: "no API".into() })),
            "by alice (through sudo) with vgpu suspend (`vgpu resume 1a2b` resumes it); frozen, its device memory held on the GPU"
        );
    }
}
