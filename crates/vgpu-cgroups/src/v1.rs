//! cgroup v1 (legacy, and hybrid hosts, where vgpu uses the v1 controllers): one directory
//! `<mount>/vgpu/<name>` in each hierarchy the host mounts among cpu, cpuacct, memory,
//! pids and freezer. Co-mounted controllers (`cpu,cpuacct`) share a directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{CgroupError, Result};
use super::fs;
use super::layout::Controller;
use super::manager::{unique, CgroupSpec, FreezerState, Limits, Manager, Stats, CPU_PERIOD_US};
use super::PARENT;

pub(crate) const FREEZER_STATE: &str = "freezer.state";

#[derive(Debug)]
pub(crate) struct V1Cgroup {
    name: String,
    dirs: BTreeMap<Controller, PathBuf>,
}

impl V1Cgroup {
    /// `mounts`: the host's v1 hierarchies ([`Layout::v1`](super::Layout)).
    pub fn create(mounts: &BTreeMap<Controller, PathBuf>, name: &str) -> Result<V1Cgroup> {
        let cgroup = V1Cgroup { name: name.to_string(), dirs: dirs_in(mounts, name) };
        let dirs = cgroup.dirs();
        if dirs.is_empty() {
            return Err(no_hierarchy(name));
        }
        // No look first: a name that exists in any hierarchy fails its mkdir, which undoes
        // the others (one system call per hierarchy where the name is new, as it nearly
        // always is).
        let mut created = Vec::new();
        for dir in &dirs {
            let made = fs::create_new_dir_and_parent(dir);
            if let Err(err) = made {
                // Changes nothing when it fails: undo the hierarchies done so far.
                for done in created.iter().rev() {
                    let _ = std::fs::remove_dir(done);
                }
                return Err(err);
            }
            created.push(dir.clone());
        }
        Ok(cgroup)
    }

    /// The hierarchies where `<mount>/vgpu/<name>` exists; at least one must.
    pub fn open(mounts: &BTreeMap<Controller, PathBuf>, name: &str) -> Result<V1Cgroup> {
        let all = dirs_in(mounts, name);
        if all.is_empty() {
            return Err(no_hierarchy(name));
        }
        let dirs: BTreeMap<_, _> = all.iter().filter(|(_, dir)| dir.is_dir()).map(|(c, d)| (*c, d.clone())).collect();
        if dirs.is_empty() {
            return Err(CgroupError::NotFound { name: name.to_string(), looked_in: unique(all.into_values()) });
        }
        Ok(V1Cgroup { name: name.to_string(), dirs })
    }

    pub fn from_dirs(name: &str, dirs: BTreeMap<Controller, PathBuf>) -> V1Cgroup {
        V1Cgroup { name: name.to_string(), dirs }
    }

    /// The directory of `controller`'s hierarchy, or the error a caller needing it gets.
    fn dir_of(&self, controller: Controller) -> Result<&Path> {
        self.dirs.get(&controller).map(PathBuf::as_path).ok_or_else(|| CgroupError::MissingController {
            controller,
            path: Path::new(PARENT).join(&self.name),
        })
    }

    fn freezer_state(&self, freezer: &Path) -> Result<Option<String>> {
        Ok(fs::read_opt(&freezer.join(FREEZER_STATE))?.map(|s| s.trim().to_string()))
    }
}

pub(crate) fn dirs_in(mounts: &BTreeMap<Controller, PathBuf>, name: &str) -> BTreeMap<Controller, PathBuf> {
    Controller::USED
        .iter()
        .filter_map(|c| mounts.get(c).map(|mount| (*c, mount.join(PARENT).join(name))))
        .collect()
}

/// What `freezer.state` (at `path`; None: it is gone) says.
pub(crate) fn freezer_state_of(path: &Path, text: Option<&str>) -> Result<FreezerState> {
    match text.map(str::trim) {
        None | Some("THAWED") => Ok(FreezerState::Thawed),
        Some("FREEZING") => Ok(FreezerState::Freezing),
        Some("FROZEN") => Ok(FreezerState::Frozen),
        Some(other) => Err(fs::parse_error(path, other)),
    }
}

fn no_hierarchy(name: &str) -> CgroupError {
    CgroupError::NoHierarchy { name: name.to_string() }
}

impl Manager for V1Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn spec(&self) -> CgroupSpec {
        CgroupSpec::V1 { name: self.name.clone(), dirs: self.dirs.clone() }
    }

    /// v1's `tasks` file moves one thread. Written by the single-threaded child right
    /// after fork, that is the whole process, and the kernel then skips the global
    /// `cgroup_threadgroup_rwsem` write lock that a `cgroup.procs` write takes — whose RCU
    /// grace period cost 5–15 ms per `vgpu run` on the test machines, against 0.1 ms here.
    fn self_join_files(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().map(|dir| dir.join("tasks")).collect()
    }

    fn dirs(&self) -> Vec<PathBuf> {
        unique(self.dirs.values().cloned())
    }

    fn has(&self, controller: Controller) -> Result<bool> {
        Ok(self.dirs.contains_key(&controller))
    }

    fn apply(&self, limits: &Limits) -> Result<()> {
        let limits = limits.resolve()?;
        for controller in limits.controllers() {
            self.dir_of(controller)?;
        }
        if let Some(quota) = limits.cpu_quota_us {
            let cpu = self.dir_of(Controller::Cpu)?;
            // Period first: the kernel checks the quota against the period in force.
            fs::write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            fs::write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
        if let Some(bytes) = limits.memory {
            fs::write(&self.dir_of(Controller::Memory)?.join("memory.limit_in_bytes"), &bytes.to_string())?;
        }
        if let Some(pids) = limits.pids {
            fs::write(&self.dir_of(Controller::Pids)?.join("pids.max"), &pids.to_string())?;
        }
        Ok(())
    }

    /// Writes FROZEN and waits for `freezer.state` to read FROZEN (it reads FREEZING while
    /// tasks are still being stopped). Rewriting FROZEN while waiting retries tasks that
    /// were busy the first time; on timeout the cgroup is thawed again.
    fn freeze(&self, timeout: Duration) -> Result<()> {
        let freezer = self.dir_of(Controller::Freezer)?;
        let path = freezer.join(FREEZER_STATE);
        fs::write(&path, "FROZEN")?;
        let frozen = fs::poll_until(timeout, || {
            if self.freezer_state(freezer)?.as_deref() == Some("FROZEN") {
                return Ok(true);
            }
            fs::write(&path, "FROZEN")?;
            Ok(false)
        })?;
        if frozen {
            return Ok(());
        }
        let current = self.freezer_state(freezer)?.unwrap_or_default();
        let _ = fs::write(&path, "THAWED");
        Err(CgroupError::Timeout { path, target: "FROZEN", current, waited: timeout })
    }

    fn thaw(&self, timeout: Duration) -> Result<()> {
        let freezer = self.dir_of(Controller::Freezer)?;
        let path = freezer.join(FREEZER_STATE);
        fs::write(&path, "THAWED")?;
        if fs::poll_until(timeout, || Ok(self.freezer_state(freezer)?.as_deref() == Some("THAWED")))? {
            return Ok(());
        }
        let current = self.freezer_state(freezer)?.unwrap_or_default();
        Err(CgroupError::Timeout { path, target: "THAWED", current, waited: timeout })
    }

    /// A task frozen by the v1 freezer cannot die, SIGKILL pending or not, until it is
    /// thawed; moving it into a thawed freezer cgroup thaws it (the kernel's
    /// `freezer_attach`). So each one is moved, in the freezer hierarchy only, to the
    /// parent of the workload's freezer cgroup (`vgpu/` or the workload's home, which vgpu
    /// never freezes), where it dies at once; the rest of the workload stays frozen. A
    /// process already gone (ESRCH) is fine.
    fn release_killed(&self, pids: &[i32]) -> Result<()> {
        let Some(freezer) = self.dirs.get(&Controller::Freezer) else { return Ok(()) };
        let Some(parent) = freezer.parent() else { return Ok(()) };
        let procs = parent.join(fs::PROCS);
        for pid in pids {
            match fs::write(&procs, &pid.to_string()) {
                Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                other => other?,
            }
        }
        Ok(())
    }

    fn state(&self) -> Result<FreezerState> {
        // No freezer hierarchy, or the cgroup is gone: nothing can be frozen.
        let Some(freezer) = self.dirs.get(&Controller::Freezer) else { return Ok(FreezerState::Thawed) };
        let path = freezer.join(FREEZER_STATE);
        freezer_state_of(&path, self.freezer_state(freezer)?.as_deref())
    }

    fn stats(&self) -> Result<Stats> {
        let counter = |controller, file: &str| match self.dirs.get(&controller) {
            Some(dir) => fs::read_u64_opt(&dir.join(file)),
            None => Ok(None),
        };
        Ok(Stats {
            memory_bytes: counter(Controller::Memory, "memory.usage_in_bytes")?,
            memory_peak_bytes: counter(Controller::Memory, "memory.max_usage_in_bytes")?,
            cpu_usage_ns: counter(Controller::Cpuacct, "cpuacct.usage")?,
            pids: counter(Controller::Pids, "pids.current")?,
        })
    }

    fn oom_kills(&self) -> Result<Option<u64>> {
        let Some(memory) = self.dirs.get(&Controller::Memory) else { return Ok(None) };
        let path = memory.join("memory.oom_control");
        match fs::read_opt(&path)? {
            Some(text) => fs::keyed_u64(&path, &text, "oom_kill"),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs as stdfs;

    use super::*;
    use crate::fake::FakeV1;

    #[test]
    fn create_makes_one_dir_per_hierarchy() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        let dirs = cg.dirs();
        assert_eq!(dirs.len(), 4, "cpu and cpuacct share one: {dirs:?}");
        for sub in ["cpu,cpuacct", "memory", "pids", "freezer"] {
            assert!(fake.root().join(sub).join("vgpu/job1").is_dir(), "{sub}");
        }
        assert_eq!(cg.dir_of(Controller::Cpuacct).unwrap(), cg.dir_of(Controller::Cpu).unwrap());
    }

    #[test]
    fn create_refuses_an_existing_name_anywhere() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        stdfs::create_dir_all(fake.root().join("pids/vgpu/job1")).unwrap();
        let err = V1Cgroup::create(&fake.mounts(), "job1").unwrap_err();
        assert!(matches!(&err, CgroupError::AlreadyExists { path } if path.starts_with(fake.root().join("pids"))));
        assert!(!fake.root().join("cpu/vgpu/job1").exists(), "nothing created");
    }

    #[test]
    fn create_failing_midway_undoes_what_it_made() {
        let fake = FakeV1::new(&["cpu", "memory", "pids"]);
        // A regular file where the pids hierarchy's parent should be.
        stdfs::write(fake.root().join("pids/vgpu"), "").unwrap();
        let err = V1Cgroup::create(&fake.mounts(), "job1").unwrap_err();
        assert!(matches!(err, CgroupError::Io { .. }), "{err}");
        assert!(!fake.root().join("cpu/vgpu/job1").exists());
        assert!(!fake.root().join("memory/vgpu/job1").exists());
    }

    #[test]
    fn apply_writes_exact_values() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        cg.apply(&Limits { cpus: Some(1.5), memory: Some(512 << 20), pids: Some(64) }).unwrap();
        assert_eq!(fake.read("cpu,cpuacct/vgpu/job1/cpu.cfs_quota_us"), "150000");
        assert_eq!(fake.read("cpu,cpuacct/vgpu/job1/cpu.cfs_period_us"), "100000");
        assert_eq!(fake.read("memory/vgpu/job1/memory.limit_in_bytes"), "536870912");
        assert_eq!(fake.read("pids/vgpu/job1/pids.max"), "64");
    }

    #[test]
    fn apply_names_a_missing_controller_and_writes_nothing() {
        let fake = FakeV1::new(&["cpu", "memory", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        let err = cg.apply(&Limits { cpus: Some(2.0), memory: None, pids: Some(5) }).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController { controller: Controller::Pids, .. }), "{err}");
        assert_eq!(err.to_string(), "the pids controller is not available for vgpu/job1");
        assert_eq!(fake.read("cpu/vgpu/job1/cpu.cfs_quota_us"), "-1");
    }

    #[test]
    fn freeze_and_thaw_write_freezer_state() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        assert_eq!(cg.state().unwrap(), FreezerState::Thawed);
        cg.freeze(Duration::from_secs(1)).unwrap();
        assert_eq!(fake.read("freezer/vgpu/job1/freezer.state"), "FROZEN");
        assert_eq!(cg.state().unwrap(), FreezerState::Frozen);
        cg.thaw(Duration::from_secs(1)).unwrap();
        assert_eq!(fake.read("freezer/vgpu/job1/freezer.state"), "THAWED");
        stdfs::write(fake.root().join("freezer/vgpu/job1/freezer.state"), "FREEZING\n").unwrap();
        assert_eq!(cg.state().unwrap(), FreezerState::Freezing);
    }

    #[test]
    fn killed_tasks_leave_the_freezer_for_its_thawed_parent_and_nothing_else_changes() {
        let fake = FakeV1::new(&["cpu", "memory", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        cg.freeze(Duration::from_secs(1)).unwrap();
        // What the kernel has in every cgroup directory.
        stdfs::write(fake.root().join("freezer/vgpu/cgroup.procs"), "").unwrap();
        cg.release_killed(&[4242]).unwrap();
        // The fake's files keep the last write: the freezer parent got the task.
        assert_eq!(fake.read("freezer/vgpu/cgroup.procs"), "4242");
        assert_eq!(fake.read("freezer/vgpu/job1/freezer.state"), "FROZEN", "the rest stays frozen");
        assert!(!fake.root().join("memory/vgpu/cgroup.procs").exists(), "only the freezer hierarchy");
        // Nothing to release without a freezer hierarchy.
        let none = FakeV1::new(&["cpu", "memory"]);
        let cg = V1Cgroup::create(&none.mounts(), "job2").unwrap();
        cg.release_killed(&[4242]).unwrap();
    }

    #[test]
    fn freeze_without_a_freezer_hierarchy() {
        let fake = FakeV1::new(&["cpu", "memory", "pids"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        let err = cg.freeze(Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController { controller: Controller::Freezer, .. }), "{err}");
        assert_eq!(cg.state().unwrap(), FreezerState::Thawed);
    }

    #[test]
    fn stats_and_tasks_span_hierarchies() {
        let fake = FakeV1::new(&["cpu", "cpuacct", "memory", "pids", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        stdfs::write(fake.root().join("memory/vgpu/job1/memory.usage_in_bytes"), "4096\n").unwrap();
        stdfs::write(fake.root().join("cpuacct/vgpu/job1/cpuacct.usage"), "123456789\n").unwrap();
        stdfs::write(fake.root().join("pids/vgpu/job1/pids.current"), "2\n").unwrap();
        let stats = cg.stats().unwrap();
        assert_eq!(stats.memory_bytes, Some(4096));
        assert_eq!(stats.cpu_usage_ns, Some(123_456_789));
        assert_eq!(stats.pids, Some(2));
        assert_eq!(stats.memory_peak_bytes, None);

        cg.add_task(777).unwrap();
        for sub in ["cpu", "cpuacct", "memory", "pids", "freezer"] {
            assert_eq!(fake.read(&format!("{sub}/vgpu/job1/cgroup.procs")), "777", "{sub}");
        }
        assert_eq!(cg.procs_files().len(), 5);
    }

    #[test]
    fn oom_kills_come_from_oom_control() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let cg = V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        fake.kernel_populate("job1");
        stdfs::write(fake.root().join("memory/vgpu/job1/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert_eq!(cg.oom_kills().unwrap(), Some(2));
        // Kernels before 4.13 do not count them.
        stdfs::write(fake.root().join("memory/vgpu/job1/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\n").unwrap();
        assert_eq!(cg.oom_kills().unwrap(), None);
        let no_memory = V1Cgroup::create(&FakeV1::new(&["cpu"]).mounts(), "job2").unwrap();
        assert_eq!(no_memory.oom_kills().unwrap(), None);
    }

    #[test]
    fn open_finds_what_exists() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let err = V1Cgroup::open(&fake.mounts(), "job1").unwrap_err();
        assert!(matches!(&err, CgroupError::NotFound { looked_in, .. } if looked_in.len() == 4), "{err}");
        V1Cgroup::create(&fake.mounts(), "job1").unwrap();
        let opened = V1Cgroup::open(&fake.mounts(), "job1").unwrap();
        assert_eq!(opened.dirs().len(), 4);
    }
}
