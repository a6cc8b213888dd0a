//! `source = "command"`: a shell command that prints the intensity (gCO2/kWh) as the first
//! word of its output, e.g. a script that asks a utility's meter.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{Reading, Source, SourceError};

pub struct Command {
    pub command: String,
    pub timeout: Duration,
}

impl Source for Command {
    fn describe(&self) -> String {
        format!("command `{}`", self.command)
    }

    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        let fail = |message: String| SourceError::Command { command: self.command.clone(), message };
        let output = run(&self.command, self.timeout).map_err(fail)?;
        let word = output.split_whitespace().next().unwrap_or("");
        match word.parse::<f64>() {
            Ok(g_per_kwh) => Ok(Reading { g_per_kwh, timestamp: now }),
            Err(_) if word.is_empty() => Err(fail("printed nothing".into())),
            Err(_) => Err(fail(format!("printed {word:?}, not a number"))),
        }
    }
}

/// Run `sh -c command` with a deadline; its stdout on success, else one line saying why.
fn run(command: &str, timeout: Duration) -> Result<String, String> {
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout kills the command's children too.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start sh: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_until(&mut child, Instant::now() + timeout);
    let Some(status) = status.map_err(|e| format!("cannot wait for it: {e}"))? else {
        kill_group(&child);
        let _ = child.wait();
        return Err(format!("did not finish within {}", humantime::format_duration(timeout)));
    };
    let out = stdout.join().unwrap_or_default();
    let err = stderr.join().unwrap_or_default();
    if !status.success() {
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        let why = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => "was killed by a signal".to_string(),
        };
        return Err(if last.is_empty() { why } else { format!("{why}: {last}") });
    }
    Ok(out)
}

/// Read a pipe to its end on a thread (bounded, so a chatty command cannot exhaust memory).
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.take(64 * 1024).read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<std::process::ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_group(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
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
    }

    #[test]
    fn failures_are_one_line() {
        let cases = [
            ("echo high", "printed \"high\", not a number"),
            ("true", "printed nothing"),
            ("echo oops >&2; exit 3", "exited with status 3: oops"),
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
        assert!(err.contains("did not finish within 200ms"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
