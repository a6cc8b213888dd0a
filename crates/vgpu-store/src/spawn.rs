//! Start a process without copying `vgpu run`'s memory: `clone(CLONE_VM | CLONE_VFORK)`, as
//! glibc's `posix_spawn` does, with the steps a workload's first process takes before it
//! executes anything (join its cgroup, become its user, enter its directory), which
//! `posix_spawn` cannot express.
//!
//! A `fork` (what `std::process::Command` does once a `pre_exec` step is given) copies the
//! parent's page tables and marks every private page copy-on-write: the child then faults
//! on each page it writes before its `exec`, and so does the parent on each page it writes
//! afterwards, until the end of the run. On a 2-core VM that was about 0.4 ms of every
//! `vgpu run` (see `benches/run_overhead.rs`). Here the child runs in the parent's memory,
//! on a stack of its own, while the parent waits (`CLONE_VFORK`) until it has executed the
//! program or failed.
//!
//! What the child may do is therefore narrow: it reads only what [`Prepared`] holds, made
//! before the clone, allocates nothing, takes no lock, and makes raw system calls where
//! glibc's wrappers would act on the parent's threads (`setuid` and friends broadcast to
//! every thread of the process glibc thinks it is in). Its only write to the parent's
//! memory is the error it failed with.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_char;

/// The child's stack: its steps are a few system calls, and it never allocates.
const CHILD_STACK: usize = 64 * 1024;

/// Where a program named without a `/` is looked for when its environment has no `PATH`:
/// glibc's `execvp` default (`confstr(_CS_PATH)`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// The shell a file without a `#!` line is run by, as `execvp` runs it (`ENOEXEC`).
const SHELL: &[u8] = b"/bin/sh";

/// One past the highest signal number (the kernel's `_NSIG` on Linux).
const NSIG: libc::c_int = 65;

/// A process started by [`spawn`]: ours to wait for.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Wait for it to end (once: later calls return the same status).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let mut raw = 0;
        loop {
            // SAFETY: waits for our own child, writing its status into `raw`.
            if unsafe { libc::waitpid(self.pid, &mut raw, 0) } == self.pid {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                return Ok(status);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// What the child takes before it executes the program: each step is optional.
pub struct Steps<'a> {
    /// Descriptors it writes "0" (itself) to: a cgroup's process lists.
    pub join: &'a [RawFd],
    /// Become this user (supplementary groups, group, user), when root.
    pub user: Option<Ids<'a>>,
    /// Enter this directory, as that user.
    pub cwd: Option<&'a OsStr>,
}

/// A user to become: `uid` 0 keeps root, only setting the groups (`gid` 0 not even those).
#[derive(Clone, Copy)]
pub struct Ids<'a> {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: &'a [libc::gid_t],
}

/// Start `argv` with exactly the environment `env`, after `steps`. The program is looked
/// for as `execvp` looks for it: a name with a `/` as it is, any other in the `PATH` of
/// `env`; a file the kernel cannot execute (no `#!` line) is run by `/bin/sh`. An error of
/// a step or of the `exec` is returned, as `std::process::Command::spawn` returns it, and
/// the child is reaped.
pub fn spawn(argv: &[String], env: &[(OsString, OsString)], steps: &Steps<'_>) -> io::Result<Spawned> {
    let prepared = Prepared::new(argv, env, steps)?;
    let failed = AtomicI32::new(0);
    // Left uninitialised: the child touches only the top of it, so only those pages are
    // ever faulted in (zeroing it cost about 15 page faults and a 64 KiB memset per run).
    let mut stack: Box<[std::mem::MaybeUninit<u8>]> = Box::new_uninit_slice(CHILD_STACK);
    // Every signal blocked across the clone: none is handled on the child's way to its
    // exec by the parent's handlers (the child sets them to their defaults, then unblocks).
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all`; pthread_sigmask writes the previous mask to `old`.
    let blocked = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr())
    };
    if blocked != 0 {
        return Err(io::Error::from_raw_os_error(blocked));
    }
    // SAFETY: `old` was written by the successful pthread_sigmask above.
    let old = unsafe { old.assume_init() };
    let child = Child { prepared: &prepared, failed: &failed };
    // The stack grows down from its end, aligned to 16 bytes as the ABI wants.
    let top = {
        let end = stack.as_mut_ptr_range().end as usize;
        (end - end % 16) as *mut libc::c_void
    };
    // SAFETY: the child runs `child_main(&child)` on `stack` (64 KiB, far more than its
    // steps use), in our memory; we are suspended until it executed the program or exited
    // (CLONE_VFORK), so nothing it reads changes meanwhile, and `stack` and `child`
    // outlive it. It writes only its own stack and `failed`.
    let pid = unsafe { libc::clone(child_main, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, std::ptr::from_ref(&child).cast_mut().cast()) };
    let cloned = if pid == -1 { Err(io::Error::last_os_error()) } else { Ok(pid) };
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    let pid = cloned?;
    let mut spawned = Spawned { pid, status: None };
    match failed.load(Ordering::SeqCst) {
        0 => Ok(spawned),
        errno => {
            spawned.wait()?;
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// What the cloned child is given: what it reads, and where it says how it failed.
struct Child<'a> {
    prepared: &'a Prepared<'a>,
    failed: &'a AtomicI32,
}

/// The cloned child's entry: its steps, then the program; it never returns.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` that `spawn` passed to the clone, alive while its parent
    // waits (CLONE_VFORK).
    let child = unsafe { &*arg.cast::<Child<'_>>() };
    // SAFETY: runs in the child, in our memory while we wait: `run_child` reads `prepared`,
    // allocates nothing, and only returns on failure.
    let errno = unsafe { run_child(child.prepared) };
    child.failed.store(errno.max(1), Ordering::SeqCst);
    // SAFETY: ends the child (its own thread group) without running anything of ours.
    unsafe { libc::_exit(127) }
}

/// Everything the child reads, made before the clone.
struct Prepared<'a> {
    steps: &'a Steps<'a>,
    cwd: Option<CString>,
    /// `argv` and `envp`, each a null-terminated array of pointers into `_strings`.
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// The paths to try, in order, and for each the argv `/bin/sh` gets if it is a script.
    tries: Vec<(CString, Vec<*const c_char>)>,
    _strings: Vec<CString>,
}

impl<'a> Prepared<'a> {
    fn new(argv: &[String], env: &[(OsString, OsString)], steps: &'a Steps<'a>) -> io::Result<Prepared<'a>> {
        let nul = || io::Error::new(io::ErrorKind::InvalidInput, "nul byte found in provided data");
        let program = argv.first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no program to run"))?;
        let args: Vec<CString> = argv.iter().map(|a| CString::new(a.as_bytes()).map_err(|_| nul())).collect::<io::Result<_>>()?;
        // A variable given twice is given once, its last value, as `std` gives it.
        let env: Vec<&(OsString, OsString)> = env.iter().enumerate().filter(|(i, (k, _))| !env[i + 1..].iter().any(|(later, _)| later == k)).map(|(_, kv)| kv).collect();
        let vars: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).map_err(|_| nul())
            })
            .collect::<io::Result<_>>()?;
        let cwd = steps.cwd.map(|d| CString::new(d.as_bytes()).map_err(|_| nul())).transpose()?;
        let shell = CString::new(SHELL).map_err(|_| nul())?;
        let null_terminated = |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>();
        let argv_ptrs = null_terminated(&args);
        let envp = null_terminated(&vars);
        let paths: Vec<CString> = if program.is_empty() {
            Vec::new()
        } else if program.contains('/') {
            vec![CString::new(program.as_bytes()).map_err(|_| nul())?]
        } else {
            let search = env.iter().find(|(k, _)| k.as_bytes() == b"PATH").map(|(_, v)| v.as_bytes()).unwrap_or(DEFAULT_PATH);
            search
                .split(|&b| b == b':')
                .map(|dir| {
                    // An empty entry is the current directory: the name as it is.
                    let mut path = dir.to_vec();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(program.as_bytes());
                    CString::new(path).map_err(|_| nul())
                })
                .collect::<io::Result<_>>()?
        };
        let tries = paths
            .into_iter()
            .map(|path| {
                let script = std::iter::once(shell.as_ptr())
                    .chain(std::iter::once(path.as_ptr()))
                    .chain(args.iter().skip(1).map(|a| a.as_ptr()))
                    .chain(std::iter::once(std::ptr::null()))
                    .collect();
                (path, script)
            })
            .collect();
        let mut strings = args;
        strings.extend(vars);
        strings.push(shell);
        Ok(Prepared { steps, cwd, argv: argv_ptrs, envp, tries, _strings: strings })
    }
}

/// The child's steps, then the program. Returns only on failure, with the error number.
///
/// # Safety
/// Only in the child of [`spawn`]'s clone, before it executes anything.
unsafe fn run_child(p: &Prepared<'_>) -> i32 {
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
    // Signals as a new program should find them, as `std` leaves them for its child: a
    // handler of ours at its default (an ignored signal stays ignored, except SIGPIPE,
    // which Rust's runtime ignores for itself), then nothing blocked.
    for signal in 1..NSIG {
        let mut action: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
            continue;
        }
        let handled = action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
        if handled || signal == libc::SIGPIPE {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    for &fd in p.steps.join {
        if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            return errno();
        }
    }
    if let Some(ids) = p.steps.user {
        // Raw system calls: glibc's wrappers would ask the parent's threads to change too.
        if libc::geteuid() == 0 && ids.uid != 0 {
            if libc::syscall(libc::SYS_setgroups, ids.groups.len(), ids.groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setgid, ids.gid) != 0
                || libc::syscall(libc::SYS_setuid, ids.uid) != 0
            {
                return errno();
            }
        } else if libc::geteuid() == 0
            && ids.gid != 0
            && (libc::syscall(libc::SYS_setgroups, ids.groups.len(), ids.groups.as_ptr()) != 0 || libc::syscall(libc::SYS_setgid, ids.gid) != 0)
        {
            return errno();
        }
    }
    // Only now, as the workload's user: a directory closed to them stays closed.
    if let Some(dir) = &p.cwd {
        if libc::chdir(dir.as_ptr()) != 0 {
            return errno();
        }
    }
    // As glibc's execvp: each candidate in turn, past one that is missing or not ours to
    // execute; a script without `#!` through the shell; EACCES if one was found but refused.
    let mut refused = false;
    for (path, script) in &p.tries {
        libc::execve(path.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
        let mut e = errno();
        if e == libc::ENOEXEC {
            // `script`'s first is the shell's path.
            if let Some(&shell) = script.first() {
                libc::execve(shell, script.as_ptr(), p.envp.as_ptr());
                e = errno();
            }
        }
        match e {
            libc::EACCES => refused = true,
            libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
    }
    if refused {
        libc::EACCES
    } else {
        libc::ENOENT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    const NONE: Steps<'static> = Steps { join: &[], user: None, cwd: None };

    fn run(argv: &[&str], env: &[(&str, &str)], steps: &Steps<'_>) -> io::Result<ExitStatus> {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        let env: Vec<(OsString, OsString)> = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
        spawn(&argv, &env, steps)?.wait()
    }

    fn file(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_name_is_looked_for_in_the_childs_path_as_execvp_looks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (refused, script, bare, out) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"), dir.path().join("out"));
        for d in [&refused, &script, &bare] {
            std::fs::create_dir(d).expect("mkdir");
        }
        // Found first but not executable (root too needs an x bit): passed over.
        file(&refused.join("prog"), "#!/bin/sh\necho refused > \"$OUT\"\n", 0o644);
        file(&script.join("prog"), "#!/bin/sh\necho \"found $1\" > \"$OUT\"\n", 0o755);
        let path = format!("/nonexistent:{}:{}", refused.display(), script.display());
        let out_s = out.to_str().expect("utf-8");
        let status = run(&["prog", "one"], &[("PATH", &path), ("OUT", out_s)], &NONE).expect("spawn");
        assert!(status.success(), "{status}");
        assert_eq!(std::fs::read_to_string(&out).expect("out"), "found one\n");
        // No `#!` line: the kernel refuses it (ENOEXEC) and the shell runs it, with the
        // path found as its $0 and the arguments after.
        file(&bare.join("plain"), "echo \"$0 $1\" > \"$OUT\"\n", 0o755);
        let path = format!("{}:/usr/bin:/bin", bare.display());
        let status = run(&["plain", "two"], &[("PATH", &path), ("OUT", out_s)], &NONE).expect("spawn");
        assert!(status.success(), "{status}");
        assert_eq!(std::fs::read_to_string(&out).expect("out"), format!("{} two\n", bare.join("plain").display()));
        // Nowhere: not found. Only refused: permission denied. A path: as it is.
        let path = format!("/nonexistent:{}", script.display());
        let e = run(&["missing"], &[("PATH", &path)], &NONE).expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = run(&["prog"], &[("PATH", refused.to_str().expect("utf-8"))], &NONE).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let e = run(&[refused.join("prog").to_str().expect("utf-8")], &[("PATH", &path)], &NONE).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // No PATH at all: execvp's default, /bin:/usr/bin.
        assert!(run(&["true"], &[], &NONE).expect("true").success());
        // A variable given twice: its last value, once (PATH's too).
        let status = run(&["sh", "-c", "env | grep -c '^TWICE=' > \"$OUT\"; echo \"$TWICE\" >> \"$OUT\""], &[("PATH", "/nonexistent"), ("TWICE", "a"), ("OUT", out_s), ("TWICE", "b"), ("PATH", "/usr/bin:/bin")], &NONE).expect("spawn");
        assert!(status.success(), "{status}");
        assert_eq!(std::fs::read_to_string(&out).expect("out"), "1\nb\n");
    }

    #[test]
    fn the_child_becomes_the_user_and_enters_the_directory_as_them() {
        assert!(nix::unistd::geteuid().is_root(), "this test must run as root (CI does)");
        let dir = tempfile::tempdir().expect("tempdir");
        let open = dir.path().join("open");
        let closed = dir.path().join("closed");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::create_dir(&closed).expect("mkdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let nobody = Ids { uid: 65534, gid: 65534, groups: &[65534] };
        let steps = Steps { join: &[], user: Some(nobody), cwd: Some(open.as_os_str()) };
        let status = run(&["sh", "-c", "echo \"$(id -u) $(id -g) $(id -G) $(pwd)\" > out"], &[("PATH", "/usr/bin:/bin")], &steps).expect("spawn");
        assert!(status.success(), "{status}");
        assert_eq!(std::fs::read_to_string(open.join("out")).expect("out"), format!("65534 65534 65534 {}\n", open.display()));
        // A directory closed to them stays closed: root could enter it.
        let steps = Steps { join: &[], user: Some(nobody), cwd: Some(closed.as_os_str()) };
        let e = run(&["true"], &[], &steps).expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    }

    #[test]
    fn a_steps_failure_is_the_spawns_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let read_only = std::fs::File::create(dir.path().join("procs")).and_then(|_| std::fs::File::open(dir.path().join("procs"))).expect("file");
        let join = [read_only.as_raw_fd()];
        let e = run(&["true"], &[], &Steps { join: &join, user: None, cwd: None }).expect_err("read-only");
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        let e = run(&["true"], &[], &Steps { join: &[], user: None, cwd: Some(OsStr::new("/nonexistent")) }).expect_err("cwd");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    /// Signals as a program expects them: none blocked, SIGPIPE at its default (Rust's
    /// runtime ignores it); and ours as they were.
    #[test]
    fn the_program_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("status");
        let mut usr2 = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut before = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: initialises a set holding SIGUSR2 and blocks it in this thread, saving the
        // previous mask.
        let before = unsafe {
            libc::sigemptyset(usr2.as_mut_ptr());
            libc::sigaddset(usr2.as_mut_ptr(), libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, usr2.as_ptr(), before.as_mut_ptr());
            before.assume_init()
        };
        let status = run(&["sh", "-c", "exec cat /proc/self/status > \"$0\"", out.to_str().expect("utf-8")], &[("PATH", "/usr/bin:/bin")], &NONE);
        let mut after = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: reads this thread's mask into `after`, then restores the saved one.
        let still_blocked = unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), after.as_mut_ptr());
            let blocked = libc::sigismember(after.as_ptr(), libc::SIGUSR2) == 1 && libc::sigismember(after.as_ptr(), libc::SIGUSR1) == 0;
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            blocked
        };
        assert!(status.expect("spawn").success());
        assert!(still_blocked, "the spawning thread's mask is not what it was");
        let text = std::fs::read_to_string(&out).expect("status");
        let field = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
            u64::from_str_radix(line[name.len()..].trim(), 16).expect("hex")
        };
        assert_eq!(field("SigBlk:"), 0, "{text}");
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored: {text}");
    }

    /// A signal that reaches the child before its `exec` acts as its default would: it is
    /// not handled by our handler, which would run in our memory (the flag would be set).
    #[test]
    fn a_signal_before_the_exec_is_not_handled_by_the_parents_handler() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let handled = Arc::new(AtomicBool::new(false));
        let id = signal_hook::flag::register(libc::SIGUSR1, handled.clone()).expect("handler");
        // A full pipe as a "cgroup" to join: the child blocks in its write, before its exec.
        let (r, w) = nix::unistd::pipe().expect("pipe");
        nix::fcntl::fcntl(w.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).expect("nonblock");
        while nix::unistd::write(&w, &[0u8; 4096]).is_ok() {}
        nix::fcntl::fcntl(w.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty())).expect("block");
        let fd = w.as_raw_fd();
        let parent = std::thread::spawn(move || {
            let join = [fd];
            let tid = nix::unistd::gettid();
            let (sender, receiver) = std::sync::mpsc::channel();
            let watcher = std::thread::spawn(move || {
                // The child, once it is there: listed among this thread's children.
                let children = format!("/proc/self/task/{tid}/children");
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                let pid = loop {
                    let listed = std::fs::read_to_string(&children).unwrap_or_default();
                    if let Some(pid) = listed.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()) {
                        // Blocked in its write (the pipe's wait queue), past its signal set-up.
                        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
                        if wchan.contains("pipe_write") || std::time::Instant::now() > deadline {
                            break pid;
                        }
                    }
                    assert!(std::time::Instant::now() < deadline, "no child of the spawning thread");
                    std::thread::yield_now();
                };
                // SAFETY: pidfd_open of our own child, not reaped yet: it stays this process.
                let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
                // SAFETY: signals that child.
                unsafe { libc::kill(pid, libc::SIGUSR1) };
                // Its end, or (the signal handled, the write goes on blocking) none in 10 s:
                // then it is killed, for the spawn to return, and that is said.
                let mut ended = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
                // SAFETY: polls one valid pollfd.
                let died = unsafe { libc::poll(&mut ended, 1, 10_000) } == 1;
                if !died {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let _ = sender.send((pid, died));
            });
            let spawned = spawn(&["true".to_string()], &[], &Steps { join: &join, user: None, cwd: None });
            let _ = watcher.join();
            (spawned.map(|mut s| s.wait()), receiver.recv().ok())
        });
        let (status, seen) = parent.join().expect("spawning thread");
        drop((r, w));
        signal_hook::low_level::unregister(id);
        let (_, died) = seen.expect("the child was not seen");
        assert!(died, "the child did not die of its signal within 10 s (killed)");
        let status = status.expect("spawn").expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGUSR1), "{status:?}");
        assert!(!handled.load(Ordering::SeqCst), "our handler ran for the child's signal");
    }
}
