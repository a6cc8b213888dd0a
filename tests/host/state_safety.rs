//! The state directory against a hostile tenant: a FIFO or symlink a workload's user puts in
//! its own vGPU's `procs/` (the one directory of the store it may write; no other user can:
//! tests/host/tenant_isolation.rs) hangs no root command and is never followed; the store lock is never
//! waited for forever and names its holder. Runs as root (like tests/host/run.rs).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{wait_for, Sim};

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];
const GUARD: Duration = Duration::from_secs(60);

/// Run `vgpu --simulate ARGS…`, killing it (and failing) if it has not finished in [`GUARD`].
fn vgpu_guarded(sim: &Sim, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").args(args).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(GUARD) {
        Ok(out) => out.expect("wait for vgpu"),
        Err(_) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            panic!("vgpu {args:?} hung for {GUARD:?}");
        }
    }
}

/// Run a command as nobody (uid/gid 65534, no groups).
fn as_nobody(argv: &[&str]) {
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(argv)
        .output()
        .expect("setpriv");
    assert!(out.status.success(), "{argv:?} as nobody: {}", String::from_utf8_lossy(&out.stderr));
}

/// Start a workload as nobody and return its vGPU's `procs/` directory, made reachable
/// (the test's temporary directory is 0700).
fn running_workload(sim: &Sim) -> (std::process::Child, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let child = sim.spawn(&["run", "--user", "nobody", "--mem", "1G", "--name", "victim", "--", "sleep", "120"]);
    wait_for("the workload to run", || {
        let out = sim.vgpu(&["ps", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["workloads"].as_array().is_some_and(|a| a.iter().any(|w| w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())))
    });
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vgpus: Vec<PathBuf> = std::fs::read_dir(sim.path("run/vgpus")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(vgpus.len(), 1, "{vgpus:?}");
    let procs = vgpus[0].join("procs");
    let meta = std::fs::metadata(&procs).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o700), "procs/ is the tenant's (the premise)");
    (child, procs)
}

fn stop(sim: &Sim, mut child: std::process::Child) {
    let _ = sim.vgpu(&["kill", "victim"]).timeout(GUARD).output();
    let _ = child.kill();
    let _ = child.wait();
}

fn owner(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().uid()
}

#[test]
fn a_fifo_in_procs_hangs_no_command() {
    let sim = Sim::new(GPU16);
    let (child, procs) = running_workload(&sim);
    let dead = procs.join("999999-1");
    as_nobody(&["mkfifo", dead.to_str().unwrap()]);
    assert_eq!(owner(&dead), 65534);
    // Named like a live process (this test): reclaim skips it, the listing must not open it.
    let me = vgpu_abi::process::ProcessId::current().unwrap();
    let live = procs.join(vgpu_abi::procfile::file_name(me));
    as_nobody(&["mkfifo", live.to_str().unwrap()]);

    let out = vgpu_guarded(&sim, &["ps"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ps: {stderr}");
    assert!(stderr.contains("999999-1") && stderr.contains("FIFO"), "the FIFO is reported, named: {stderr}");
    let out = vgpu_guarded(&sim, &["ps", "-a", "--json"], &[]);
    assert!(out.status.success(), "ps -a: {}", String::from_utf8_lossy(&out.stderr));
    // Root removed the one of a dead process; it is never a record.
    assert!(std::fs::symlink_metadata(&dead).is_err(), "the dead process's FIFO is removed");
    stop(&sim, child);
}

#[test]
fn a_symlink_in_procs_is_not_followed() {
    let sim = Sim::new(GPU16);
    let (child, procs) = running_workload(&sim);
    let passwd_before = std::fs::read("/etc/passwd").unwrap();
    let to_passwd = procs.join("999998-1");
    as_nobody(&["ln", "-s", "/etc/passwd", to_passwd.to_str().unwrap()]);
    // A target of our own, watched: any open of it (by following the link) is an event.
    let target = sim.path("target");
    std::fs::write(&target, vec![0u8; 8192]).unwrap();
    let to_target = procs.join("999997-1");
    as_nobody(&["ln", "-s", target.to_str().unwrap(), to_target.to_str().unwrap()]);
    let watch = Inotify::watch_opens(&target);

    let out = vgpu_guarded(&sim, &["ps", "-a"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ps: {stderr}");
    assert_eq!(watch.opens(), 0, "the symlink's target was opened");
    assert!(stderr.contains("999998-1") && stderr.contains("symbolic link"), "reported, named: {stderr}");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd_before);
    assert_eq!(std::fs::read(&target).unwrap(), vec![0u8; 8192]);
    assert!(std::fs::symlink_metadata(&to_passwd).is_err(), "root removes the link itself");
    stop(&sim, child);
}

#[test]
fn a_held_store_lock_fails_in_time_naming_its_holder() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["ps"]).assert().success(); // creates the store and its lock file
    let lock_path = sim.path("run/lock");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&lock_path).unwrap();
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).unwrap();
    std::fs::write(&lock_path, format!("{}\n", std::process::id())).unwrap();

    // A command that changes the state waits for the lock (a listing such as `ps` does not
    // wait: it reads the state as it is, tests/daemon/monitoring.rs).
    let out = vgpu_guarded(&sim, &["partition", "remove", "nothing"], &[("VGPU_LOCK_TIMEOUT_MS", "500")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].contains(&format!("pid {}", std::process::id())), "{stderr}");
    // The holder's command is this test executable (tests/host.rs, named host-HASH).
    let exe = std::env::current_exe().expect("the test executable");
    let exe = exe.file_name().expect("a file name").to_string_lossy();
    assert!(lines[0].contains(&*exe), "names the holder's command: {stderr}");
    drop(held);
    let out = vgpu_guarded(&sim, &["ps"], &[("VGPU_LOCK_TIMEOUT_MS", "500")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The command that got it wrote its pid and emptied the file again (same inode).
    assert_eq!(std::fs::read_to_string(&lock_path).unwrap(), "");
}

/// IN_OPEN events on one file.
struct Inotify {
    fd: std::os::fd::OwnedFd,
}

impl Inotify {
    fn watch_opens(path: &Path) -> Inotify {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscalls; the fd is checked and owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: valid fd and NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(std::os::fd::AsRawFd::as_raw_fd(&fd), c.as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0);
        Inotify { fd }
    }

    /// Opens seen so far (events are queued by the kernel before open returns).
    fn opens(&self) -> usize {
        let mut buf = [0u8; 4096];
        let mut n = 0;
        loop {
            // SAFETY: valid fd and buffer.
            let r = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&self.fd), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return n;
            }
            let mut off = 0usize;
            while off < r as usize {
                // SAFETY: the kernel writes whole inotify_event records.
                let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off).cast()) };
                if ev.mask & libc::IN_OPEN != 0 {
                    n += 1;
                }
                off += std::mem::size_of::<libc::inotify_event>() + ev.len as usize;
            }
        }
    }
}
