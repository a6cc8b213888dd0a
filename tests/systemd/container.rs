//! A real systemd as PID 1, in a container made from this machine itself (no download):
//! a root directory of a read-only bind of the host's `/usr` and a copy of its `/etc`,
//! booted with `systemd-nspawn --boot` inside a private mount namespace with a tmpfs on
//! `/run`, entered with `nsenter`. Knows nothing of vgpu: `tests/systemd/installed.rs`
//! installs it inside; `benches/systemd_container.rs` times this module's steps.
//!
//! Two cgroup layouts, as real hosts have them:
//! - [`Tree::Hybrid`]: this host's own (cgroup v1 controllers, systemd's tracking in the
//!   unified hierarchy). systemd-nspawn mounts the controller hierarchies read-only, so the
//!   container's systemd would manage none of them, where a real hybrid host's systemd
//!   gives every unit a cgroup in each (and `Delegate=yes` hands it over). The harness
//!   makes them writable after boot and has systemd re-execute itself (which probes the
//!   controllers again), so that the container is such a host. The container's controller
//!   roots are cgroups the harness made for it (below), so nothing of the host's own tree
//!   is within its reach.
//! - [`Tree::Unified`] (`SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1`): a real, writable cgroup v2
//!   tree at `/sys/fs/cgroup`, with no controllers on a host whose memory, cpu and pids are
//!   bound to v1 (`cgroup.procs`, `cgroup.freeze`, `cgroup.kill`, `cgroup.events` work).
//!
//! Everything the container is lives in three places, all removed by [`Container`]'s
//! `Drop`, pass or fail: its processes (its PID namespace, killed with its init), its
//! mounts (in a mount namespace of its own, gone with its last process) and its cgroups
//! (one directory per hierarchy, below this process's own, removed deepest first). It is
//! not registered with systemd-machined (`--register=no`), and it has a network namespace
//! of its own (`--private-network`, a loopback only), so two containers never share a port.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Which cgroup tree the container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// cgroup v1 controllers + systemd's unified hierarchy: this host's layout.
    Hybrid,
    /// A pure cgroup v2 tree (`SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1`).
    Unified,
}

impl Tree {
    pub fn name(self) -> &'static str {
        match self {
            Tree::Hybrid => "hybrid v1",
            Tree::Unified => "unified v2",
        }
    }
}

/// How long the container may take to come up (a loaded CI machine) and to halt.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);
const HALT_TIMEOUT: Duration = Duration::from_secs(10);

/// Hierarchies the container gets a cgroup of its own in: systemd's tracking ones and the
/// controllers vgpu uses. Others (cpuset, whose new cgroups start with no CPUs; devices;
/// blkio…) stay the test process's.
const OWN_HIERARCHIES: [&str; 7] = ["", "name=systemd", "cpu", "cpuacct", "memory", "pids", "freezer"];

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// How long each step took, for the figures (`benches/systemd_container.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// From the first mkdir to `systemctl is-system-running` saying running (or degraded),
    /// the hybrid tree's re-execution included.
    pub boot: Duration,
}

/// One booted container; torn down (everything in it killed, its cgroups and directory
/// removed) when dropped.
pub struct Container {
    pub tree: Tree,
    pub name: String,
    work: Option<tempfile::TempDir>,
    nspawn: Option<Child>,
    /// The container's systemd, as this (the host's) PID namespace numbers it.
    init: u32,
    /// The cgroup directories made for it, one per hierarchy (host paths).
    cgroups: Vec<PathBuf>,
    pub timings: Timings,
    /// Its place among the containers that may run at once (released after its teardown:
    /// fields drop after `Drop::drop`).
    _slot: Slot,
}

/// At most this many containers at once in the harness, whatever `RUST_TEST_THREADS` says:
/// each boots a whole systemd, and on a 2-core machine four at once starved a stop's
/// signal relay of its time (`scope::a_shells_run_gets_a_scope_on_the_unified_tree`).
const AT_ONCE: usize = 2;

static RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// One of the [`AT_ONCE`] places, taken until dropped.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let mut running = RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *running >= AT_ONCE {
            running = FREED.wait(running).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner) -= 1;
        FREED.notify_one();
    }
}

impl Container {
    /// Boots a container whose `binds` (host directories) are bound read-only at the same
    /// paths inside. Fails (never skips) when it cannot boot, saying why.
    pub fn boot(tree: Tree, binds: &[PathBuf]) -> Result<Container, String> {
        let slot = Slot::take();
        let started = Instant::now();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("vgpu-sd-{}-{n}", std::process::id());
        let work = tempfile::Builder::new().prefix("vgpu-systemd-").tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let mut ct = Container { tree, name, work: Some(work), nspawn: None, init: 0, cgroups: Vec::new(), timings: Timings::default(), _slot: slot };
        ct.make_root()?;
        ct.make_cgroups()?;
        ct.start(binds)?;
        ct.wait_running()?;
        if tree == Tree::Hybrid {
            ct.writable_controllers()?;
        }
        ct.timings.boot = started.elapsed();
        Ok(ct)
    }

    fn work(&self) -> &Path {
        self.work.as_ref().map(|w| w.path()).expect("the container's directory lives as long as it")
    }

    /// The container's root directory, as the host sees it.
    fn root(&self) -> PathBuf {
        self.work().join("root")
    }

    /// `/usr` bound read-only from the host, `/etc` copied (without the host's enabled
    /// units: nothing the host runs starts in the container), the rest empty.
    fn make_root(&self) -> Result<(), String> {
        let root = self.root();
        for dir in ["usr", "dev", "proc", "sys", "run", "tmp", "root", "home", "srv", "opt", "mnt", "media", "var/tmp", "var/lib", "var/log", "var/cache", "var/spool"] {
            std::fs::create_dir_all(root.join(dir)).map_err(|e| format!("mkdir {dir}: {e}"))?;
        }
        for (dir, mode) in [("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)] {
            std::fs::set_permissions(root.join(dir), std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(|e| format!("chmod {dir}: {e}"))?;
        }
        // /bin, /lib… are links into /usr on a merged-/usr system.
        for link in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            if let Ok(target) = std::fs::read_link(Path::new("/").join(link)) {
                std::os::unix::fs::symlink(target, root.join(link)).map_err(|e| format!("ln {link}: {e}"))?;
            }
        }
        run_quiet(Command::new("cp").arg("-a").arg("/etc").arg(root.join("etc")))?;
        let etc = root.join("etc");
        let system = etc.join("systemd/system");
        if let Ok(entries) = std::fs::read_dir(&system) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".wants") || name.starts_with("vgpu") {
                    let _ = std::fs::remove_dir_all(entry.path()).or_else(|_| std::fs::remove_file(entry.path()));
                }
            }
        }
        let _ = std::fs::remove_dir_all(etc.join("vgpu"));
        // Empty: systemd gives the container a transient id (from its UUID).
        std::fs::write(etc.join("machine-id"), "").map_err(|e| format!("machine-id: {e}"))?;
        Ok(())
    }

    /// A cgroup of its own in each hierarchy of [`OWN_HIERARCHIES`], below this process's:
    /// systemd-nspawn (`--keep-unit`) starts in it, and its cgroup namespace is rooted there.
    fn make_cgroups(&mut self) -> Result<(), String> {
        let mounts = cgroup_mounts();
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        for line in own.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(_), Some(names), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
            if !own_hierarchy(names) {
                continue;
            }
            let Some(mount) = mounts.iter().find(|(opts, _)| same_hierarchy(names, opts)).map(|(_, m)| m.clone()) else { continue };
            let dir = mount.join(path.trim_start_matches('/')).join(&self.name);
            std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            self.cgroups.push(dir);
        }
        if self.cgroups.is_empty() {
            return Err("no cgroup hierarchy found in /proc/self/cgroup and /proc/self/mountinfo".into());
        }
        Ok(())
    }

    /// systemd-nspawn, in this container's cgroups, in a mount namespace of its own where
    /// `/run` is a tmpfs (systemd-nspawn removes its propagation directory there, which it
    /// refuses to do on a disk) and the rootfs's `/usr` the host's, read-only.
    fn start(&mut self, binds: &[PathBuf]) -> Result<(), String> {
        let log = std::fs::File::create(self.work().join("console.log")).map_err(|e| format!("console.log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("console.log: {e}"))?;
        let procs: Vec<String> = self.cgroups.iter().map(|d| d.join("cgroup.procs").display().to_string()).collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-euc")
            .arg(concat!(
                // Join the container's cgroups, then a private mount namespace (exec keeps the pid).
                "for f in $VGPU_SD_PROCS; do echo $$ > \"$f\"; done; ",
                "exec unshare --mount --propagation private sh -euc '",
                "mount -t tmpfs -o mode=755 tmpfs /run; mkdir -p /run/systemd/nspawn; ",
                "mount --bind /usr \"$0/usr\"; mount -o remount,bind,ro \"$0/usr\"; ",
                "exec systemd-nspawn \"$@\"' \"$@\""
            ))
            .arg("sh")
            .arg(self.root())
            .args(["--register=no", "--keep-unit", "--console=read-only", "--private-network", "--quiet"])
            .arg(format!("--directory={}", self.root().display()))
            .arg(format!("--machine={}", self.name));
        for bind in binds {
            cmd.arg(format!("--bind-ro={}", bind.display()));
        }
        cmd.arg("--boot").env("VGPU_SD_PROCS", procs.join(" ")).env_remove("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY");
        if self.tree == Tree::Unified {
            cmd.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1");
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(err);
        // Its own process group: a terminal's Ctrl-C for the test run does not reach it
        // (the Drop guard stops it in order).
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|e| format!("cannot start systemd-nspawn (install systemd-container): {e}"))?;
        self.nspawn = Some(child);
        Ok(())
    }

    /// Waits for the container's systemd (the child of systemd-nspawn), then for
    /// `systemctl is-system-running` to say `running` or `degraded`.
    fn wait_running(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let nspawn = self.nspawn.as_ref().map(Child::id).unwrap_or(0);
        loop {
            if let Some(status) = self.nspawn.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!("systemd-nspawn exited ({status}) before systemd ran:\n{}", self.console_tail()));
            }
            if self.init == 0 {
                self.init = child_named(nspawn, "systemd").unwrap_or(0);
            }
            if self.init != 0 {
                let state = self.state();
                if state == "running" || state == "degraded" {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("systemd did not come up within {BOOT_TIMEOUT:?} (state {:?}):\n{}", self.state(), self.console_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn state(&self) -> String {
        self.nsenter(&["systemctl", "is-system-running"]).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
    }

    /// The hybrid tree as a real hybrid host has it: the v1 controller hierarchies (which
    /// systemd-nspawn mounts read-only) made writable, then systemd re-executed so that it
    /// probes them again and gives units cgroups there.
    fn writable_controllers(&mut self) -> Result<(), String> {
        let mountinfo = self.output(&["cat", "/proc/1/mountinfo"])?;
        for line in mountinfo.lines() {
            let Some((point, fstype, opts)) = mount_fields(line) else { continue };
            // Only those whose root is the container's own cgroup (not cpuset, devices…).
            if fstype == "cgroup" && !opts.split(',').any(|o| o == "name=systemd") && own_hierarchy(&opts) {
                run_quiet(&mut self.nsenter(&["mount", "-o", "remount,bind,rw", &point]))?;
            }
        }
        run_quiet(&mut self.nsenter(&["systemctl", "daemon-reexec"]))?;
        let deadline = Instant::now() + BOOT_TIMEOUT;
        while !matches!(self.state().as_str(), "running" | "degraded") {
            if Instant::now() > deadline {
                return Err(format!("systemd did not come back from daemon-reexec (state {:?})", self.state()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn console_tail(&self) -> String {
        let text = std::fs::read_to_string(self.work().join("console.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `nsenter` into every namespace of the container (its root, as root): a command that
    /// runs there outside any unit. For systemctl, journalctl and reading files; a command
    /// that should run as a user's would (in a unit of the container's tree) goes through
    /// [`Container::shell`].
    pub fn nsenter(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.init))
            .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--root", "--wd", "--"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("SYSTEMD_COLORS", "0")
            .env("SYSTEMD_PAGER", "")
            .stdin(Stdio::null());
        cmd
    }

    /// stdout of `args` run through [`Container::nsenter`], which must succeed.
    pub fn output(&self, args: &[&str]) -> Result<String, String> {
        let out = self.nsenter(args).output().map_err(|e| format!("nsenter {args:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{args:?} in the container: {}\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `bash -c script` as a user's shell in the container runs it: a transient service
    /// (`systemd-run --pipe --wait`), in the container's cgroup tree, its output and exit
    /// status passed back.
    pub fn shell(&self, script: &str) -> Output {
        self.shell_cmd(script).output().unwrap_or_else(|e| panic!("systemd-run in {}: {e}", self.name))
    }

    pub fn shell_cmd(&self, script: &str) -> Command {
        let script = unexpanded(script);
        self.nsenter(&["systemd-run", "--quiet", "--pipe", "--wait", "--collect", "--service-type=exec", "-E", "TERM=dumb", "--", "bash", "-c", &script])
    }

    /// Starts `args` in the background as the transient service `unit` (gone once it ends),
    /// with `properties` (`-p` values, e.g. `StandardError=file:/run/x.err`), as a user's
    /// shell starts a job; returns once it has started.
    pub fn service(&self, unit: &str, properties: &[&str], args: &[&str]) -> Result<(), String> {
        let unit = format!("--unit={unit}");
        let mut all = vec!["systemd-run", "--quiet", "--collect", "--service-type=exec", unit.as_str()];
        for p in properties {
            all.extend_from_slice(&["-p", p]);
        }
        all.push("--");
        let args: Vec<String> = args.iter().map(|a| unexpanded(a)).collect();
        all.extend(args.iter().map(String::as_str));
        self.output(&all).map(|_| ())
    }

    /// A path inside the container, as the host reaches it (through its init's root).
    pub fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.init)).join(inside.trim_start_matches('/'))
    }

    /// The cgroup directories the container was given on the host.
    pub fn host_cgroups(&self) -> &[PathBuf] {
        &self.cgroups
    }

    /// The container's directory on the host (its root is `root/` below it).
    pub fn host_dir(&self) -> PathBuf {
        self.work().to_path_buf()
    }

    /// Halts the container and removes everything it was: what `Drop` does, timed, with
    /// what could not be removed as the error.
    pub fn teardown(mut self) -> Result<Duration, String> {
        let started = Instant::now();
        let left = self.stop_and_remove();
        if left.is_empty() {
            Ok(started.elapsed())
        } else {
            Err(left.join("; "))
        }
    }

    /// Orderly halt (SIGTERM to systemd-nspawn: the container's systemd stops every unit
    /// and powers off), then what is left killed: v1-frozen tasks thawed (they die only
    /// once thawed), every process of the container killed through `cgroup.kill`, its init
    /// SIGKILLed (which ends its PID namespace). Then its cgroups removed deepest first and
    /// its directory, once no mount of this namespace is below it. Returns what is left.
    fn stop_and_remove(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        if let Some(mut nspawn) = self.nspawn.take() {
            let pid = nix::unistd::Pid::from_raw(nspawn.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if !wait_child(&mut nspawn, HALT_TIMEOUT) {
                self.kill_everything();
                if self.init != 0 {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.init as i32), nix::sys::signal::Signal::SIGKILL);
                }
                if !wait_child(&mut nspawn, Duration::from_secs(5)) {
                    let _ = nspawn.kill();
                    let _ = nspawn.wait();
                }
            }
        }
        // nspawn may return before the kernel has removed every task of the namespace.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            for dir in &self.cgroups {
                rmdir_tree(dir);
            }
            let remaining: Vec<&PathBuf> = self.cgroups.iter().filter(|d| d.exists()).collect();
            if remaining.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                left.extend(remaining.iter().map(|d| format!("cgroup {} not removed", d.display())));
                break;
            }
            self.kill_everything();
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(work) = self.work.take() {
            let below = mounts_below(work.path());
            if below.is_empty() {
                if let Err(e) = work.close() {
                    left.push(format!("cannot remove the container's directory: {e}"));
                }
            } else {
                // Never removed through a mount (the host's /usr, the repository).
                left.push(format!("mounts left below {}: {}", work.path().display(), below.join(", ")));
                let _ = work.keep();
            }
        }
        left
    }

    fn kill_everything(&self) {
        for dir in &self.cgroups {
            if dir.join("freezer.state").exists() {
                thaw_tree(dir);
            }
            let kill = dir.join("cgroup.kill");
            if kill.exists() {
                let _ = std::fs::write(kill, "1");
            }
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let left = self.stop_and_remove();
        if !left.is_empty() {
            // Not a panic (it may run while a failed test unwinds); the harness's own test
            // (`harness::teardown_leaves_nothing`) fails on what is left.
            eprintln!("container {}: teardown left {}", self.name, left.join("; "));
        }
    }
}

/// `arg` as systemd-run passes it on: systemd expands `$VAR` (and `$$`) in a unit's
/// command line, so `$` is doubled.
fn unexpanded(arg: &str) -> String {
    arg.replace('$', "$$")
}

/// Runs `cmd`, failing with its output unless it succeeded.
fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// Waits for `child` at most `timeout`; whether it exited.
fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() > deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The first child of `parent` whose command name is `comm`.
fn child_named(parent: u32, comm: &str) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
    })
}

/// (super options, mount point) of every cgroup and cgroup2 mount of this process.
fn cgroup_mounts() -> Vec<(String, PathBuf)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(mount_fields)
        .filter(|(_, fstype, _)| fstype == "cgroup" || fstype == "cgroup2")
        .map(|(point, fstype, opts)| (if fstype == "cgroup2" { String::new() } else { opts }, PathBuf::from(point)))
        .collect()
}

/// (mount point, fs type, super options) of a mountinfo line.
fn mount_fields(line: &str) -> Option<(String, String, String)> {
    let (left, right) = line.split_once(" - ")?;
    let point = left.split(' ').nth(4)?.replace("\\040", " ");
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let opts = right.nth(1).unwrap_or("").to_string();
    Some((point, fstype, opts))
}

/// Whether the container gets a cgroup of its own in the hierarchy whose controllers (or
/// mount options) are `names`: one of [`OWN_HIERARCHIES`] is among them, cpuset is not.
fn own_hierarchy(names: &str) -> bool {
    names.is_empty() || (names.split(',').any(|n| !n.is_empty() && OWN_HIERARCHIES.contains(&n)) && !names.split(',').any(|n| n == "cpuset"))
}

/// Whether the hierarchy `names` (a /proc/self/cgroup field; empty: the unified one) is
/// the one mounted with super options `opts` (empty for cgroup2).
pub fn same_hierarchy(names: &str, opts: &str) -> bool {
    if names.is_empty() || opts.is_empty() {
        return names.is_empty() && opts.is_empty();
    }
    names.split(',').all(|n| opts.split(',').any(|o| o == n))
}

/// Removes the cgroup directories below `dir`, deepest first, then `dir`.
fn rmdir_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Thaws every v1 freezer cgroup at and below `dir`.
fn thaw_tree(dir: &Path) {
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                thaw_tree(&entry.path());
            }
        }
    }
}

/// Mount points of this mount namespace at or below `dir`.
pub fn mounts_below(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(mount_fields).map(|(point, _, _)| point).filter(|p| Path::new(p).starts_with(dir)).collect()
}
