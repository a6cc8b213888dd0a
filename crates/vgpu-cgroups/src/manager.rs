//! The one interface both cgroup versions implement, and the values that cross it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{CgroupError, Result};
use super::fs;
use super::layout::Controller;

/// The CFS period vgpu uses for CPU limits, in microseconds (the kernel's default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The smallest `--memory` (host memory limit) vgpu accepts: below it no program that loads
/// a CUDA driver starts, and the limit counts every process of the workload (page cache
/// included). A smaller value is a typo (`--memory 1` is one byte), refused before anything
/// is created.
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;

/// The kernel refuses a CFS quota below 1 ms.
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// Resource limits for a workload. `None` leaves that resource as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// CPUs' worth of time per period; fractional (1.5 = one and a half CPUs).
    pub cpus: Option<f64>,
    /// Memory in bytes.
    pub memory: Option<u64>,
    /// Maximum number of processes and threads.
    pub pids: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none() && self.memory.is_none() && self.pids.is_none()
    }

    /// The controller each limit given needs, with the limit.
    pub fn needs(&self) -> impl Iterator<Item = Controller> {
        [self.cpus.map(|_| Controller::Cpu), self.memory.map(|_| Controller::Memory), self.pids.map(|_| Controller::Pids)].into_iter().flatten()
    }

    /// These limits without the one `controller` enforces.
    pub fn without(&self, controller: Controller) -> Limits {
        let mut limits = *self;
        match controller {
            Controller::Cpu => limits.cpus = None,
            Controller::Memory => limits.memory = None,
            Controller::Pids => limits.pids = None,
            Controller::Freezer | Controller::Cpuacct => {}
        }
        limits
    }

    /// Checks every value and turns it into what the kernel files take, so that a bad
    /// limit is refused before anything is written.
    pub(crate) fn resolve(&self) -> Result<Resolved> {
        let cpu_quota_us = match self.cpus {
            None => None,
            Some(cpus) if !cpus.is_finite() || cpus <= 0.0 => {
                return Err(invalid("cpus", cpus, "must be a positive number"));
            }
            Some(cpus) => {
                let quota = (cpus * CPU_PERIOD_US as f64).round() as u64;
                if quota < MIN_CPU_QUOTA_US {
                    return Err(invalid("cpus", cpus, "below the kernel's minimum of 0.01 CPUs"));
                }
                Some(quota)
            }
        };
        if self.memory == Some(0) {
            return Err(invalid("memory", 0, "must be at least 1 byte"));
        }
        if self.pids == Some(0) {
            return Err(invalid("pids", 0, "must be at least 1"));
        }
        Ok(Resolved { cpu_quota_us, memory: self.memory, pids: self.pids })
    }
}

fn invalid(what: &'static str, value: impl fmt::Display, reason: &'static str) -> CgroupError {
    CgroupError::InvalidLimit { what, value: value.to_string(), reason }
}

/// Limits checked and converted: the CPU share as a quota over [`CPU_PERIOD_US`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub cpu_quota_us: Option<u64>,
    pub memory: Option<u64>,
    pub pids: Option<u64>,
}

impl Resolved {
    /// The controllers these limits need.
    pub fn controllers(&self) -> impl Iterator<Item = Controller> {
        [
            self.cpu_quota_us.map(|_| Controller::Cpu),
            self.memory.map(|_| Controller::Memory),
            self.pids.map(|_| Controller::Pids),
        ]
        .into_iter()
        .flatten()
    }
}

/// The freezer's view of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreezerState {
    Thawed,
    /// Asked to freeze; some tasks are not stopped yet.
    Freezing,
    Frozen,
}

/// Usage counters; `None` where the host's cgroup version or controllers lack one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Memory charged now (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub memory_bytes: Option<u64>,
    /// Highest memory charged (v2 `memory.peak` on kernels ≥ 5.19, v1 `memory.max_usage_in_bytes`).
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used, in nanoseconds (v2 `cpu.stat` usage_usec, v1 `cpuacct.usage`).
    pub cpu_usage_ns: Option<u64>,
    /// Processes and threads (`pids.current`).
    pub pids: Option<u64>,
}

/// What a workload's cgroup is on disk, to store in a state file and reopen later with
/// [`Cgroup::from_spec`](super::Cgroup::from_spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "lowercase")]
pub enum CgroupSpec {
    /// v1 and hybrid hosts: one directory per controller hierarchy (co-mounted
    /// controllers share one).
    V1 { name: String, dirs: BTreeMap<Controller, PathBuf> },
    /// v2 hosts: one directory.
    V2 { name: String, dir: PathBuf },
}

/// One workload's cgroup, as each cgroup version implements it. Callers use
/// [`Cgroup`](super::Cgroup), which adds what is common to both (kill, remove, join).
pub(crate) trait Manager: fmt::Debug + Send + Sync {
    fn name(&self) -> &str;

    fn spec(&self) -> CgroupSpec;

    /// The cgroup's directories, one per hierarchy, without duplicates.
    fn dirs(&self) -> Vec<PathBuf>;

    /// Writes the limits. Checks first that every controller they need is there, so a
    /// missing controller changes nothing.
    fn apply(&self, limits: &Limits) -> Result<()>;

    /// Whether the cgroup has `controller` (v1: a directory in its hierarchy; v2: listed in
    /// its `cgroup.controllers`).
    fn has(&self, controller: Controller) -> Result<bool>;

    /// Stops every process and waits until the kernel reports them stopped.
    fn freeze(&self, timeout: Duration) -> Result<()>;

    fn thaw(&self, timeout: Duration) -> Result<()>;

    /// Lets processes of a frozen cgroup that have a SIGKILL pending die without thawing
    /// the others. v2 needs nothing: a fatal signal ends a frozen task. See the v1 override.
    fn release_killed(&self, _pids: &[i32]) -> Result<()> {
        Ok(())
    }

    fn state(&self) -> Result<FreezerState>;

    fn stats(&self) -> Result<Stats>;

    /// How many processes the kernel's OOM killer killed in the cgroup (v1
    /// `memory.oom_control`, v2 `memory.events`: `oom_kill`); `None` without a memory
    /// controller or on kernels that do not count them.
    fn oom_kills(&self) -> Result<Option<u64>>;

    /// `cgroup.kill` (cgroup v2, kernel ≥ 5.14): writing `1` SIGKILLs every process in the
    /// cgroup and below it at once, frozen or not, forks racing with it included. None
    /// where there is no such file (v1, older kernels).
    fn kill_file(&self) -> Option<PathBuf> {
        None
    }

    /// The `cgroup.procs` file of every hierarchy.
    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().map(|dir| dir.join(fs::PROCS)).collect()
    }

    /// The files a freshly forked, single-threaded child writes `0` to in order to join:
    /// `cgroup.procs` by default (see the v1 override).
    fn self_join_files(&self) -> Vec<PathBuf> {
        self.procs_files()
    }

    fn add_task(&self, pid: i32) -> Result<()> {
        let value = pid.to_string();
        self.procs_files().iter().try_for_each(|file| fs::write(file, &value))
    }

    /// Every process in the cgroup (and in any cgroup below it), in every hierarchy.
    fn pids(&self) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        for dir in self.dirs() {
            fs::procs_recursive(&dir, &mut pids)?;
        }
        pids.sort();
        pids.dedup();
        Ok(pids)
    }
}

/// Directories without duplicates, in order.
pub(crate) fn unique(dirs: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        if !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_shares_become_quotas() {
        let quota = |cpus| Limits { cpus: Some(cpus), ..Limits::default() }.resolve().map(|r| r.cpu_quota_us);
        assert_eq!(quota(1.5).unwrap(), Some(150_000));
        assert_eq!(quota(0.01).unwrap(), Some(1_000));
        assert_eq!(quota(2.0).unwrap(), Some(200_000));
        for bad in [0.0, -1.0, 0.001, f64::NAN, f64::INFINITY] {
            assert!(matches!(quota(bad), Err(CgroupError::InvalidLimit { what: "cpus", .. })), "{bad}");
        }
    }

    #[test]
    fn zero_memory_or_pids_is_refused() {
        assert!(Limits { memory: Some(0), ..Limits::default() }.resolve().is_err());
        assert!(Limits { pids: Some(0), ..Limits::default() }.resolve().is_err());
        let resolved = Limits { memory: Some(1 << 30), pids: Some(64), cpus: None }.resolve().unwrap();
        assert_eq!(resolved.controllers().collect::<Vec<_>>(), vec![Controller::Memory, Controller::Pids]);
    }

    #[test]
    fn spec_round_trips_through_json() {
        let v1 = CgroupSpec::V1 {
            name: "job".into(),
            dirs: [(Controller::Cpu, PathBuf::from("/sys/fs/cgroup/cpu/vgpu/job"))].into_iter().collect(),
        };
        let v2 = CgroupSpec::V2 { name: "job".into(), dir: PathBuf::from("/sys/fs/cgroup/vgpu/job") };
        for spec in [v1, v2] {
            let text = serde_json::to_string(&spec).unwrap();
            assert_eq!(serde_json::from_str::<CgroupSpec>(&text).unwrap(), spec, "{text}");
        }
        let text = serde_json::to_string(&CgroupSpec::V2 { name: "j".into(), dir: "/x/vgpu/j".into() }).unwrap();
        assert_eq!(text, r#"{"version":"v2","name":"j","dir":"/x/vgpu/j"}"#);
    }
}
