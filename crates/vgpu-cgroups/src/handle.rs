//! [`Cgroup`]: one workload's cgroup, whatever the host's cgroup version.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::error::{CgroupError, Result};
use super::fs;
use super::layout::{Controller, Layout, Mode};
use super::manager::{CgroupSpec, FreezerState, Limits, Manager, Stats};
use super::v1::V1Cgroup;
use super::v2::V2Cgroup;

/// The directory under each hierarchy's root that holds every vgpu workload.
pub const PARENT: &str = "vgpu";

/// How long freezing, thawing, killing and removing wait for the kernel by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// What `remove` does with processes still in the cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leftovers {
    /// SIGKILL them (thawing first if needed) and wait until they are gone.
    Kill,
    /// Refuse with [`CgroupError::Populated`], changing nothing.
    Refuse,
}

/// One workload's cgroup: `vgpu/<name>` in the unified hierarchy (v2) or in each v1
/// hierarchy vgpu uses (v1 and hybrid hosts).
///
/// Typical life, as `vgpu run` uses it:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::os::fd::AsRawFd;
/// use std::os::unix::process::CommandExt;
/// use vgpu_cgroups::{Cgroup, Layout, Limits};
///
/// let layout = Layout::detect().ok_or("no cgroup filesystem")?;
/// let cgroup = Cgroup::create(&layout, "w-1234")?;
/// cgroup.apply(&Limits { cpus: Some(1.5), memory: Some(4 << 30), pids: Some(512) })?;
/// let procs = cgroup.procs_files()?;
/// let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
/// let mut command = std::process::Command::new("python");
/// // SAFETY: the closure runs between fork and exec and only calls write(2), which is
/// // async-signal-safe, on descriptors opened (and kept open by `procs`) beforehand.
/// unsafe {
///     command.pre_exec(move || {
///         for &fd in &fds {
///             if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
///                 return Err(std::io::Error::last_os_error());
///             }
///         }
///         Ok(())
///     });
/// }
/// let mut child = command.spawn()?;
/// drop(procs);
/// let status = child.wait()?;
/// cgroup.remove()?; // kills whatever the workload left behind
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Cgroup {
    imp: Box<dyn Manager>,
    timeout: Duration,
}

impl Cgroup {
    /// Creates the cgroup `name` for a new workload. A cgroup of that name that exists
    /// already is an error ([`CgroupError::AlreadyExists`]), never reused.
    pub fn create(layout: &Layout, name: &str) -> Result<Cgroup> {
        validate_name(name)?;
        let imp: Box<dyn Manager> = match layout.mode {
            Mode::V2 => Box::new(V2Cgroup::create(unified(layout, name)?, name)?),
            Mode::V1 | Mode::Hybrid => Box::new(V1Cgroup::create(&layout.v1, name)?),
        };
        Ok(Cgroup::wrap(imp))
    }

    /// Opens the existing cgroup `name` ([`CgroupError::NotFound`] if there is none).
    pub fn open(layout: &Layout, name: &str) -> Result<Cgroup> {
        validate_name(name)?;
        let imp: Box<dyn Manager> = match layout.mode {
            Mode::V2 => Box::new(V2Cgroup::open(unified(layout, name)?, name)?),
            Mode::V1 | Mode::Hybrid => Box::new(V1Cgroup::open(&layout.v1, name)?),
        };
        Ok(Cgroup::wrap(imp))
    }

    /// Opens the existing cgroup `name` of a workload whose record says it lives in `home`
    /// (a delegated unit's subtree, or each hierarchy's root).
    pub fn open_at(layout: &Layout, home: &super::CgroupHome, name: &str) -> Result<Cgroup> {
        Cgroup::open(&layout.within(home)?, name)
    }

    /// The freezer state of the cgroup `name` in `home`, as [`Cgroup::open_at`] then
    /// [`Cgroup::state`] read it, from its one freezer file: no other directory of the
    /// cgroup is looked at. A cgroup that does not exist reads as thawed (nothing of it can
    /// be frozen). For a look at every workload's cgroup (reconcile's), where nearly every
    /// one is thawed: one file read each, not a check of each hierarchy's directory.
    pub fn freezer_state_at(layout: &Layout, home: &super::CgroupHome, name: &str) -> Result<FreezerState> {
        validate_name(name)?;
        let layout = layout.within(home)?;
        let imp: Box<dyn Manager> = match layout.mode {
            Mode::V2 => Box::new(V2Cgroup::from_dir(name, unified(&layout, name)?.join(PARENT).join(name))),
            Mode::V1 | Mode::Hybrid => match layout.v1.get(&Controller::Freezer) {
                Some(mount) => Box::new(V1Cgroup::from_dirs(name, BTreeMap::from([(Controller::Freezer, mount.join(PARENT).join(name))]))),
                None => return Ok(FreezerState::Thawed),
            },
        };
        imp.state()
    }

    /// The processes of the cgroup `name` in `home`, as [`Cgroup::open_at`] then
    /// [`Cgroup::pids`] list them, without first checking that each hierarchy's directory
    /// is there: a cgroup that does not exist has none. For listing many workloads.
    pub fn pids_at(layout: &Layout, home: &super::CgroupHome, name: &str) -> Result<Vec<i32>> {
        validate_name(name)?;
        let layout = layout.within(home)?;
        let imp: Box<dyn Manager> = match layout.mode {
            Mode::V2 => Box::new(V2Cgroup::from_dir(name, unified(&layout, name)?.join(PARENT).join(name))),
            Mode::V1 | Mode::Hybrid => Box::new(V1Cgroup::from_dirs(name, super::v1::dirs_in(&layout.v1, name))),
        };
        imp.pids()
    }

    /// The existing cgroup `name` (below each hierarchy's root) when every directory of it
    /// was last changed at least `age` ago and no process is in it, in any hierarchy or
    /// cgroup nested below it; `None` otherwise (and when it does not exist). The cheap looks
    /// come first — the age of one directory, the processes of one hierarchy — so that a live
    /// workload's cgroup, or a new one, costs one or two reads; only a cgroup they do not rule
    /// out is opened and looked at whole.
    pub fn open_if_idle(layout: &Layout, name: &str, age: Duration) -> Result<Option<Cgroup>> {
        validate_name(name)?;
        let first = match layout.mode {
            Mode::V2 => unified(layout, name)?.join(PARENT).join(name),
            Mode::V1 | Mode::Hybrid => match super::v1::dirs_in(&layout.v1, name).into_values().next() {
                Some(dir) => dir,
                None => return Ok(None),
            },
        };
        if changed_within(&first, age) == Some(true) || !fs::procs(&first)?.is_empty() {
            return Ok(None);
        }
        let cgroup = match Cgroup::open(layout, name) {
            Ok(cgroup) => cgroup,
            Err(CgroupError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let old = cgroup.paths().iter().all(|dir| changed_within(dir, age) == Some(false));
        if !old || !cgroup.pids()?.is_empty() {
            return Ok(None);
        }
        Ok(Some(cgroup))
    }

    /// What lists the processes of many cgroups in `home` as [`Cgroup::pids_at`] lists one:
    /// for a listing of every workload (`vgpu ps`).
    pub fn reader(layout: &Layout, home: &super::CgroupHome) -> Result<CgroupReader> {
        let layout = layout.within(home)?;
        let parents: Vec<PathBuf> = match layout.mode {
            Mode::V2 => vec![unified(&layout, PARENT)?.join(PARENT)],
            Mode::V1 | Mode::Hybrid => super::manager::unique(Controller::USED.iter().filter_map(|c| layout.v1.get(c)).map(|mount| mount.join(PARENT))),
        };
        let freezer = match layout.mode {
            Mode::V2 => None,
            Mode::V1 | Mode::Hybrid => layout.v1.get(&Controller::Freezer).map(|mount| mount.join(PARENT)),
        };
        let parents: Vec<(PathBuf, Option<std::os::fd::OwnedFd>)> = parents
            .into_iter()
            .map(|dir| {
                let opened = nix::fcntl::open(&dir, nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty());
                // SAFETY: `open` returned a new descriptor that nothing else owns.
                let fd = opened.ok().map(|fd| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
                (dir, fd)
            })
            .collect();
        let freezer = freezer.and_then(|dir| parents.iter().position(|(d, _)| *d == dir));
        Ok(CgroupReader { layout, parents, freezer })
    }

    /// Reopens a cgroup from what [`Cgroup::spec`] returned (a state file). The directories
    /// need not exist any more: removing a removed cgroup is fine. The spec is checked to
    /// name `…/vgpu/<name>` directories only, so a damaged state file cannot point
    /// `remove` at another directory.
    pub fn from_spec(spec: &CgroupSpec) -> Result<Cgroup> {
        let imp: Box<dyn Manager> = match spec {
            CgroupSpec::V2 { name, dir } => {
                check_spec_dir(name, dir)?;
                Box::new(V2Cgroup::from_dir(name, dir.clone()))
            }
            CgroupSpec::V1 { name, dirs } => {
                if dirs.is_empty() {
                    return Err(CgroupError::InvalidSpec { reason: format!("cgroup {name:?} lists no directory") });
                }
                dirs.values().try_for_each(|dir| check_spec_dir(name, dir))?;
                Box::new(V1Cgroup::from_dirs(name, dirs.clone()))
            }
        };
        Ok(Cgroup::wrap(imp))
    }

    /// The names of every workload cgroup on the host (those under `vgpu/` in any
    /// hierarchy vgpu uses), sorted.
    pub fn list(layout: &Layout) -> Result<Vec<String>> {
        let parents: Vec<PathBuf> = match layout.mode {
            Mode::V2 => layout.unified.iter().map(|root| root.join(PARENT)).collect(),
            Mode::V1 | Mode::Hybrid => super::manager::unique(layout.v1.values().map(|m| m.join(PARENT))),
        };
        let mut names = Vec::new();
        for parent in parents {
            let entries = match std::fs::read_dir(&parent) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(fs::io_error("list", &parent, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| fs::io_error("list", &parent, e))?;
                let is_dir = entry.file_type().map_err(|e| fs::io_error("stat", &entry.path(), e))?.is_dir();
                if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn wrap(imp: Box<dyn Manager>) -> Cgroup {
        Cgroup { imp, timeout: DEFAULT_TIMEOUT }
    }

    /// How long `freeze`, `thaw`, `kill(SIGKILL)` and `remove` wait for the kernel.
    pub fn with_timeout(mut self, timeout: Duration) -> Cgroup {
        self.timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        self.imp.name()
    }

    /// What to store to reopen this cgroup later with [`Cgroup::from_spec`].
    pub fn spec(&self) -> CgroupSpec {
        self.imp.spec()
    }

    /// The cgroup's directories, one per hierarchy (one on v2).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.imp.dirs()
    }

    /// Sets the limits given; `None` fields are left as they are. Every value and every
    /// controller needed is checked before anything is written.
    pub fn apply(&self, limits: &Limits) -> Result<()> {
        self.imp.apply(limits)
    }

    /// `limits` less those this cgroup cannot enforce, and the controllers they needed: a
    /// cgroup v2 tree whose root offers no memory, cpu or pids controller (a host that binds
    /// them to v1, a container), a v1 host without a pids hierarchy. The caller says so
    /// once and goes on with the rest, rather than failing or writing nothing.
    pub fn enforceable(&self, limits: &Limits) -> Result<(Limits, Vec<Controller>)> {
        let mut enforceable = *limits;
        let mut missing = Vec::new();
        for controller in limits.needs() {
            if !self.imp.has(controller)? {
                enforceable = enforceable.without(controller);
                missing.push(controller);
            }
        }
        Ok((enforceable, missing))
    }

    /// Moves process `pid` (its whole thread group) into the cgroup, in every hierarchy.
    pub fn add_task(&self, pid: i32) -> Result<()> {
        self.imp.add_task(pid)
    }

    /// The `cgroup.procs` file of each hierarchy (one on v2): a process joins the cgroup
    /// by writing its pid, or `0`, to every one of them.
    pub fn procs_paths(&self) -> Vec<PathBuf> {
        self.imp.procs_files()
    }

    /// Every `cgroup.procs`, opened for writing (with `O_CLOEXEC`), for a forked child to
    /// join the cgroup before `exec` with nothing but `write(2)`: async-signal-safe, no
    /// allocation.
    ///
    /// The child writes `"0"`: in both cgroup versions the kernel reads pid 0 written to
    /// `cgroup.procs` as "the writing task" and moves its whole thread group
    /// (`cgroup_procs_write_start()` in kernel/cgroup/cgroup.c serves v1 and v2; the
    /// integration test checks it on the real hierarchy). That spares the child
    /// formatting its pid and is right inside a new pid namespace too. The kernel checks
    /// permission against the credentials of whoever opened the file (root, here), so
    /// the child may write before or after dropping privileges.
    pub fn procs_files(&self) -> Result<Vec<File>> {
        self.procs_paths()
            .iter()
            .map(|path| OpenOptions::new().write(true).open(path).map_err(|e| fs::io_error("open for writing", path, e)))
            .collect()
    }

    /// Like [`Cgroup::procs_files`], for a child that is still single-threaded (right
    /// after `fork`): on v1 these are the `tasks` files, which move the one thread without
    /// the global threadgroup lock (and its RCU grace period); on v2 `cgroup.procs`.
    /// Write `"0"` to each.
    pub fn self_join_files(&self) -> Result<Vec<File>> {
        self.imp
            .self_join_files()
            .iter()
            .map(|path| OpenOptions::new().write(true).open(path).map_err(|e| fs::io_error("open for writing", path, e)))
            .collect()
    }

    /// Every process in the cgroup, in any hierarchy (and in any cgroup nested below it),
    /// sorted. Processes the caller's pid namespace cannot see (listed as 0) are left out.
    pub fn pids(&self) -> Result<Vec<i32>> {
        self.imp.pids()
    }

    /// Freezes every process and waits until the kernel reports the cgroup frozen. On
    /// timeout the cgroup is thawed again and [`CgroupError::Timeout`] returned.
    pub fn freeze(&self) -> Result<()> {
        self.imp.freeze(self.timeout)
    }

    /// [`Cgroup::freeze`], waiting at most `timeout` whatever the handle's timeout.
    pub fn freeze_within(&self, timeout: Duration) -> Result<()> {
        self.imp.freeze(timeout)
    }

    pub fn thaw(&self) -> Result<()> {
        self.imp.thaw(self.timeout)
    }

    /// Lets `pids`, SIGKILLed while the cgroup is frozen, die without thawing the rest of
    /// it (a suspended workload's offenders: its other processes must not run). v2 needs
    /// nothing; v1 moves them, in the freezer hierarchy only, to the thawed parent.
    pub fn release_killed(&self, pids: &[i32]) -> Result<()> {
        self.imp.release_killed(pids)
    }

    pub fn state(&self) -> Result<FreezerState> {
        self.imp.state()
    }

    pub fn stats(&self) -> Result<Stats> {
        self.imp.stats()
    }

    /// Processes the kernel's OOM killer killed in the cgroup so far (`None`: not counted
    /// here). Read it before [`Cgroup::remove`].
    pub fn oom_kills(&self) -> Result<Option<u64>> {
        self.imp.oom_kills()
    }

    /// Sends `signal` to every process; returns how many were signalled. For SIGKILL it
    /// then thaws the cgroup if frozen (a task frozen by the v1 freezer cannot die; sending
    /// first means none runs user code again) and signals again until the cgroup is empty,
    /// or fails with [`CgroupError::Populated`] after the timeout. A signal to a frozen
    /// cgroup other than SIGKILL is delivered when it is thawed.
    pub fn kill(&self, signal: Signal) -> Result<usize> {
        match self.kill_inner(signal) {
            // Removed under us (its workload ended and was torn down meanwhile: reading
            // `cgroup.procs` of a cgroup being removed fails with ENODEV, of one removed
            // with ENOENT): nothing is left to signal.
            Err(e) if self.vanished(&e) => Ok(0),
            other => other,
        }
    }

    /// SIGKILL every process, frozen or not, and wait (up to the timeout) until none is
    /// left: through `cgroup.kill` where the kernel has it (v2, 5.14 and later: one write,
    /// which no fork outruns), else as [`Cgroup::kill`] with SIGKILL does (signal, thaw if
    /// frozen, signal again what is left). Returns how many processes there were.
    pub fn kill_all(&self) -> Result<usize> {
        let Some(file) = self.imp.kill_file() else { return self.kill(Signal::SIGKILL) };
        let pids = match self.pids() {
            Ok(pids) => pids,
            Err(e) if self.vanished(&e) => return Ok(0),
            Err(e) => return Err(e),
        };
        match fs::write(&file, "1") {
            Ok(()) => {}
            Err(e) if self.vanished(&e) => return Ok(0),
            Err(e) => return Err(e),
        }
        let mut left = Vec::new();
        let empty = fs::poll_until(self.timeout, || {
            left = self.pids()?;
            Ok(left.is_empty())
        });
        match empty {
            Ok(true) => Ok(pids.len()),
            Ok(false) => Err(self.populated(left)),
            Err(e) if self.vanished(&e) => Ok(pids.len()),
            Err(e) => Err(e),
        }
    }

    /// Whether `e` says the cgroup is gone, or it is gone in any hierarchy now.
    fn vanished(&self, e: &CgroupError) -> bool {
        let removed = matches!(e, CgroupError::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENODEV) | Some(libc::ENOENT)));
        removed || self.paths().iter().any(|dir| std::fs::symlink_metadata(dir).is_err())
    }

    fn kill_inner(&self, signal: Signal) -> Result<usize> {
        let pids = self.pids()?;
        self.signal_all(&pids, signal)?;
        if signal != Signal::SIGKILL {
            return Ok(pids.len());
        }
        if self.state()? != FreezerState::Thawed {
            self.thaw()?;
        }
        let mut left = Vec::new();
        let empty = fs::poll_until(self.timeout, || {
            left = self.pids()?;
            // Children forked between the listing and the signal are caught here.
            self.signal_all(&left, Signal::SIGKILL)?;
            Ok(left.is_empty())
        })?;
        if !empty {
            return Err(self.populated(left));
        }
        Ok(pids.len())
    }

    /// Removes the cgroup from every hierarchy (and any cgroup nested below it), killing
    /// the processes still inside with SIGKILL first (see [`Cgroup::kill`]); a frozen
    /// cgroup is thawed. Removing a cgroup that is gone, in some or all hierarchies, is
    /// fine. The `vgpu` parent stays.
    pub fn remove(&self) -> Result<()> {
        self.evacuate(Leftovers::Kill)?;
        self.remove_dirs()
    }

    /// [`Cgroup::remove`], but a cgroup that still holds processes is left as it is and
    /// [`CgroupError::Populated`] returned.
    pub fn remove_if_empty(&self) -> Result<()> {
        self.evacuate(Leftovers::Refuse)?;
        self.remove_dirs()
    }

    /// The part of `remove` before the `rmdir`s.
    fn evacuate(&self, leftovers: Leftovers) -> Result<()> {
        let pids = self.pids()?;
        if pids.is_empty() {
            if self.state()? != FreezerState::Thawed {
                self.thaw()?;
            }
            return Ok(());
        }
        match leftovers {
            Leftovers::Refuse => Err(self.populated(pids)),
            Leftovers::Kill => self.kill(Signal::SIGKILL).map(|_| ()),
        }
    }

    fn remove_dirs(&self) -> Result<()> {
        self.paths().iter().try_for_each(|dir| fs::remove_tree(dir, self.timeout))
    }

    fn signal_all(&self, pids: &[i32], signal: Signal) -> Result<()> {
        for &pid in pids {
            // pids() never yields 0 or a negative number: this is one process, never a group.
            match signal::kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(source) => return Err(CgroupError::Signal { pid, signal, path: self.display_path(), source }),
            }
        }
        Ok(())
    }

    fn populated(&self, pids: Vec<i32>) -> CgroupError {
        CgroupError::Populated { path: self.display_path(), pids }
    }

    /// The cgroup as error messages name it: its directory on v2, `vgpu/<name>` on v1.
    fn display_path(&self) -> PathBuf {
        match self.imp.spec() {
            CgroupSpec::V2 { dir, .. } => dir,
            CgroupSpec::V1 { name, .. } => Path::new(PARENT).join(name),
        }
    }
}

/// The unified hierarchy of a v2 layout.
/// Whether `dir` was last changed less than `age` ago; `None` when that cannot be told (it
/// is not there, or its time is in the future).
fn changed_within(dir: &Path, age: Duration) -> Option<bool> {
    let elapsed = std::fs::symlink_metadata(dir).and_then(|m| m.modified()).ok()?.elapsed().ok()?;
    Some(elapsed < age)
}

fn unified<'a>(layout: &'a Layout, name: &str) -> Result<&'a Path> {
    layout.unified.as_deref().ok_or_else(|| CgroupError::NoHierarchy { name: name.to_string() })
}

/// The processes (and freezer states) of many cgroups of one home ([`Cgroup::reader`]),
/// each read as [`Cgroup::pids_at`] (and [`Cgroup::freezer_state_at`]) reads it: every hierarchy's `vgpu/` directory is opened once, and each
/// cgroup's `cgroup.procs` relative to it, so that a listing of N workloads walks N short
/// paths through cgroupfs, not N whole ones (`vgpu ps` with 1000 workloads on a v1 host:
/// 5000 opens of `cgroup.procs`).
#[derive(Debug)]
pub struct CgroupReader {
    /// The layout within the home.
    layout: Layout,
    /// Per hierarchy: its `vgpu/` directory, opened (None: it cannot be, and no cgroup below
    /// it exists).
    parents: Vec<(PathBuf, Option<std::os::fd::OwnedFd>)>,
    /// On v1: which of `parents` is the freezer hierarchy's.
    freezer: Option<usize>,
}

impl CgroupReader {
    /// Every process in cgroup `name` (and in any cgroup nested below it), in any hierarchy,
    /// sorted; none when it does not exist.
    pub fn pids(&self, name: &str) -> Result<Vec<i32>> {
        validate_name(name)?;
        let mut pids = Vec::new();
        for (dir, at) in &self.parents {
            match at {
                Some(at) => fs::procs_recursive_at(at, dir, name, &mut pids)?,
                None => fs::procs_recursive(&dir.join(name), &mut pids)?,
            }
        }
        pids.sort();
        pids.dedup();
        Ok(pids)
    }

    /// The freezer state of cgroup `name`, as [`Cgroup::freezer_state_at`] reads it.
    pub fn freezer_state(&self, name: &str) -> Result<FreezerState> {
        validate_name(name)?;
        match self.freezer.and_then(|i| self.parents.get(i)) {
            Some((dir, Some(at))) => {
                let relative = Path::new(name).join(super::v1::FREEZER_STATE);
                super::v1::freezer_state_of(&dir.join(&relative), fs::read_opt_at(at, dir, &relative)?.as_deref())
            }
            _ => Cgroup::freezer_state_at(&self.layout, &super::CgroupHome::default(), name),
        }
    }
}

/// A [`CgroupReader`] per cgroup home, each made at the first cgroup of its home asked for:
/// what reconcile and `vgpu ps` read every workload's cgroup through. Where a home's reader
/// cannot be made, its cgroups are read by their whole paths, as before.
#[derive(Debug)]
pub struct CgroupReaders<'a> {
    layout: &'a Layout,
    readers: std::cell::RefCell<Vec<(super::CgroupHome, Option<CgroupReader>)>>,
}

impl<'a> CgroupReaders<'a> {
    pub fn new(layout: &'a Layout) -> CgroupReaders<'a> {
        CgroupReaders { layout, readers: Default::default() }
    }

    fn with<T>(&self, home: &super::CgroupHome, read: impl FnOnce(Option<&CgroupReader>) -> T) -> T {
        let mut readers = self.readers.borrow_mut();
        let at = match readers.iter().position(|(h, _)| h == home) {
            Some(at) => at,
            None => {
                readers.push((home.clone(), Cgroup::reader(self.layout, home).ok()));
                readers.len() - 1
            }
        };
        read(readers[at].1.as_ref())
    }

    /// [`Cgroup::pids_at`].
    pub fn pids(&self, home: &super::CgroupHome, name: &str) -> Result<Vec<i32>> {
        self.with(home, |reader| match reader {
            Some(reader) => reader.pids(name),
            None => Cgroup::pids_at(self.layout, home, name),
        })
    }

    /// [`Cgroup::freezer_state_at`].
    pub fn freezer_state(&self, home: &super::CgroupHome, name: &str) -> Result<FreezerState> {
        self.with(home, |reader| match reader {
            Some(reader) => reader.freezer_state(name),
            None => Cgroup::freezer_state_at(self.layout, home, name),
        })
    }
}

/// A workload name becomes a directory name in every hierarchy: one plain component,
/// nothing the kernel or a shell would read specially.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 128 {
        Some("it is longer than 128 bytes")
    } else if !name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        Some("it must start with a letter or digit")
    } else if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        Some("only letters, digits, '-', '_' and '.' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidName { name: name.to_string(), reason }),
        None => Ok(()),
    }
}

fn check_spec_dir(name: &str, dir: &Path) -> Result<()> {
    validate_name(name).map_err(|e| CgroupError::InvalidSpec { reason: e.to_string() })?;
    let parent_name = dir.parent().and_then(Path::file_name);
    if !dir.is_absolute() || dir.file_name().and_then(|n| n.to_str()) != Some(name) || parent_name != Some(PARENT.as_ref()) {
        return Err(CgroupError::InvalidSpec { reason: format!("{} is not a vgpu/{name} cgroup directory", dir.display()) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs as stdfs;

    use super::*;
    use crate::fake::FakeV1;
    use crate::fake::FakeV2;
    use crate::layout::Controller;

    #[test]
    fn killing_a_cgroup_removed_meanwhile_is_success() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let cgroup = Cgroup::create(&fake.layout(), "gone").unwrap();
        for mount in ["cpu,cpuacct", "memory", "pids", "freezer"] {
            stdfs::remove_dir_all(fake.root().join(mount).join("vgpu/gone")).unwrap();
        }
        assert_eq!(cgroup.kill(Signal::SIGTERM).unwrap(), 0);
        assert_eq!(cgroup.kill(Signal::SIGKILL).unwrap(), 0);
    }

    #[test]
    fn limits_a_cgroup_cannot_enforce_are_set_apart() {
        // v2: the tree offers cpu only (as a container's on a host that binds memory and
        // pids to v1 offers none).
        let fake = FakeV2::new(&["cpu"]);
        let cgroup = Cgroup::create(&fake.layout(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        stdfs::write(fake.root().join("vgpu/job1/cgroup.controllers"), "cpu\n").unwrap();
        let limits = Limits { cpus: Some(1.0), memory: Some(64 << 20), pids: Some(10) };
        let (enforceable, missing) = cgroup.enforceable(&limits).unwrap();
        assert_eq!(missing, vec![Controller::Memory, Controller::Pids]);
        assert_eq!(enforceable, Limits { cpus: Some(1.0), memory: None, pids: None });
        cgroup.apply(&enforceable).unwrap();
        assert_eq!(fake.read("vgpu/job1/cpu.max"), "100000 100000");
        // v1: no pids hierarchy.
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "freezer"]);
        let cgroup = Cgroup::create(&fake.layout(), "job2").unwrap();
        let (enforceable, missing) = cgroup.enforceable(&limits).unwrap();
        assert_eq!(missing, vec![Controller::Pids]);
        assert_eq!(enforceable, Limits { cpus: Some(1.0), memory: Some(64 << 20), pids: None });
        // Nothing missing: the limits as given.
        assert_eq!(cgroup.enforceable(&Limits::default()).unwrap(), (Limits::default(), Vec::new()));
    }

    #[test]
    fn the_freezer_state_read_alone_is_what_the_opened_cgroup_says() {
        let home = crate::CgroupHome::default();
        let same = |layout: &Layout, name: &str| {
            let alone = Cgroup::freezer_state_at(layout, &home, name).unwrap();
            let opened = Cgroup::open_at(layout, &home, name).unwrap().state().unwrap();
            assert_eq!(alone, opened, "{name}");
            // Through a reader (reconcile's look at every workload).
            assert_eq!(Cgroup::reader(layout, &home).unwrap().freezer_state(name).unwrap(), alone, "{name}: the reader");
            assert_eq!(CgroupReaders::new(layout).freezer_state(&home, name).unwrap(), alone, "{name}: the readers");
            alone
        };
        // v1: no such cgroup, thawed, frozen; and a host without a freezer hierarchy.
        let v1 = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = v1.layout();
        assert_eq!(Cgroup::freezer_state_at(&layout, &home, "job1").unwrap(), FreezerState::Thawed, "none: nothing frozen");
        assert_eq!(Cgroup::reader(&layout, &home).unwrap().freezer_state("job1").unwrap(), FreezerState::Thawed, "none: nothing frozen");
        let cg = Cgroup::create(&layout, "job1").unwrap();
        v1.kernel_populate("job1");
        assert_eq!(same(&layout, "job1"), FreezerState::Thawed);
        cg.freeze().unwrap();
        assert_eq!(same(&layout, "job1"), FreezerState::Frozen);
        let no_freezer = FakeV1::new(&["cpu,cpuacct", "memory", "pids"]);
        Cgroup::create(&no_freezer.layout(), "job1").unwrap();
        no_freezer.kernel_populate("job1");
        assert_eq!(same(&no_freezer.layout(), "job1"), FreezerState::Thawed);
        // v2: cgroup.freeze asked, cgroup.events says.
        let v2 = FakeV2::new(&["cpu", "memory", "pids"]);
        let layout = v2.layout();
        assert_eq!(Cgroup::freezer_state_at(&layout, &home, "job1").unwrap(), FreezerState::Thawed, "none: nothing frozen");
        Cgroup::create(&layout, "job1").unwrap();
        v2.kernel_populate("vgpu/job1");
        assert_eq!(same(&layout, "job1"), FreezerState::Thawed);
        stdfs::write(v2.root().join("vgpu/job1/cgroup.freeze"), "1\n").unwrap();
        assert_eq!(same(&layout, "job1"), FreezerState::Freezing);
        stdfs::write(v2.root().join("vgpu/job1/cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        assert_eq!(same(&layout, "job1"), FreezerState::Frozen);
        // Never a path other than a workload's.
        assert!(matches!(Cgroup::freezer_state_at(&layout, &home, "../x"), Err(CgroupError::InvalidName { .. })));
    }

    #[test]
    fn processes_of_nested_cgroups_are_listed_and_pids_at_lists_what_open_lists() {
        let home = crate::CgroupHome::default();
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        // Made before any workload's cgroup (no `vgpu/` yet), and after.
        let early = Cgroup::reader(&layout, &home).unwrap();
        assert_eq!(Cgroup::pids_at(&layout, &home, "job1").unwrap(), Vec::<i32>::new(), "no such cgroup: no process");
        assert_eq!(early.pids("job1").unwrap(), Vec::<i32>::new());
        Cgroup::create(&layout, "job1").unwrap();
        fake.kernel_populate("job1");
        let reader = Cgroup::reader(&layout, &home).unwrap();
        assert_eq!(Cgroup::pids_at(&layout, &home, "job1").unwrap(), Vec::<i32>::new());
        assert_eq!(reader.pids("job1").unwrap(), Vec::<i32>::new());
        assert_eq!(reader.pids("job2").unwrap(), Vec::<i32>::new(), "no such cgroup: no process");
        stdfs::write(fake.root().join("pids/vgpu/job1/cgroup.procs"), "11\n").unwrap();
        assert_eq!(reader.pids("job1").unwrap(), vec![11]);
        // A workload run as root may nest cgroups, in one hierarchy and deeper.
        let inner = fake.root().join("memory/vgpu/job1/inner");
        stdfs::create_dir_all(inner.join("deeper")).unwrap();
        stdfs::write(inner.join("cgroup.procs"), "22\n").unwrap();
        stdfs::write(inner.join("deeper/cgroup.procs"), "33\n11\n").unwrap();
        let opened = Cgroup::open_at(&layout, &home, "job1").unwrap().pids().unwrap();
        assert_eq!(opened, vec![11, 22, 33]);
        assert_eq!(Cgroup::pids_at(&layout, &home, "job1").unwrap(), opened);
        assert_eq!(reader.pids("job1").unwrap(), opened, "the reader lists what open lists");
        assert_eq!(early.pids("job1").unwrap(), opened, "a reader made before vgpu/ existed");
        assert!(matches!(Cgroup::pids_at(&layout, &home, "a/b"), Err(CgroupError::InvalidName { .. })));
        assert!(matches!(reader.pids("a/b"), Err(CgroupError::InvalidName { .. })));
        assert!(matches!(reader.pids(".."), Err(CgroupError::InvalidName { .. })));
    }

    #[test]
    fn only_an_old_cgroup_without_processes_is_idle() {
        let mounts = ["cpu,cpuacct", "memory", "pids", "freezer"];
        let fake = FakeV1::new(&mounts);
        let layout = fake.layout();
        let grace = Duration::from_secs(60);
        let age = |name: &str, by: Duration| {
            for mount in mounts {
                let dir = stdfs::File::open(fake.root().join(mount).join("vgpu").join(name)).unwrap();
                dir.set_modified(std::time::SystemTime::now() - by).unwrap();
            }
        };
        assert!(Cgroup::open_if_idle(&layout, "none", grace).unwrap().is_none(), "no such cgroup");
        for name in ["young", "old", "busy", "nested"] {
            Cgroup::create(&layout, name).unwrap();
            fake.kernel_populate(name);
        }
        // A process in a hierarchy other than the first, and one in a nested cgroup.
        stdfs::write(fake.root().join("pids/vgpu/busy/cgroup.procs"), "7\n").unwrap();
        stdfs::create_dir(fake.root().join("freezer/vgpu/nested/inner")).unwrap();
        stdfs::write(fake.root().join("freezer/vgpu/nested/inner/cgroup.procs"), "8\n").unwrap();
        for name in ["old", "busy", "nested"] {
            age(name, grace * 2);
        }
        assert!(Cgroup::open_if_idle(&layout, "young", grace).unwrap().is_none());
        assert!(Cgroup::open_if_idle(&layout, "busy", grace).unwrap().is_none());
        assert!(Cgroup::open_if_idle(&layout, "nested", grace).unwrap().is_none());
        let idle = Cgroup::open_if_idle(&layout, "old", grace).unwrap().expect("old and empty");
        assert_eq!(idle.name(), "old");
        // One young directory is enough to keep it (another store may be creating it).
        let dir = stdfs::File::open(fake.root().join("memory/vgpu/old")).unwrap();
        dir.set_modified(std::time::SystemTime::now()).unwrap();
        assert!(Cgroup::open_if_idle(&layout, "old", grace).unwrap().is_none());
    }

    #[test]
    fn names_are_single_plain_components() {
        for good in ["job1", "w-1a2b", "A_b.c", "7"] {
            validate_name(good).unwrap();
        }
        for bad in ["", ".", "..", "../x", "a/b", "-x", "a b", "a\n", ".hidden", &"x".repeat(129)] {
            let err = validate_name(bad).unwrap_err();
            assert!(matches!(err, CgroupError::InvalidName { .. }), "{bad:?}");
        }
    }

    #[test]
    fn mode_picks_the_implementation() {
        let v1 = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let cg = Cgroup::create(&v1.layout(), "job1").unwrap();
        assert!(matches!(cg.spec(), CgroupSpec::V1 { .. }));
        assert_eq!(cg.paths().len(), 4);

        let v2 = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = Cgroup::create(&v2.layout(), "job1").unwrap();
        assert_eq!(cg.spec(), CgroupSpec::V2 { name: "job1".into(), dir: v2.root().join("vgpu/job1") });
        assert_eq!(cg.procs_paths(), vec![v2.root().join("vgpu/job1/cgroup.procs")]);
    }

    #[test]
    fn create_open_list_and_spec() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        assert!(matches!(Cgroup::open(&layout, "job1"), Err(CgroupError::NotFound { .. })));
        assert!(Cgroup::list(&layout).unwrap().is_empty());
        let cg = Cgroup::create(&layout, "job1").unwrap();
        Cgroup::create(&layout, "job2").unwrap();
        assert!(matches!(Cgroup::create(&layout, "job1"), Err(CgroupError::AlreadyExists { .. })));
        assert!(matches!(Cgroup::create(&layout, "../etc"), Err(CgroupError::InvalidName { .. })));
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["job1", "job2"]);

        let opened = Cgroup::open(&layout, "job1").unwrap();
        assert_eq!(opened.spec(), cg.spec());
        let json = serde_json::to_string(&cg.spec()).unwrap();
        let back = Cgroup::from_spec(&serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(back.paths(), cg.paths());
    }

    #[test]
    fn from_spec_refuses_other_directories() {
        let bad = [
            CgroupSpec::V2 { name: "job".into(), dir: "/etc".into() },
            CgroupSpec::V2 { name: "job".into(), dir: "/sys/fs/cgroup/job".into() },
            CgroupSpec::V2 { name: "job".into(), dir: "vgpu/job".into() },
            CgroupSpec::V2 { name: "..".into(), dir: "/sys/fs/cgroup/vgpu/..".into() },
            CgroupSpec::V1 { name: "job".into(), dirs: BTreeMap::new() },
            CgroupSpec::V1 {
                name: "job".into(),
                dirs: [(Controller::Cpu, PathBuf::from("/sys/fs/cgroup/cpu/vgpu/other"))].into_iter().collect(),
            },
        ];
        for spec in bad {
            assert!(matches!(Cgroup::from_spec(&spec), Err(CgroupError::InvalidSpec { .. })), "{spec:?}");
        }
    }

    #[test]
    fn procs_files_are_opened_for_writing() {
        use std::io::Write;
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let cg = Cgroup::create(&fake.layout(), "job1").unwrap();
        fake.kernel_populate("job1");
        for mut file in cg.procs_files().unwrap() {
            file.write_all(b"0").unwrap();
        }
        for sub in ["cpu", "memory", "pids", "freezer"] {
            assert_eq!(fake.read(&format!("{sub}/vgpu/job1/cgroup.procs")), "0");
        }
        stdfs::remove_file(fake.root().join("pids/vgpu/job1/cgroup.procs")).unwrap();
        let err = cg.procs_files().unwrap_err();
        assert!(matches!(&err, CgroupError::Io { op: "open for writing", path, .. } if path.starts_with(fake.root().join("pids"))));
    }

    #[test]
    fn remove_thaws_then_removes_every_hierarchy() {
        let fake = FakeV1::new(&["cpu", "memory", "pids", "freezer"]);
        let cg = Cgroup::create(&fake.layout(), "job1").unwrap();
        fake.kernel_populate("job1");
        cg.freeze().unwrap();
        // The kernel's rmdir takes a cgroup's files with it; a tempdir's does not, so
        // check the step before the rmdirs, then let the "kernel" drop the files.
        cg.evacuate(Leftovers::Refuse).unwrap();
        assert_eq!(fake.read("freezer/vgpu/job1/freezer.state"), "THAWED");
        fake.kernel_forget_files("job1");
        cg.remove_if_empty().unwrap();
        for sub in ["cpu", "memory", "pids", "freezer"] {
            assert!(!fake.root().join(sub).join("vgpu/job1").exists(), "{sub}");
            assert!(fake.root().join(sub).join("vgpu").exists(), "the parent stays");
        }
        // Idempotent: gone everywhere, or only in some hierarchies.
        cg.remove().unwrap();
        stdfs::create_dir(fake.root().join("pids/vgpu/job1")).unwrap();
        cg.remove().unwrap();
        assert!(!fake.root().join("pids/vgpu/job1").exists());
    }

    #[test]
    fn remove_refuses_a_populated_cgroup_when_asked() {
        let fake = FakeV2::new(&["cpu", "memory", "pids"]);
        let cg = Cgroup::create(&fake.layout(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        // A pid that cannot be a real process: Refuse must never signal anything.
        stdfs::write(fake.root().join("vgpu/job1/cgroup.procs"), "4194305\n").unwrap();
        let err = cg.remove_if_empty().unwrap_err();
        assert!(matches!(&err, CgroupError::Populated { pids, .. } if pids == &[4194305]), "{err}");
        assert!(fake.root().join("vgpu/job1").is_dir());
    }

    #[test]
    fn pid_zero_is_never_signalled() {
        // cgroup.procs lists 0 for tasks outside the reader's pid namespace; kill(0, …)
        // would hit our own process group.
        let fake = FakeV2::new(&["cpu"]);
        let cg = Cgroup::create(&fake.layout(), "job1").unwrap();
        fake.kernel_populate("vgpu/job1");
        stdfs::write(fake.root().join("vgpu/job1/cgroup.procs"), "0\n0\n").unwrap();
        assert!(cg.pids().unwrap().is_empty());
        assert_eq!(cg.kill(Signal::SIGTERM).unwrap(), 0);
    }
}
