//! Where a workload's `vgpu/<id>` cgroup lives, and who made that place: the cgroup
//! *manager*.
//!
//! - `cgroupfs`: under each hierarchy's root (`<mount>/vgpu/<id>`), as vgpu always did. For
//!   hosts without systemd as PID 1, and the tests.
//! - `delegated`: vgpu runs inside a systemd unit with `Delegate=yes` (`vgpu@.service`): the
//!   unit's cgroup subtree is vgpu's to write, so the workload goes to
//!   `<unit cgroup>/vgpu/<id>` and `systemctl status/stop` see and stop it. On cgroup v2 a
//!   cgroup with processes cannot hand controllers to its children ("no internal
//!   processes"), so vgpu first moves itself to the leaf `<unit cgroup>/supervisor`.
//! - `systemd`: systemd is PID 1 and vgpu runs outside a delegated unit (a shell, cron): vgpu
//!   asks systemd over D-Bus for a transient scope `vgpu-<id>.scope` with `Delegate=yes`
//!   holding itself (`systemd.rs`), then goes on as `delegated` inside it. Should the bus not
//!   answer under `auto`, vgpu warns and falls back to cgroupfs.
//!
//! The choice is made once per `vgpu run` ([`choose`]) and recorded in the workload's record
//! ([`CgroupHome`]), so every later command (kill, suspend, teardown, reconcile) opens the
//! cgroup where it was made, whatever its own cgroup is.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{CgroupError, Result};
use super::fs;
use super::layout::{Controller, Layout, Mode};

/// The leaf a delegated vgpu moves itself to on cgroup v2.
pub const SUPERVISOR_LEAF: &str = "supervisor";

/// Overrides the `[cgroup] manager` config key: `auto`, `cgroupfs` or `delegated`.
pub const ENV_MANAGER: &str = "VGPU_CGROUP_MANAGER";

/// Test-only: the cgroup path vgpu takes as its own in every hierarchy, instead of what
/// `/proc/self/cgroup` says (the tests point it at a directory they made to play a unit).
pub const ENV_SELF: &str = "VGPU_CGROUP_SELF";

/// Where systemd, when it is PID 1, says so (`sd_booted(3)`).
const SYSTEMD_RUNTIME: &str = "/run/systemd/system";

/// Who made (and owns the place of) a workload's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManagerKind {
    #[default]
    Cgroupfs,
    Delegated,
    /// A transient scope systemd made over D-Bus; `unit` names it.
    Systemd,
}

impl ManagerKind {
    pub fn name(self) -> &'static str {
        match self {
            ManagerKind::Cgroupfs => "cgroupfs",
            ManagerKind::Delegated => "delegated",
            ManagerKind::Systemd => "systemd",
        }
    }
}

/// `[cgroup] manager` in the config (or `VGPU_CGROUP_MANAGER`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Setting {
    /// `delegated` inside a delegated systemd unit, else `cgroupfs`.
    #[default]
    Auto,
    Cgroupfs,
    /// Use the cgroup vgpu runs in as a delegated subtree even where it cannot tell
    /// (systemd older than 251 marks no delegation).
    Delegated,
    /// A transient scope from systemd for each workload, even where systemd does not look
    /// like PID 1 (a bus given by `VGPU_SYSTEMD_BUS`).
    Systemd,
}

impl Setting {
    pub fn parse(text: &str) -> Option<Setting> {
        match text {
            "auto" => Some(Setting::Auto),
            "cgroupfs" => Some(Setting::Cgroupfs),
            "delegated" => Some(Setting::Delegated),
            "systemd" => Some(Setting::Systemd),
            _ => None,
        }
    }
}

/// The parent of a workload's `vgpu/` directory, as a record stores it: cgroup paths as
/// `/proc/self/cgroup` prints them (relative to each hierarchy's mount). A record written
/// before managers existed has none of it and reads as cgroupfs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupHome {
    #[serde(default)]
    pub manager: ManagerKind,
    /// The systemd unit whose cgroup holds it, if known (`vgpu@gpt.service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Per v1 hierarchy (controllers missing here: the hierarchy's root).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub v1: BTreeMap<Controller, String>,
    /// In the unified hierarchy (v2 hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<String>,
}

impl CgroupHome {
    pub fn is_cgroupfs(&self) -> bool {
        *self == CgroupHome::default()
    }

    /// One line for `vgpu doctor` and logs.
    pub fn describe(&self) -> String {
        match self.manager {
            ManagerKind::Cgroupfs => "cgroupfs: workloads under each hierarchy's vgpu/".to_string(),
            ManagerKind::Systemd if self.unified.is_none() && self.v1.is_empty() => {
                "systemd: each workload in a transient scope vgpu-<id>.scope (Delegate=yes) from systemd's D-Bus API".to_string()
            }
            ManagerKind::Delegated | ManagerKind::Systemd => {
                let at = self.unified.clone().or_else(|| self.v1.get(&Controller::Memory).cloned()).unwrap_or_else(|| "/".into());
                let unit = self.unit.as_deref().map(|u| format!(" of {u}")).unwrap_or_default();
                format!("{}: workloads in the delegated subtree{unit} ({}/vgpu/)", self.manager.name(), at.trim_end_matches('/'))
            }
        }
    }
}

impl Layout {
    /// This layout with every hierarchy rooted where `home` puts a workload's `vgpu/`
    /// directory: `Cgroup::create`/`open` on the result make and find `<home>/vgpu/<id>`.
    /// A path that is not a plain absolute cgroup path (`..`, relative) is refused, so a
    /// damaged record cannot point vgpu outside the cgroup mounts.
    pub fn within(&self, home: &CgroupHome) -> Result<Layout> {
        let mut layout = self.clone();
        if home.manager == ManagerKind::Cgroupfs {
            return Ok(layout);
        }
        match self.mode {
            Mode::V2 => {
                if let (Some(mount), Some(rel)) = (&self.unified, &home.unified) {
                    layout.unified = Some(join(mount, rel)?);
                }
            }
            Mode::V1 | Mode::Hybrid => {
                for (controller, mount) in layout.v1.iter_mut() {
                    if let Some(rel) = home.v1.get(controller) {
                        *mount = join(mount, rel)?;
                    }
                }
            }
        }
        Ok(layout)
    }
}

fn join(mount: &Path, rel: &str) -> Result<PathBuf> {
    let path = Path::new(rel);
    let plain = path.is_absolute() && path.components().skip(1).all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(CgroupError::InvalidSpec { reason: format!("{rel:?} is not a cgroup path") });
    }
    Ok(mount.join(path.strip_prefix("/").unwrap_or(path)))
}

/// What decides the manager, read from the host (or given by a test).
#[derive(Debug, Clone)]
pub struct Probe {
    /// `/run/systemd/system` exists: systemd is PID 1.
    pub systemd_booted: bool,
    /// The text of `/proc/self/cgroup`.
    pub self_cgroup: String,
    /// Whether `VGPU_CGROUP_SELF` replaced it.
    pub self_overridden: bool,
}

impl Probe {
    pub fn read() -> Probe {
        match std::env::var(ENV_SELF) {
            Ok(path) if !path.is_empty() => Probe {
                systemd_booted: Path::new(SYSTEMD_RUNTIME).is_dir(),
                // Every hierarchy, v1 controllers and the unified one alike.
                self_cgroup: format!("1:cpu,cpuacct,memory,pids,freezer,name=systemd:{path}\n0::{path}\n"),
                self_overridden: true,
            },
            _ => Probe {
                systemd_booted: Path::new(SYSTEMD_RUNTIME).is_dir(),
                self_cgroup: std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
                self_overridden: false,
            },
        }
    }
}

/// The manager chosen and why, for `vgpu run` and `vgpu doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub home: CgroupHome,
    pub why: String,
}

/// Chooses the manager for a new workload: `setting` (the config's, overridden by
/// `VGPU_CGROUP_MANAGER`) and what the host says. Changes nothing (`vgpu doctor` asks it).
pub fn choose(layout: &Layout, setting: Setting) -> Result<Choice> {
    choose_with(layout, setting_from_env(setting)?, &Probe::read(), &is_delegated)
}

fn setting_from_env(setting: Setting) -> Result<Setting> {
    match std::env::var(ENV_MANAGER) {
        Ok(text) => Setting::parse(&text).ok_or_else(|| CgroupError::Manager {
            reason: format!("{ENV_MANAGER}={text:?}: expected auto, cgroupfs, delegated or systemd"),
        }),
        Err(_) => Ok(setting),
    }
}

/// For a new workload `id`: chooses the manager ([`choose`]) and makes its place — the
/// transient scope (systemd manager), this process moved to its leaf (cgroup v2) — and
/// returns where its cgroup goes, to record.
pub fn settle(layout: &Layout, setting: Setting, id: &str) -> Result<CgroupHome> {
    let setting = setting_from_env(setting)?;
    let choice = choose_with(layout, setting, &Probe::read(), &is_delegated)?;
    let home = match choice.home.manager {
        ManagerKind::Systemd => {
            let unit = super::systemd::scope_name(id);
            let description = format!("vgpu workload {id}");
            match super::systemd::start_scope(&unit, std::process::id(), &description, super::systemd::TIMEOUT) {
                Ok(()) => {
                    // Now in the scope: its cgroup is ours, as a delegated unit's is.
                    let mut home = choose_with(layout, Setting::Delegated, &Probe::read(), &|_| true)?.home;
                    home.manager = ManagerKind::Systemd;
                    home.unit = Some(unit);
                    home
                }
                Err(e) if setting == Setting::Auto => {
                    tracing::warn!("{e}; the workload's cgroup goes under each hierarchy's vgpu/ instead");
                    CgroupHome::default()
                }
                Err(e) => return Err(e),
            }
        }
        _ => choice.home,
    };
    owned_by_root(layout, &home)?;
    prepare(layout, &home)?;
    Ok(home)
}

/// Refuses a home in a cgroup root does not own: a cgroup delegated to a user (their
/// `user@.service` subtree, or one they were given) is theirs to rearrange, and root's vgpu,
/// started through sudo from there, must not put a workload (and its limits) in it.
pub fn owned_by_root(layout: &Layout, home: &CgroupHome) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if home.manager == ManagerKind::Cgroupfs {
        return Ok(());
    }
    let within = layout.within(home)?;
    for dir in within.unified.iter().chain(within.v1.values()) {
        let meta = std::fs::symlink_metadata(dir).map_err(|source| CgroupError::Io { op: "stat", path: dir.clone(), source })?;
        if !meta.is_dir() || meta.uid() != 0 {
            return Err(CgroupError::Manager { reason: format!("{} is not a cgroup root owns (uid {}): a workload's cgroup goes only in one of root's", dir.display(), meta.uid()) });
        }
    }
    Ok(())
}

/// [`choose`] with its inputs given: `delegated(dir)` says whether systemd marked the
/// cgroup directory `dir` as delegated.
pub fn choose_with(layout: &Layout, setting: Setting, probe: &Probe, delegated: &dyn Fn(&Path) -> bool) -> Result<Choice> {
    let cgroupfs = |why: String| Choice { home: CgroupHome::default(), why };
    let systemd = |why: String| Choice { home: CgroupHome { manager: ManagerKind::Systemd, ..CgroupHome::default() }, why };
    match setting {
        Setting::Cgroupfs => return Ok(cgroupfs("[cgroup] manager = \"cgroupfs\"".into())),
        Setting::Systemd => return Ok(systemd("[cgroup] manager = \"systemd\"".into())),
        Setting::Auto | Setting::Delegated => {}
    }
    let paths = own_paths(&probe.self_cgroup);
    // The hierarchy systemd tracks units in: the unified one (v2, hybrid) or name=systemd.
    let tracking = paths.get("").or_else(|| paths.get("name=systemd")).cloned();
    let (Some(own), Some(tracking_mount)) = (tracking, tracking_mount(layout)) else {
        return match setting {
            Setting::Delegated => Err(CgroupError::Manager { reason: "\"delegated\": cannot read this process's cgroup".into() }),
            _ => Ok(cgroupfs("this process's cgroup is unknown".into())),
        };
    };
    // A vgpu that moved itself to its leaf earlier (a second `vgpu run` in the same unit).
    let own = match own.strip_suffix(&format!("/{SUPERVISOR_LEAF}")) {
        Some(parent) if !parent.is_empty() => parent.to_string(),
        _ => own,
    };
    if setting == Setting::Auto {
        if !probe.systemd_booted && !probe.self_overridden {
            return Ok(cgroupfs(format!("systemd is not PID 1 (no {SYSTEMD_RUNTIME})")));
        }
        if own == "/" || !delegated(&join(&tracking_mount, &own)?) {
            return Ok(systemd(format!("systemd is PID 1 and this process's cgroup {own} is not a delegated unit (Delegate=yes)")));
        }
    }
    let unit = own.rsplit('/').next().filter(|u| u.ends_with(".service") || u.ends_with(".scope")).map(str::to_string);
    let mut home = CgroupHome { manager: ManagerKind::Delegated, unit, ..CgroupHome::default() };
    match layout.mode {
        Mode::V2 => home.unified = Some(own.clone()),
        Mode::V1 | Mode::Hybrid => {
            for controller in layout.v1.keys() {
                let rel = paths.iter().find(|(names, _)| names.split(',').any(|n| n == controller.name())).map(|(_, p)| p);
                let rel = match rel.map(|p| p.strip_suffix(&format!("/{SUPERVISOR_LEAF}")).unwrap_or(p)) {
                    Some(p) if !p.is_empty() => p.to_string(),
                    _ => "/".to_string(),
                };
                home.v1.insert(*controller, rel);
            }
        }
    }
    let why = match setting {
        Setting::Delegated => {
            format!("[cgroup] manager = \"delegated\": this process's cgroup {own}")
        }
        _ => format!("systemd delegated this process's cgroup {own} (Delegate=yes)"),
    };
    Ok(Choice { home, why })
}

/// Hierarchy (controllers list; "" for the unified one) → path, from `/proc/self/cgroup`.
fn own_paths(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, names, path) = (fields.next()?, fields.next()?, fields.next()?);
            Some((names.to_string(), path.to_string()))
        })
        .collect()
}

/// Where systemd's tracking hierarchy is mounted: the unified one, else `name=systemd`
/// (read from the v1 `freezer` mount's sibling `systemd`, where every distribution puts it).
fn tracking_mount(layout: &Layout) -> Option<PathBuf> {
    layout.unified.clone().or_else(|| layout.v1.values().next().and_then(|m| m.parent()).map(|p| p.join("systemd")))
}

/// systemd (≥ 251) marks a delegated unit's cgroup with the extended attribute
/// `trusted.delegate` set to `1`, and (≥ 252) `user.delegate` too. Reading a `trusted.*`
/// attribute takes CAP_SYS_ADMIN, which vgpu's own units do not keep (vgpu@.service,
/// vgpu-service@.service): under a real systemd, vgpu in its delegated unit saw no mark,
/// took the unit for a shell and moved itself out into a scope of its own
/// (tests/systemd/workload_unit.rs). systemd sets `user.delegate` for exactly such readers.
/// Either mark counts, on a cgroup root owns that no one else may write: setting a
/// `user.*` attribute takes write permission on the directory, so on such a cgroup only
/// root (systemd) can have set it. A user may set `user.delegate` on a cgroup of their own
/// (a subtree systemd delegated to them is chowned to them), and root's vgpu started
/// through sudo from there must not take that user's cgroup as its home.
fn is_delegated(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let roots_alone = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0);
    roots_alone && (xattr_is_one(dir, "trusted.delegate") || xattr_is_one(dir, "user.delegate"))
}

fn xattr_is_one(path: &Path, name: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(path), Ok(name)) = (std::ffi::CString::new(path.as_os_str().as_bytes()), std::ffi::CString::new(name)) else {
        return false;
    };
    let mut value = [0u8; 8];
    // SAFETY: both strings are NUL-terminated and live across the call; the kernel writes at
    // most `value.len()` bytes into `value`, which is ours and that long.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    n == 1 && value[0] == b'1'
}

/// Before the first workload cgroup in a delegated v2 subtree: move this process to the
/// leaf `<home>/supervisor`, so that `<home>` holds no process and may hand controllers
/// down (`cgroup.subtree_control`). Nothing to do for cgroupfs or on v1.
pub fn prepare(layout: &Layout, home: &CgroupHome) -> Result<()> {
    if home.manager == ManagerKind::Cgroupfs || layout.mode != Mode::V2 {
        return Ok(());
    }
    let Some(root) = layout.within(home)?.unified else {
        return Ok(());
    };
    let leaf = root.join(SUPERVISOR_LEAF);
    fs::ensure_dir(&leaf)?;
    // "0": the writing process (its whole thread group).
    fs::write(&leaf.join(fs::PROCS), "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeV1;
    use crate::fake::FakeV2;

    fn probe(booted: bool, text: &str) -> Probe {
        Probe { systemd_booted: booted, self_cgroup: text.to_string(), self_overridden: false }
    }

    const V2_UNIT: &str = "0::/system.slice/vgpu@gpt.service\n";

    #[test]
    fn auto_is_cgroupfs_without_systemd_or_delegation() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let yes = |_: &Path| true;
        let no = |_: &Path| false;
        let choice = choose_with(&fake.layout(), Setting::Auto, &probe(false, V2_UNIT), &yes).unwrap();
        assert!(choice.home.is_cgroupfs(), "{choice:?}");
        assert!(choice.why.contains("not PID 1"));
        // systemd as PID 1, not delegated (a shell, cron): a transient scope per workload.
        let choice = choose_with(&fake.layout(), Setting::Auto, &probe(true, V2_UNIT), &no).unwrap();
        assert_eq!(choice.home.manager, ManagerKind::Systemd);
        assert!(choice.why.contains("not a delegated unit"), "{}", choice.why);
        let choice = choose_with(&fake.layout(), Setting::Auto, &probe(true, "0::/\n"), &yes).unwrap();
        assert_eq!(choice.home.manager, ManagerKind::Systemd);
        let choice = choose_with(&fake.layout(), Setting::Systemd, &probe(false, "0::/\n"), &no).unwrap();
        assert_eq!(choice.home.manager, ManagerKind::Systemd);
        assert!(choice.home.describe().contains("vgpu-<id>.scope"), "{}", choice.home.describe());
        let choice = choose_with(&fake.layout(), Setting::Cgroupfs, &probe(true, V2_UNIT), &yes).unwrap();
        assert!(choice.home.is_cgroupfs());
    }

    #[test]
    fn a_delegated_v2_unit_holds_the_workloads_and_the_supervisor_leaf() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let unit_dir = fake.root().join("system.slice/vgpu@gpt.service");
        std::fs::create_dir_all(&unit_dir).unwrap();
        fake.kernel_populate("system.slice/vgpu@gpt.service");
        let marked = unit_dir.clone();
        let delegated = move |dir: &Path| dir == marked;
        let choice = choose_with(&fake.layout(), Setting::Auto, &probe(true, V2_UNIT), &delegated).unwrap();
        assert_eq!(choice.home.manager, ManagerKind::Delegated);
        assert_eq!(choice.home.unit.as_deref(), Some("vgpu@gpt.service"));
        assert_eq!(choice.home.unified.as_deref(), Some("/system.slice/vgpu@gpt.service"));
        // Already in the leaf: the same home.
        let again = choose_with(&fake.layout(), Setting::Auto, &probe(true, "0::/system.slice/vgpu@gpt.service/supervisor\n"), &delegated);
        assert_eq!(again.unwrap().home, choice.home);

        // The kernel fills a new cgroup with its files; the fake tree needs them first.
        std::fs::create_dir(unit_dir.join("supervisor")).unwrap();
        fake.kernel_populate("system.slice/vgpu@gpt.service/supervisor");
        prepare(&fake.layout(), &choice.home).unwrap();
        assert_eq!(std::fs::read_to_string(unit_dir.join("supervisor/cgroup.procs")).unwrap(), "0");
        let layout = fake.layout().within(&choice.home).unwrap();
        std::fs::create_dir(unit_dir.join("vgpu")).unwrap();
        fake.kernel_populate("system.slice/vgpu@gpt.service/vgpu");
        let cgroup = crate::Cgroup::create(&layout, "job1").unwrap();
        assert_eq!(cgroup.paths(), vec![unit_dir.join("vgpu/job1")]);
        assert_eq!(std::fs::read_to_string(unit_dir.join("cgroup.subtree_control")).unwrap(), "+cpu +memory +pids");
    }

    #[test]
    fn delegated_on_v1_follows_each_hierarchy() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let text = "9:freezer:/\n5:pids:/system.slice/x.service\n4:memory:/system.slice/x.service\n2:cpu,cpuacct:/system.slice/x.service\n1:name=systemd:/system.slice/x.service\n";
        let choice = choose_with(&fake.layout(), Setting::Delegated, &probe(false, text), &|_| false).unwrap();
        assert_eq!(choice.home.manager, ManagerKind::Delegated);
        assert_eq!(choice.home.v1[&Controller::Memory], "/system.slice/x.service");
        assert_eq!(choice.home.v1[&Controller::Freezer], "/");
        let layout = fake.layout().within(&choice.home).unwrap();
        assert_eq!(layout.v1[&Controller::Pids], fake.root().join("pids/system.slice/x.service"));
        assert_eq!(layout.v1[&Controller::Freezer], fake.root().join("freezer"));
        // Nothing to move on v1.
        prepare(&fake.layout(), &choice.home).unwrap();
    }

    fn set_xattr(dir: &Path, name: &str) {
        use std::os::unix::ffi::OsStrExt;
        let (path, name) = (std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap(), std::ffi::CString::new(name).unwrap());
        // SAFETY: both strings are NUL-terminated and live across the call; the value is one
        // byte of a static slice.
        let rc = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
        assert_eq!(rc, 0, "setxattr {name:?} on {}: {}", dir.display(), std::io::Error::last_os_error());
    }

    #[test]
    fn only_a_mark_on_a_cgroup_root_alone_writes_means_delegated() {
        use std::os::unix::fs::PermissionsExt;
        assert!(nix::unistd::geteuid().is_root(), "this test must run as root (CI does): it sets trusted.* attributes");
        let unmarked = tempfile::tempdir().unwrap();
        assert!(!is_delegated(unmarked.path()));
        // systemd's marks: trusted.delegate (root reads it with CAP_SYS_ADMIN), user.delegate
        // (which vgpu reads in its units, without CAP_SYS_ADMIN).
        for mark in ["trusted.delegate", "user.delegate"] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            set_xattr(dir.path(), mark);
            assert!(is_delegated(dir.path()), "{mark}");
            // Not on a cgroup root does not own: a user's own subtree, where they set what
            // they like.
            std::os::unix::fs::chown(dir.path(), Some(60_001), None).unwrap();
            assert!(!is_delegated(dir.path()), "{mark} on a user's cgroup");
            // Nor on one another may write (who could set user.delegate there).
            std::os::unix::fs::chown(dir.path(), Some(0), None).unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
            assert!(!is_delegated(dir.path()), "{mark} on a group-writable cgroup");
        }
    }

    #[test]
    fn homes_cannot_leave_the_mounts_and_old_records_read_as_cgroupfs() {
        let fake = FakeV2::new(&["cpu"]);
        for bad in ["../etc", "/a/../../etc", "relative", ""] {
            let home = CgroupHome { manager: ManagerKind::Delegated, unified: Some(bad.into()), ..CgroupHome::default() };
            assert!(matches!(fake.layout().within(&home), Err(CgroupError::InvalidSpec { .. })), "{bad}");
        }
        let home: CgroupHome = serde_json::from_str("{}").unwrap();
        assert!(home.is_cgroupfs());
        assert_eq!(fake.layout().within(&home).unwrap(), fake.layout());
        assert_eq!(Setting::parse("systemd"), Some(Setting::Systemd));
        assert_eq!(Setting::parse("docker"), None);
    }
}
