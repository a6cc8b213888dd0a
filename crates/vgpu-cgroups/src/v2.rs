//! cgroup v2 (unified): one directory per workload, `<root>/vgpu/<name>`.
//!
//! Controllers reach a cgroup only when every ancestor enables them in
//! `cgroup.subtree_control`; `create` enables cpu, memory and pids (those the root offers)
//! on the root and on `vgpu/`. The freezer is `cgroup.freeze` in every non-root cgroup
//! (kernel ≥ 5.2); the kernel reports completion as `frozen 1` in `cgroup.events`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{CgroupError, Result};
use super::fs;
use super::layout::Controller;
use super::manager::{CgroupSpec, FreezerState, Limits, Manager, Stats, CPU_PERIOD_US};
use super::PARENT;

/// The controllers vgpu enables down to its workloads.
const WANTED: [Controller; 3] = [Controller::Cpu, Controller::Memory, Controller::Pids];

const FREEZE: &str = "cgroup.freeze";
const EVENTS: &str = "cgroup.events";

#[derive(Debug)]
pub(crate) struct V2Cgroup {
    name: String,
    dir: PathBuf,
}

impl V2Cgroup {
    pub fn create(root: &Path, name: &str) -> Result<V2Cgroup> {
        let parent = root.join(PARENT);
        let dir = parent.join(name);
        if dir.exists() {
            return Err(CgroupError::AlreadyExists { path: dir });
        }
        enable_controllers(root)?;
        fs::ensure_dir(&parent)?;
        enable_controllers(&parent)?;
        fs::create_new_dir(&dir)?;
        Ok(V2Cgroup { name: name.to_string(), dir })
    }

    pub fn open(root: &Path, name: &str) -> Result<V2Cgroup> {
        let dir = root.join(PARENT).join(name);
        if !dir.is_dir() {
            return Err(CgroupError::NotFound { name: name.to_string(), looked_in: vec![dir] });
        }
        Ok(V2Cgroup { name: name.to_string(), dir })
    }

    pub fn from_dir(name: &str, dir: PathBuf) -> V2Cgroup {
        V2Cgroup { name: name.to_string(), dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `frozen` from `cgroup.events`, with the file's text for error messages.
    fn frozen(&self) -> Result<(bool, String)> {
        let path = self.file(EVENTS);
        let text = fs::read(&path)?;
        Ok((fs::keyed_u64(&path, &text, "frozen")? == Some(1), text))
    }

    /// Writes `cgroup.freeze` and waits for `cgroup.events` to agree.
    fn set_frozen(&self, frozen: bool, timeout: Duration) -> Result<()> {
        let freeze = self.file(FREEZE);
        if !freeze.exists() {
            return Err(CgroupError::MissingController { controller: Controller::Freezer, path: self.dir.clone() });
        }
        fs::write(&freeze, if frozen { "1" } else { "0" })?;
        if fs::poll_until(timeout, || Ok(self.frozen()?.0 == frozen))? {
            return Ok(());
        }
        let current = self.frozen().map(|(_, text)| text.trim().replace('\n', ", ")).unwrap_or_default();
        if frozen {
            // Leave the workload running rather than half-frozen.
            let _ = fs::write(&freeze, "0");
        }
        let target = if frozen { "frozen 1" } else { "frozen 0" };
        Err(CgroupError::Timeout { path: self.file(EVENTS), target, current, waited: timeout })
    }
}

impl Manager for V2Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn kill_file(&self) -> Option<PathBuf> {
        Some(self.file("cgroup.kill")).filter(|f| f.exists())
    }

    fn spec(&self) -> CgroupSpec {
        CgroupSpec::V2 { name: self.name.clone(), dir: self.dir.clone() }
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }

    fn has(&self, controller: Controller) -> Result<bool> {
        Ok(words(&fs::read(&self.file("cgroup.controllers"))?).iter().any(|c| c == controller.name()))
    }

    fn apply(&self, limits: &Limits) -> Result<()> {
        let limits = limits.resolve()?;
        let available = words(&fs::read(&self.file("cgroup.controllers"))?);
        if let Some(controller) = limits.controllers().find(|c| !available.iter().any(|a| a == c.name())) {
            return Err(CgroupError::MissingController { controller, path: self.dir.clone() });
        }
        if let Some(quota) = limits.cpu_quota_us {
            fs::write(&self.file("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        if let Some(bytes) = limits.memory {
            fs::write(&self.file("memory.max"), &bytes.to_string())?;
        }
        if let Some(pids) = limits.pids {
            fs::write(&self.file("pids.max"), &pids.to_string())?;
        }
        Ok(())
    }

    fn freeze(&self, timeout: Duration) -> Result<()> {
        self.set_frozen(true, timeout)
    }

    fn thaw(&self, timeout: Duration) -> Result<()> {
        self.set_frozen(false, timeout)
    }

    fn state(&self) -> Result<FreezerState> {
        // No cgroup.freeze: an old kernel, or the cgroup is gone; either way nothing is frozen.
        let Some(requested) = fs::read_opt(&self.file(FREEZE))? else { return Ok(FreezerState::Thawed) };
        if self.frozen()?.0 {
            Ok(FreezerState::Frozen)
        } else if requested.trim() == "1" {
            Ok(FreezerState::Freezing)
        } else {
            Ok(FreezerState::Thawed)
        }
    }

    fn stats(&self) -> Result<Stats> {
        let cpu_stat = self.file("cpu.stat");
        let cpu_usage_ns = match fs::read_opt(&cpu_stat)? {
            Some(text) => fs::keyed_u64(&cpu_stat, &text, "usage_usec")?.map(|us| us.saturating_mul(1000)),
            None => None,
        };
        Ok(Stats {
            memory_bytes: fs::read_u64_opt(&self.file("memory.current"))?,
            memory_peak_bytes: fs::read_u64_opt(&self.file("memory.peak"))?,
            cpu_usage_ns,
            pids: fs::read_u64_opt(&self.file("pids.current"))?,
        })
    }

    fn oom_kills(&self) -> Result<Option<u64>> {
        let path = self.file("memory.events");
        match fs::read_opt(&path)? {
            Some(text) => fs::keyed_u64(&path, &text, "oom_kill"),
            None => Ok(None),
        }
    }
}

/// Enables in `dir/cgroup.subtree_control` each wanted controller that `dir` has and has
/// not enabled yet. One controller that cannot be enabled (the cpu controller refuses
/// while real-time tasks sit in non-root cgroups) must not cost the others, so a failed
/// combined write is retried one controller at a time; what still fails is logged, and
/// `apply` later names it if a limit needs it.
fn enable_controllers(dir: &Path) -> Result<()> {
    let available = words(&fs::read(&dir.join("cgroup.controllers"))?);
    let control = dir.join("cgroup.subtree_control");
    let enabled = words(&fs::read(&control)?);
    let missing: Vec<&str> = WANTED
        .iter()
        .map(|c| c.name())
        .filter(|name| available.iter().any(|a| a == name) && !enabled.iter().any(|e| e == name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let all: Vec<String> = missing.iter().map(|name| format!("+{name}")).collect();
    if fs::write(&control, &all.join(" ")).is_ok() {
        return Ok(());
    }
    for name in missing {
        if let Err(err) = fs::write(&control, &format!("+{name}")) {
            tracing::warn!("cannot enable the {name} controller: {}", super::error::chain(&err));
        }
    }
    Ok(())
}

/// Controller names in `cgroup.controllers` / `cgroup.subtree_control` (the kernel lists
/// them bare; a leading `+` is tolerated).
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(|w| w.trim_start_matches('+').to_string()).collect()
}

#[cfg(test)]
mod tests {
    use std::fs as stdfs;

    use super::*;
    use crate::fake::FakeV2;

    #[test]
    fn create_enables_controllers_on_root_and_parent() {
        let fake = FakeV2::new(&["cpuset", "cpu", "io", "memory", "pids"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        assert_eq!(cg.dir, fake.root().join("vgpu/job1"));
        assert!(cg.dir.is_dir());
        assert_eq!(fake.read("cgroup.subtree_control"), "+cpu +memory +pids");
        assert_eq!(fake.read("vgpu/cgroup.subtree_control"), "+cpu +memory +pids");
    }

    #[test]
    fn create_enables_only_what_is_missing() {
        let fake = FakeV2::new(&["cpu", "memory"]);
        stdfs::write(fake.root().join("cgroup.subtree_control"), "cpu memory\n").unwrap();
        stdfs::write(fake.root().join("vgpu/cgroup.subtree_control"), "cpu\n").unwrap();
        V2Cgroup::create(fake.root(), "job1").unwrap();
        assert_eq!(fake.read("cgroup.subtree_control"), "cpu memory\n", "root untouched");
        assert_eq!(fake.read("vgpu/cgroup.subtree_control"), "+memory");
    }

    #[test]
    fn create_refuses_an_existing_name() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        V2Cgroup::create(fake.root(), "job1").unwrap();
        let err = V2Cgroup::create(fake.root(), "job1").unwrap_err();
        assert!(matches!(&err, CgroupError::AlreadyExists { path } if path.ends_with("vgpu/job1")), "{err}");
    }

    #[test]
    fn apply_writes_exact_values() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        cg.apply(&Limits { cpus: Some(1.5), memory: Some(4 << 30), pids: Some(128) }).unwrap();
        assert_eq!(fake.read("vgpu/job1/cpu.max"), "150000 100000");
        assert_eq!(fake.read("vgpu/job1/memory.max"), "4294967296");
        assert_eq!(fake.read("vgpu/job1/pids.max"), "128");
        // None leaves a limit alone.
        cg.apply(&Limits { cpus: Some(0.25), ..Limits::default() }).unwrap();
        assert_eq!(fake.read("vgpu/job1/cpu.max"), "25000 100000");
        assert_eq!(fake.read("vgpu/job1/memory.max"), "4294967296");
    }

    #[test]
    fn apply_names_a_missing_controller_and_writes_nothing() {
        let fake = FakeV2::new(&["memory", "cpu"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        stdfs::write(fake.root().join("vgpu/job1/cgroup.controllers"), "cpu memory\n").unwrap();
        let err = cg.apply(&Limits { cpus: Some(1.0), memory: Some(1 << 20), pids: Some(10) }).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController { controller: Controller::Pids, .. }), "{err}");
        assert!(err.to_string().contains("pids"), "{err}");
        assert_eq!(fake.read("vgpu/job1/cpu.max"), "max 100000");
        assert_eq!(fake.read("vgpu/job1/memory.max"), "max");
    }

    #[test]
    fn freeze_and_thaw_follow_cgroup_events() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        assert_eq!(cg.state().unwrap(), FreezerState::Thawed);

        // The "kernel" reports frozen a little after the request.
        let events = fake.root().join("vgpu/job1/cgroup.events");
        let freeze_file = fake.root().join("vgpu/job1/cgroup.freeze");
        let kernel = std::thread::spawn(move || {
            while stdfs::read_to_string(&freeze_file).unwrap() != "1" {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(20));
            stdfs::write(&events, "populated 1\nfrozen 1\n").unwrap();
        });
        cg.freeze(Duration::from_secs(5)).unwrap();
        kernel.join().unwrap();
        assert_eq!(fake.read("vgpu/job1/cgroup.freeze"), "1");
        assert_eq!(cg.state().unwrap(), FreezerState::Frozen);

        // Thaw: the file write, then the wait for frozen 0 (faked up front here).
        stdfs::write(fake.root().join("vgpu/job1/cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        cg.thaw(Duration::from_secs(1)).unwrap();
        assert_eq!(fake.read("vgpu/job1/cgroup.freeze"), "0");
        assert_eq!(cg.state().unwrap(), FreezerState::Thawed);
    }

    #[test]
    fn freeze_times_out_and_thaws_back() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        let err = cg.freeze(Duration::from_millis(30)).unwrap_err();
        assert!(matches!(&err, CgroupError::Timeout { target: "frozen 1", .. }), "{err}");
        assert!(err.to_string().contains("cgroup.events"), "{err}");
        assert_eq!(fake.read("vgpu/job1/cgroup.freeze"), "0", "a failed freeze leaves it running");
    }

    #[test]
    fn freeze_requested_but_not_done_is_freezing() {
        let fake = FakeV2::new(&["cpu"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        stdfs::write(fake.root().join("vgpu/job1/cgroup.freeze"), "1\n").unwrap();
        assert_eq!(cg.state().unwrap(), FreezerState::Freezing);
    }

    #[test]
    fn freeze_without_cgroup_freeze_is_a_missing_freezer() {
        let fake = FakeV2::new(&["cpu"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        let err = cg.freeze(Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController { controller: Controller::Freezer, .. }), "{err}");
    }

    #[test]
    fn stats_read_what_exists() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        stdfs::write(fake.root().join("vgpu/job1/memory.current"), "8192\n").unwrap();
        stdfs::write(fake.root().join("vgpu/job1/cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        stdfs::write(fake.root().join("vgpu/job1/pids.current"), "3\n").unwrap();
        let stats = cg.stats().unwrap();
        assert_eq!(
            stats,
            Stats { memory_bytes: Some(8192), memory_peak_bytes: None, cpu_usage_ns: Some(1_500_000), pids: Some(3) }
        );
    }

    #[test]
    fn oom_kills_come_from_memory_events() {
        let fake = FakeV2::new(&["cpu", "memory"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        assert_eq!(cg.oom_kills().unwrap(), None);
        stdfs::write(fake.root().join("vgpu/job1/memory.events"), "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(cg.oom_kills().unwrap(), Some(1));
    }

    #[test]
    fn add_task_writes_cgroup_procs() {
        let fake = FakeV2::new(&["cpu"]);
        let cg = V2Cgroup::create(fake.root(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        cg.add_task(4242).unwrap();
        assert_eq!(fake.read("vgpu/job1/cgroup.procs"), "4242");
        assert_eq!(cg.pids().unwrap(), vec![4242]);
    }
}
