//! `source = "command"`: a shell command that prints the intensity (gCO2/kWh) as the first
//! word of its output, e.g. a script that asks a utility's meter.
//!
//! The command runs as `sh -c command` in a process group of its own, with stdin from
//! /dev/null. It is bounded in time and in memory:
//!
//! * **When it is done.** The output is what the shell (the group's leader) printed by the
//!   time it exited: when it exits, what is already in its stdout and stderr pipes is read
//!   (without waiting for the pipes to close) and the whole process group is killed
//!   (SIGKILL). So `sleep 600 & echo 300` gives 300 at once, and the `sleep` is killed:
//!   a command must not leave anything running in its process group.
//! * **Timeout.** If the shell has not exited by `timeout`, the whole process group is
//!   killed and the shell reaped; that is an error. Reading never waits past the timeout,
//!   even while something outside the group holds the pipes open.
//! * **Output cap.** More than [`MAX_OUTPUT`] bytes on stdout is an error (the group is
//!   killed at once); of stderr only the last [`MAX_OUTPUT`] bytes are kept (its last line
//!   is quoted when the command fails).

use std::io::Read as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use thiserror::Error;

use super::{Reading, Source, SourceError};

/// The most a command may print on stdout, and the most of its stderr that is kept.
pub const MAX_OUTPUT: usize = 64 * 1024;

/// How often the shell's exit is checked while waiting for output.
const TICK: Duration = Duration::from_millis(10);

pub struct Command {
    pub command: String,
    pub timeout: Duration,
}

/// Why a command gave no value (shown after "command `…`: ").
#[derive(Debug, Error)]
pub enum CommandError {
    #[error("cannot start sh: {0}")]
    Spawn(std::io::Error),
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
    #[error("cannot read its output: {0}")]
    Output(std::io::Error),
    #[error("did not finish within {}; its process group was killed", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("printed more than {} KiB, the cap on a command's output; its process group was killed", .cap / 1024)]
    TooMuchOutput { cap: usize },
    #[error("{}{}", exit_text(.status), stderr_suffix(.stderr_line))]
    Failed { status: ExitStatus, stderr_line: String },
    #[error("printed nothing")]
    PrintedNothing,
    #[error("printed {0:?}, not a number")]
    NotANumber(String),
}

fn exit_text(status: &ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "was killed by a signal".to_string(),
    }
}

fn stderr_suffix(line: &str) -> String {
    if line.is_empty() {
        String::new()
    } else {
        format!(": {line}")
    }
}

impl Source for Command {
    fn describe(&self) -> String {
        format!("command `{}`", self.command)
    }

    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        let fail = |error: CommandError| SourceError::Command { command: self.command.clone(), error };
        let output = run(&self.command, self.timeout).map_err(fail)?;
        let g_per_kwh = parse_output(&output).map_err(fail)?;
        Ok(Reading { g_per_kwh, timestamp: now })
    }
}

/// The intensity a command printed: the first word of its output.
pub fn parse_output(output: &str) -> Result<f64, CommandError> {
    let word = output.split_whitespace().next().unwrap_or("");
    match word.parse::<f64>() {
        Ok(g_per_kwh) => Ok(g_per_kwh),
        Err(_) if word.is_empty() => Err(CommandError::PrintedNothing),
        Err(_) => Err(CommandError::NotANumber(word.to_string())),
    }
}

/// Run `sh -c command` as described in the module documentation; its stdout on success.
pub fn run(command: &str, timeout: Duration) -> Result<String, CommandError> {
    let deadline = Instant::now() + timeout;
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group (id = the shell's pid), so that everything it starts can be
        // killed at once.
        .process_group(0)
        .spawn()
        .map_err(CommandError::Spawn)?;
    let mut group = Group { child: &mut child, done: false };
    let result = collect(&mut group, timeout, deadline);
    let status = group.finish();
    let (out, err) = result?;
    let status = status.map_err(CommandError::Wait)?;
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        let line = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        return Err(CommandError::Failed { status, stderr_line: line.chars().take(200).collect() });
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The running shell and its process group; killed and reaped however `run` ends.
struct Group<'a> {
    child: &'a mut Child,
    done: bool,
}

impl Group<'_> {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    /// Whether the shell has exited; it is not reaped (WNOWAIT), so its pid, the group's
    /// id, cannot be reused before `finish` kills the group.
    fn exited(&self) -> std::io::Result<bool> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.pid()), flags) {
            Ok(WaitStatus::StillAlive) => Ok(false),
            Ok(_) => Ok(true),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Kill the whole group (SIGKILL) and reap the shell.
    fn finish(&mut self) -> std::io::Result<ExitStatus> {
        self.done = true;
        // The shell is unreaped, so the group id still names this group.
        let _ = killpg(self.pid(), Signal::SIGKILL);
        self.child.wait()
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.finish();
        }
    }
}

/// One of the command's output pipes, read without blocking.
struct Pipe {
    file: Option<std::fs::File>,
    bytes: Vec<u8>,
}

impl Pipe {
    fn new(fd: Option<impl Into<OwnedFd>>) -> std::io::Result<Pipe> {
        let file = fd.map(|fd| std::fs::File::from(fd.into()));
        if let Some(file) = &file {
            use nix::fcntl::{fcntl, FcntlArg, OFlag};
            let flags = OFlag::from_bits_truncate(fcntl(file.as_raw_fd(), FcntlArg::F_GETFL)?);
            fcntl(file.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        }
        Ok(Pipe { file, bytes: Vec::new() })
    }

    fn poll_fd(&self) -> libc::pollfd {
        libc::pollfd { fd: self.file.as_ref().map_or(-1, |f| f.as_raw_fd()), events: libc::POLLIN, revents: 0 }
    }

    /// Read what is in the pipe now, closing it at its end. Stops once more than `cap`
    /// bytes are kept; with `keep_tail`, drops old bytes instead and reads on.
    fn read_available(&mut self, cap: usize, keep_tail: bool) -> std::io::Result<()> {
        let mut chunk = [0u8; 8192];
        while let Some(file) = &mut self.file {
            match file.read(&mut chunk) {
                Ok(0) => self.file = None,
                Ok(n) => {
                    self.bytes.extend_from_slice(&chunk[..n]);
                    if keep_tail && self.bytes.len() > 2 * cap {
                        self.bytes.drain(..self.bytes.len() - cap);
                    } else if !keep_tail && self.bytes.len() > cap {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Read stdout and stderr until the shell exits, the deadline passes or stdout is too long.
fn collect(group: &mut Group<'_>, timeout: Duration, deadline: Instant) -> Result<(Vec<u8>, Vec<u8>), CommandError> {
    let mut out = Pipe::new(group.child.stdout.take()).map_err(CommandError::Output)?;
    let mut err = Pipe::new(group.child.stderr.take()).map_err(CommandError::Output)?;
    loop {
        // Checked before reading: all the shell wrote before it exited is in the pipes, and
        // is read below; what lingering children write later is not waited for.
        let exited = group.exited().map_err(CommandError::Wait)?;
        out.read_available(MAX_OUTPUT, false).map_err(CommandError::Output)?;
        if out.bytes.len() > MAX_OUTPUT {
            return Err(CommandError::TooMuchOutput { cap: MAX_OUTPUT });
        }
        err.read_available(MAX_OUTPUT, true).map_err(CommandError::Output)?;
        if exited {
            return Ok((out.bytes, err.bytes));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(CommandError::Timeout(timeout));
        }
        // Wake for output, or after a tick to look at the shell again (closed pipes are -1,
        // which poll skips).
        let wait = (deadline - now).min(TICK);
        let mut fds = [out.poll_fd(), err.poll_fd()];
        let ms = libc::c_int::try_from(wait.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(CommandError::Output(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(command: &str, timeout_ms: u64) -> Result<f64, String> {
        let source = Command { command: command.into(), timeout: Duration::from_millis(timeout_ms) };
        source.read(Utc::now()).map(|r| r.g_per_kwh).map_err(|e| e.to_string())
    }

    #[test]
    fn prints_a_number() {
        assert_eq!(read("echo 231.5", 5000), Ok(231.5));
        assert_eq!(read("printf '  42 gCO2/kWh\\n'", 5000), Ok(42.0));
        assert_eq!(read("printf 17", 5000), Ok(17.0), "no newline needed");
    }

    #[test]
    fn failures_are_one_line() {
        let cases = [
            ("echo high", "printed \"high\", not a number"),
            ("true", "printed nothing"),
            ("echo oops >&2; exit 3", "exited with status 3: oops"),
            ("kill -9 $$", "was killed by a signal"),
        ];
        for (command, want) in cases {
            let err = read(command, 5000).unwrap_err();
            assert!(err.contains(want) && err.contains(command), "{err} (wanted {want})");
            assert!(!err.contains('\n'));
        }
    }

    #[test]
    fn timeout_kills_the_command_and_its_children() {
        let started = Instant::now();
        let err = read("sleep 30 & sleep 30; echo 1", 200).unwrap_err();
        assert!(err.contains("did not finish within 200ms; its process group was killed"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn stdout_over_the_cap_is_refused_and_stderr_is_trimmed() {
        let err = read("head -c 200000 /dev/zero | tr '\\0' 1", 10_000).unwrap_err();
        assert!(err.contains("printed more than 64 KiB, the cap on a command's output"), "{err}");
        // Exactly the cap is fine.
        assert_eq!(read(&format!("printf 5; head -c {} /dev/zero | tr '\\0' ' '", MAX_OUTPUT - 1), 10_000), Ok(5.0));
        // A flood on stderr is read (the command is not stalled) and only its tail is kept.
        let err = read("head -c 1000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo last words >&2; exit 4", 10_000)
            .unwrap_err();
        assert!(err.ends_with("exited with status 4: last words"), "{err}");
    }
}
