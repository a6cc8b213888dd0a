//! Start a workload and stay its parent: the child joins its cgroup and drops privileges
//! before it executes anything; signals sent to `vgpu run` are relayed to it; its exit
//! status becomes ours.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

pub use crate::spawn::Spawned;

use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH};
use signal_hook::iterator::exfiltrator::origin::WithOrigin;
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::low_level::siginfo::Cause;

use crate::state::UserSpec;

/// The signals `vgpu run` relays to its workload.
pub const FORWARDED: [i32; 7] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH];

/// The relayed signals that ask the workload to end: a suspended (frozen) workload is thawed
/// after one of them is relayed, so that it acts on it now (see `wait_relaying_signals`).
pub const TERMINATING: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// Everything needed to start the child.
pub struct Launch {
    pub argv: Vec<String>,
    /// The complete environment of the child.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: Option<PathBuf>,
    pub user: UserSpec,
    /// The cgroup's join files (`Cgroup::self_join_files`), opened for writing: the child
    /// writes "0" (itself) to each before it executes anything.
    pub cgroup_procs: Vec<File>,
}

/// Start the workload: its first process joins its cgroup and becomes its user before it
/// executes anything, without a copy of `vgpu run`'s memory ([`crate::spawn`]).
pub fn spawn(launch: Launch) -> io::Result<Spawned> {
    let procs: Vec<RawFd> = launch.cgroup_procs.iter().map(|f| f.as_raw_fd()).collect();
    // Not a change of directory before the user's: a sudo caller's `--cwd
    // /root/private/sub` entered as root would be entered for them.
    let steps = crate::spawn::Steps {
        join: &procs,
        user: Some(crate::spawn::Ids { uid: launch.user.uid, gid: launch.user.gid, groups: &launch.user.groups }),
        cwd: launch.cwd.as_deref().map(|d| d.as_os_str()),
    };
    let child = crate::spawn::spawn(&launch.argv, &launch.env, &steps);
    drop(launch.cgroup_procs);
    child
}

/// The signals `vgpu run` relays ([`FORWARDED`]), caught from [`CaughtSignals::catch`] on
/// and queued until [`wait_relaying_signals`] relays them. Caught before the workload is
/// spawned: one sent to `vgpu run` right after its workload started (by systemd, `kill`)
/// used to arrive before the relay was in place and kill `vgpu run` by its default action,
/// leaving the workload without its supervisor until a reconcile found it.
pub struct CaughtSignals(SignalDelivery<UnixStream, WithOrigin>);

impl CaughtSignals {
    pub fn catch() -> io::Result<CaughtSignals> {
        let (read, write) = UnixStream::pair()?;
        Ok(CaughtSignals(SignalDelivery::with_pipe(read, write, WithOrigin::default(), FORWARDED)?))
    }
}

/// Relay signals to `child` until it exits; return its status. Signals the terminal sends
/// to the whole foreground process group (Ctrl-C, Ctrl-\, window resize) already reach
/// the child, which shares our process group, so only signals sent to `vgpu run` itself
/// (by `kill`, systemd, cron) are relayed.
///
/// After every [`TERMINATING`] signal (relayed, or delivered by the terminal directly),
/// `after_terminating(signal, sender)` runs, `sender` the pid of the process that sent a
/// relayed one (`None`: the terminal's): `vgpu run` says who asked the workload to end,
/// and thaws a suspended workload there, since a frozen process acts on a signal only once
/// it runs again.
///
/// While the child runs, `look()` runs every `every` (not at its end). All of it on this
/// thread, which waits for the child's end and the caught signals at once: no thread of
/// its own for the relay or the looks, which a short workload would pay for.
pub fn wait_relaying_signals(
    child: &mut Spawned,
    caught: CaughtSignals,
    mut after_terminating: impl FnMut(i32, Option<i32>),
    every: std::time::Duration,
    mut look: impl FnMut(),
) -> io::Result<ExitStatus> {
    let pidfd = pidfd_open(child.id())?;
    let mut signals = caught.0;
    let mut act = |origin: signal_hook::low_level::siginfo::Origin| {
        let from_terminal = matches!(origin.cause, Cause::Kernel);
        if !from_terminal || origin.signal == SIGHUP {
            tracing::debug!("relaying signal {} to the workload", origin.signal);
            // A pidfd cannot reach a later process that reused the pid.
            let _ = pidfd_send_signal(&pidfd, origin.signal);
        }
        if TERMINATING.contains(&origin.signal) {
            let sender = if from_terminal { None } else { origin.process.map(|p| p.pid) };
            after_terminating(origin.signal, sender);
        }
    };
    let ended = pidfd.try_clone()?;
    let pipe = signals.get_read().try_clone()?;
    wait_readable(&ended, pipe.as_fd(), every, &mut look, &mut || signals.pending().for_each(&mut act));
    let status = child.wait();
    // A signal that came with its end is still relayed (to no one) and said: systemd
    // stopping a scope signals vgpu run and the workload at once, and the workload may die
    // first (vgpu run then said nothing of the stop, one run in a few under a real systemd).
    signals.pending().for_each(&mut act);
    status
}

/// Until `ended` (a pidfd) is readable, its process ended: `caught()` whenever `signals`
/// (the caught signals' pipe) is, `look()` every `every` meanwhile. Returns at once where
/// they cannot be polled (the caller's wait then blocks, and the looks and the relay stop).
fn wait_readable(ended: &OwnedFd, signals: BorrowedFd<'_>, every: std::time::Duration, look: &mut impl FnMut(), caught: &mut impl FnMut()) {
    let timeout = nix::poll::PollTimeout::try_from(every).unwrap_or(nix::poll::PollTimeout::MAX);
    loop {
        let mut fds = [nix::poll::PollFd::new(ended.as_fd(), nix::poll::PollFlags::POLLIN), nix::poll::PollFd::new(signals, nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) => look(),
            // A signal's handler ran meanwhile: its byte is in the pipe, read next time round.
            Err(nix::errno::Errno::EINTR) => {}
            Ok(_) => {
                if fds[0].any().unwrap_or(true) {
                    return;
                }
                caught();
            }
            Err(_) => return,
        }
    }
}

/// Our exit code for the workload's status: its code, or 128+N when killed by signal N.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).min(255) as u8,
        (None, None) => 1,
    }
}

/// Send `signal` to exactly the process `target` names: through a pidfd opened before its
/// start time is checked, so a pid recycled in between cannot be reached. `Ok(false)`: it
/// is gone (or the pid is another process now).
pub fn signal_exact(target: vgpu_abi::process::ProcessId, signal: i32) -> io::Result<bool> {
    let pidfd = match pidfd_open(target.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(e) => return Err(e),
    };
    if !target.is_alive() {
        return Ok(false);
    }
    match pidfd_send_signal(&pidfd, signal) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: valid pidfd, a signal number, no siginfo, no flags.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }

    fn start(argv: &[&str]) -> Spawned {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        let steps = crate::spawn::Steps { join: &[], user: None, cwd: None };
        crate::spawn::spawn(&argv, &std::env::vars_os().collect::<Vec<_>>(), &steps).expect("spawn")
    }

    #[test]
    fn the_waiter_looks_and_relays_while_the_child_runs_and_returns_once_it_ended() {
        use std::time::Duration;
        // The child ends when the FIFO it reads is closed by its writer, the third look.
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        let mut child = start(&["sh", "-c", "cat \"$0\" >/dev/null", fifo.to_str().expect("utf-8")]);
        let mut looks = 0;
        let look = || {
            looks += 1;
            if looks == 3 {
                // Opened once the child opened it for reading, then closed: its end of file.
                drop(std::fs::OpenOptions::new().write(true).open(&fifo).expect("fifo"));
            }
        };
        let status = wait_relaying_signals(&mut child, CaughtSignals::catch().expect("signals"), |_, _| {}, Duration::from_millis(20), look).expect("wait");
        assert!(status.success(), "{status}");
        assert!(looks >= 3, "{looks} looks");
        // One that ends long before the first look is due: none.
        let mut child = start(&["true"]);
        let mut looks = 0;
        let status = wait_relaying_signals(&mut child, CaughtSignals::catch().expect("signals"), |_, _| {}, Duration::from_secs(600), || looks += 1).expect("wait");
        assert!(status.success() && looks == 0, "{status}, {looks} looks");
        // Signals sent to us are relayed to it, on this thread too: SIGUSR2 (its trap writes
        // a line), then SIGTERM once that line is there (its trap exits 7), which is said.
        let out = dir.path().join("out");
        let script = "trap 'echo usr2 > \"$0\"' USR2; trap 'exit 7' TERM; while :; do sleep 0.01; done";
        let mut child = start(&["sh", "-c", script, out.to_str().expect("utf-8")]);
        let (mut sent_usr2, mut sent_term) = (false, false);
        let look = || {
            if !sent_usr2 {
                sent_usr2 = true;
                // SAFETY: signals this process, which handles SIGUSR2 meanwhile (CaughtSignals).
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) };
            } else if !sent_term && std::fs::read_to_string(&out).is_ok_and(|t| t == "usr2\n") {
                sent_term = true;
                // SAFETY: as above, SIGTERM.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            }
        };
        let mut said = Vec::new();
        let status = wait_relaying_signals(&mut child, CaughtSignals::catch().expect("signals"), |signal, sender| said.push((signal, sender)), Duration::from_millis(20), look).expect("wait");
        assert_eq!(status.code(), Some(7), "{status}");
        assert_eq!(said, vec![(libc::SIGTERM, Some(std::process::id() as i32))]);
    }
}
