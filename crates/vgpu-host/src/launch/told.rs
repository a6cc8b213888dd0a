//! What `vgpu run` tells its own terminal while its workload runs: when another command
//! suspends it (`vgpu suspend`, a preemption by a higher-priority workload in the compute
//! pool) and when it is resumed, and why. Every suspension and resumption is written to the
//! workload's record, whoever makes it; `vgpu run` looks at that one file every
//! [`LOOK_EVERY`] (its inode and modification time: a record is replaced by a rename; read
//! only when they changed) and says each change of state, so that a person whose training
//! stops for half a minute learns it from their own terminal, not from someone else's.
//!
//! The looks are made by the thread that waits for the workload (between its waits for the
//! workload's end, [`vgpu_store::supervise::wait_relaying_signals`]), not by a thread of
//! their own: a workload that ends within [`LOOK_EVERY`] costs one `lstat` at its end.
//!
//! Not inotify: closing an inotify instance waits for the kernel's SRCU grace period (about
//! 17 ms measured here), which every `vgpu run` would pay at its end.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_store::state::{Store, SuspendedMemory, Workload, WorkloadState};

/// The watch of one workload's record: [`Told::look`] every [`LOOK_EVERY`] while it runs,
/// and once more when it ended (before its teardown, which is not news), so that a
/// resumption just before the end is said.
pub struct Told {
    path: PathBuf,
    seen: Option<(u64, i64, i64)>,
    state: WorkloadState,
    since: Option<Instant>,
    name: String,
    id: String,
}

impl Told {
    /// Watch workload `w`'s record, whose state is `state` now (as its starter wrote it): a
    /// change from here on is seen.
    pub fn new(store: &Store, w: &Workload, state: WorkloadState) -> Told {
        let path = store.workload_path(&w.id);
        let seen = stamp(&path);
        Told { path, seen, state, since: None, name: w.name.clone(), id: w.id.clone() }
    }

    /// When the record's stamp changed: read it, and say a change between running and
    /// suspended.
    pub fn look(&mut self) {
        let now = stamp(&self.path);
        if now == self.seen {
            return;
        }
        self.seen = now;
        let Ok(record) = Workload::read(&self.path) else {
            return;
        };
        let (name, id) = (&self.name, &self.id);
        match (self.state, record.state) {
            (WorkloadState::Suspended, WorkloadState::Suspended) => {}
            (_, WorkloadState::Suspended) => {
                self.since = Some(Instant::now());
                crate::notice!(
                    "{name} ({id}) is suspended: {}",
                    suspended_line(id, record.suspended_reason.as_deref(), record.suspended_by.as_deref(), record.suspended_memory.as_ref())
                );
            }
            (WorkloadState::Suspended, WorkloadState::Running) => {
                let after = self.since.take().map(|t| format!(" after {:.1} s", t.elapsed().as_secs_f64())).unwrap_or_default();
                crate::notice!("{name} ({id}) is resumed{after}: it runs again");
            }
            _ => {}
        }
        self.state = record.state;
    }
}

/// How often the record is looked at: a suspension is said within this.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The record's inode and modification time: what a rename over it or a write changes.
fn stamp(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.ino(), m.mtime(), m.mtime_nsec()))
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
