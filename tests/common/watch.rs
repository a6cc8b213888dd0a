//! A `vgpu watch` running in the background of a test, its stderr read line by line so that
//! tests synchronise on what it logs (`use crate::common::watch::Watch;`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::common::Sim;

/// How long a test waits for a line before it fails.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Watch {
    child: Child,
    lines: Receiver<String>,
    /// Every line read so far.
    pub log: Vec<String>,
}

impl Watch {
    /// `vgpu --simulate watch EXTRA…` with the simulation's environment; returns once it
    /// logged `vgpu watch: ready` (its first round is done).
    pub fn start(sim: &Sim, extra: &[&str]) -> Watch {
        Watch::start_with(sim, extra, |_| {})
    }

    /// [`Watch::start`] with the descriptor limit systemd gives a service: soft 1024, hard
    /// 524288 (or this process's hard limit, when lower: raising it needs
    /// CAP_SYS_RESOURCE), which the watch raises for itself.
    pub fn start_as_service(sim: &Sim, extra: &[&str]) -> Watch {
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit(2) writes the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        let limit = libc::rlimit { rlim_cur: 1024, rlim_max: now.rlim_max.min(524_288) };
        Watch::start_with(sim, extra, move |cmd| {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: between fork and exec only setrlimit(2), async-signal-safe, with a
            // struct copied before the fork; nothing is allocated.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        })
    }

    /// [`Watch::start`], the command prepared by `prepare` first.
    pub fn start_with(sim: &Sim, extra: &[&str], prepare: impl FnOnce(&mut Command)) -> Watch {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").arg("watch").args(extra).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=debug");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        prepare(&mut cmd);
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn vgpu watch");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut watch = Watch { child, lines, log: Vec::new() };
        watch.wait_line("the watch to be ready", |l| l == "vgpu watch: ready");
        watch
    }

    /// The first line from now on for which `pred` holds; panics with the log after
    /// [`LINE_TIMEOUT`] or when the watch exits.
    pub fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("timed out waiting for {what}; watch log:\n{}", self.log.join("\n")),
                Err(RecvTimeoutError::Disconnected) => panic!("the watch exited while waiting for {what}; log:\n{}", self.log.join("\n")),
            }
        }
    }

    /// Wait until `n` more rounds have ended (their `round N done` debug lines).
    pub fn wait_rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.wait_line("a round to end", |l| l.contains("round ") && l.contains(" done"));
        }
    }

    /// Lines logged so far (without waiting), added to [`Watch::log`].
    pub fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
        &self.log
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "kill watch");
    }

    /// Its exit status once it has ended (after a signal), its log still read.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.child.wait().expect("wait for the watch")
    }

    /// SIGTERM, then its exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.child.wait().expect("wait for the watch")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
