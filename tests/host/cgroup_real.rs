//! The cgroup layer on this machine's real cgroup hierarchy: limits in the kernel's files,
//! processes joining before exec, the freezer stopping them, kill and removal.
//!
//! Needs root and a mounted cgroup filesystem. CI runs as root on a cgroup host, so
//! without them these tests FAIL (with the reason); they never skip.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::CgroupError;

use vgpu_cgroups::CgroupSpec;

use vgpu_cgroups::Controller;

use vgpu_cgroups::FreezerState;

use vgpu_cgroups::Layout;

use vgpu_cgroups::Limits;

use vgpu_cgroups::Mode;

/// The host's layout, or a failure saying why these tests cannot run.
fn host() -> Layout {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/host/cgroup_real.rs must run as root (CI does): it creates cgroups under /sys/fs/cgroup"
    );
    Layout::detect().expect("tests/host/cgroup_real.rs: no cgroup filesystem is mounted (see /proc/self/mountinfo)")
}

fn unique_name(tag: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("test-{tag}-{}-{nanos}", std::process::id())
}

/// A cgroup and the children started in it, cleaned up even when an assertion fails.
struct Workload {
    cgroup: Cgroup,
    children: Vec<Child>,
}

impl Workload {
    fn create(layout: &Layout, tag: &str) -> Workload {
        let cgroup = Cgroup::create(layout, &unique_name(tag)).expect("create the cgroup");
        Workload { cgroup, children: Vec::new() }
    }

    /// Starts `argv` with the child joining the cgroup between fork and exec, as
    /// `vgpu run` does: it writes "0" to every `cgroup.procs` the parent opened.
    fn spawn_joined(&mut self, argv: &[&str]) -> i32 {
        let files = self.cgroup.procs_files().expect("open cgroup.procs");
        let fds: Vec<i32> = files.iter().map(AsRawFd::as_raw_fd).collect();
        let mut command = Command::new(argv[0]);
        command.args(&argv[1..]);
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // write(2), which is async-signal-safe, on descriptors `files` keeps open until
        // spawn has returned.
        unsafe {
            command.pre_exec(move || {
                for &fd in &fds {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawn a child into the cgroup");
        drop(files);
        self.adopt(child)
    }

    /// Starts `argv` outside the cgroup and moves it in afterwards.
    fn spawn_then_add(&mut self, argv: &[&str]) -> i32 {
        let child = Command::new(argv[0]).args(&argv[1..]).spawn().expect("spawn a child");
        let pid = self.adopt(child);
        self.cgroup.add_task(pid).expect("add_task");
        pid
    }

    fn adopt(&mut self, child: Child) -> i32 {
        let pid = child.id() as i32;
        self.children.push(child);
        pid
    }

    /// Reaps every child; returns the signals that ended them.
    fn reap(&mut self) -> Vec<Option<i32>> {
        self.children.drain(..).map(|mut c| c.wait().expect("wait for a child").signal()).collect()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.cgroup.remove();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// State letter and utime+stime (clock ticks) from /proc/PID/stat.
fn proc_stat(pid: i32) -> (char, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')').expect("stat has a ')'") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields[0].chars().next().expect("state field");
    // Fields 14 and 15 of stat(5), counted here from field 3.
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (state, ticks)
}

/// CPU ticks `pid` uses over `span`.
fn progress(pid: i32, span: Duration) -> u64 {
    let before = proc_stat(pid).1;
    sleep(span);
    proc_stat(pid).1 - before
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display())).trim().to_string()
}

/// The directory of `controller` in the cgroup's hierarchies (the only one on v2).
fn dir_of(cgroup: &Cgroup, controller: Controller) -> PathBuf {
    match cgroup.spec() {
        CgroupSpec::V2 { dir, .. } => dir,
        CgroupSpec::V1 { dirs, .. } => dirs.get(&controller).unwrap_or_else(|| panic!("no {controller} hierarchy")).clone(),
    }
}

/// Checks from /proc/PID/cgroup that `pid` sits in `vgpu/<name>` in every hierarchy.
fn assert_member(cgroup: &Cgroup, pid: i32) {
    let text = read(Path::new(&format!("/proc/{pid}/cgroup")));
    let suffix = format!("/vgpu/{}", cgroup.name());
    let wanted: Vec<String> = match cgroup.spec() {
        CgroupSpec::V2 { .. } => vec![String::new()],
        CgroupSpec::V1 { dirs, .. } => dirs.keys().map(|c| c.name().to_string()).collect(),
    };
    for controller in wanted {
        let line = text
            .lines()
            .find(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, list) = (parts.next(), parts.next().unwrap_or(""));
                if controller.is_empty() { list.is_empty() } else { list.split(',').any(|c| c == controller) }
            })
            .unwrap_or_else(|| panic!("no {controller:?} line in /proc/{pid}/cgroup:\n{text}"));
        assert!(line.ends_with(&suffix), "pid {pid} not in {suffix} for {controller:?}: {line}\n{text}");
    }
}

#[test]
fn limits_join_freeze_thaw_and_remove_on_the_host() {
    let layout = host();
    let mut w = Workload::create(&layout, "life");
    let name = w.cgroup.name().to_string();

    // No silent reuse; open and the stored spec find the same directories.
    assert!(matches!(Cgroup::create(&layout, &name), Err(CgroupError::AlreadyExists { .. })));
    assert_eq!(Cgroup::open(&layout, &name).unwrap().paths(), w.cgroup.paths());
    let json = serde_json::to_string(&w.cgroup.spec()).unwrap();
    assert_eq!(Cgroup::from_spec(&serde_json::from_str(&json).unwrap()).unwrap().paths(), w.cgroup.paths());
    assert!(Cgroup::list(&layout).unwrap().contains(&name));

    // Limits, read back from the kernel's files.
    w.cgroup.apply(&Limits { cpus: Some(0.5), memory: Some(64 << 20), pids: Some(32) }).expect("apply limits");
    let cpu = dir_of(&w.cgroup, Controller::Cpu);
    let memory = dir_of(&w.cgroup, Controller::Memory);
    let pids = dir_of(&w.cgroup, Controller::Pids);
    if layout.mode == Mode::V2 {
        assert_eq!(read(&cpu.join("cpu.max")), "50000 100000");
        assert_eq!(read(&memory.join("memory.max")), "67108864");
    } else {
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&memory.join("memory.limit_in_bytes")), "67108864");
    }
    assert_eq!(read(&pids.join("pids.max")), "32");

    // One child joins before exec, one is moved in after it started.
    let sleeper = w.spawn_joined(&["sleep", "30"]);
    let spinner = w.spawn_then_add(&["sh", "-c", "while :; do :; done"]);
    assert_member(&w.cgroup, sleeper);
    assert_member(&w.cgroup, spinner);
    let mut members = w.cgroup.pids().unwrap();
    members.sort();
    let mut expected = vec![sleeper, spinner];
    expected.sort();
    assert_eq!(members, expected);
    assert!(progress(spinner, Duration::from_millis(300)) > 0, "the spinner runs before the freeze");

    // Frozen: stopped in the freezer, no CPU progress.
    w.cgroup.freeze().expect("freeze");
    assert_eq!(w.cgroup.state().unwrap(), FreezerState::Frozen);
    if layout.mode != Mode::V2 {
        assert_eq!(read(&dir_of(&w.cgroup, Controller::Freezer).join("freezer.state")), "FROZEN");
    }
    for pid in [sleeper, spinner] {
        let (state, _) = proc_stat(pid);
        assert!(matches!(state, 'D' | 'S'), "pid {pid} is frozen but in state {state}");
    }
    assert_eq!(progress(spinner, Duration::from_millis(300)), 0, "a frozen spinner used CPU");

    let stats = w.cgroup.stats().unwrap();
    assert_eq!(stats.pids, Some(2), "{stats:?}");
    assert!(stats.cpu_usage_ns.is_some_and(|ns| ns > 0), "{stats:?}");
    assert!(stats.memory_bytes.is_some_and(|b| b > 0), "{stats:?}");

    // Thawed: the spinner runs again.
    w.cgroup.thaw().expect("thaw");
    assert_eq!(w.cgroup.state().unwrap(), FreezerState::Thawed);
    assert!(progress(spinner, Duration::from_millis(300)) > 0, "the spinner runs after the thaw");

    // Removing a frozen, populated cgroup: thaw, SIGKILL, rmdir everywhere.
    w.cgroup.freeze().expect("freeze again");
    w.cgroup.remove().expect("remove");
    for path in w.cgroup.paths() {
        assert!(!path.exists(), "{} is still there", path.display());
    }
    assert_eq!(w.reap(), vec![Some(libc::SIGKILL), Some(libc::SIGKILL)]);
    assert!(matches!(Cgroup::open(&layout, &name), Err(CgroupError::NotFound { .. })));
    assert!(!Cgroup::list(&layout).unwrap().contains(&name));
    w.cgroup.remove().expect("removing twice is fine");
}

#[test]
fn kill_reaches_forked_children_and_empties_the_cgroup() {
    let layout = host();
    let mut w = Workload::create(&layout, "kill");
    let shell = w.spawn_joined(&["sh", "-c", "sleep 30 & sleep 30 & wait"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while w.cgroup.pids().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "the shell's children never showed up: {:?}", w.cgroup.pids());
        sleep(Duration::from_millis(10));
    }
    assert!(w.cgroup.pids().unwrap().contains(&shell));

    // Not empty: remove_if_empty refuses and changes nothing.
    assert!(matches!(w.cgroup.remove_if_empty(), Err(CgroupError::Populated { .. })));
    assert!(w.cgroup.paths().iter().all(|p| p.is_dir()));

    assert_eq!(w.cgroup.kill(nix::sys::signal::Signal::SIGKILL).expect("kill"), 3);
    assert!(w.cgroup.pids().unwrap().is_empty());
    assert_eq!(w.reap(), vec![Some(libc::SIGKILL)]);
    w.cgroup.remove_if_empty().expect("remove the empty cgroup");
    assert!(w.cgroup.paths().iter().all(|p| !p.exists()));
}

/// The v2 implementation on the host's cgroup2 mount. On a hybrid host that hierarchy has
/// no controllers, but its freezer (`cgroup.freeze`) and process lists are real, so the
/// v2 join and freeze paths are checked here too.
#[test]
fn v2_freezer_on_the_unified_hierarchy() {
    let host = host();
    let Some(unified) = host.unified.clone() else {
        eprintln!("no cgroup2 mount on this host: the v2 implementation is covered by the unit tests only");
        return;
    };
    let controllers = read(&unified.join("cgroup.controllers")).split_whitespace().map(str::to_string).collect();
    let layout = Layout { mode: Mode::V2, unified: Some(unified), v1: Default::default(), v2_controllers: controllers };
    let mut w = Workload::create(&layout, "v2");
    let sleeper = w.spawn_joined(&["sleep", "30"]);
    assert_member(&w.cgroup, sleeper);
    assert_eq!(w.cgroup.pids().unwrap(), vec![sleeper]);

    w.cgroup.freeze().expect("freeze");
    assert_eq!(w.cgroup.state().unwrap(), FreezerState::Frozen);
    let events = read(&dir_of(&w.cgroup, Controller::Freezer).join("cgroup.events"));
    assert!(events.lines().any(|l| l == "frozen 1"), "{events}");
    let (state, _) = proc_stat(sleeper);
    assert!(matches!(state, 'D' | 'S'), "frozen sleep in state {state}");
    w.cgroup.thaw().expect("thaw");
    assert_eq!(w.cgroup.state().unwrap(), FreezerState::Thawed);

    w.cgroup.remove().expect("remove");
    assert!(w.cgroup.paths().iter().all(|p| !p.exists()));
    assert_eq!(w.reap(), vec![Some(libc::SIGKILL)]);
}
