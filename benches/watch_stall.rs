//! How long a memory bypasser lives, and how long a SIGHUP and a SIGTERM take, while a local
//! user attacks `vgpu watch` through its metrics endpoint or its history (issue 24, items 5
//! and 6; goal: the same as without the attack, at most 2 s at the defaults). Each attack
//! gets a fresh watch at its default settings (interval 1 s, grace 500 ms; the endpoint on
//! a free port) started with the descriptor limit systemd gives a service (soft 1024); the
//! attacker is user nobody running `tests/fixtures/stall_attacker.py`:
//!
//! * none: the baseline;
//! * idle: 600 idle connections from 20 loopback addresses;
//! * pipeline: one connection pipelining 50 000 requests and never reading;
//! * header: 1000 connections, each a header line of up to 400 MiB with no CRLF;
//! * locks: F_RDLCK on history.db, its -shm (refused now: the files are root's) and the
//!   public copy history-snapshot.db.
//!
//! Each trial starts a workload that clears `LD_PRELOAD` and holds 3 GiB in a 1 GiB vGPU;
//! its life is from its allocation (its ready file) to its `vgpu run` ending. Then a SIGHUP
//! that moves the endpoint (until "reloaded the config" is logged) and a SIGTERM (until the
//! watch has exited); 60 s at most each ("> 60 s": it did not happen). Needs root.
//!
//!     cargo bench --bench watch_stall [-- TRIALS]            (default 5)

#[path = "support/workload.rs"]
mod workload;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// What a step may take before it is reported as not happening.
const GIVE_UP: Duration = Duration::from_secs(60);

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("watch_stall: {message}");
    std::process::exit(1)
}

/// Lines of a child's pipe, with when each was read.
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line for which `pred` holds, and when it was read; None after `GIVE_UP`.
fn wait_line(lines: &Receiver<(Instant, String)>, pred: impl Fn(&str) -> bool) -> Option<Instant> {
    let deadline = Instant::now() + GIVE_UP;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((at, line)) if pred(&line) => return Some(at),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// A `vgpu watch` of `host`, killed when dropped.
struct Watch {
    child: Child,
    lines: Receiver<(Instant, String)>,
    addr: SocketAddr,
}

impl Watch {
    fn start(host: &workload::Host) -> Watch {
        let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit(2) writes the struct we own.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) };
        let limit = libc::rlimit { rlim_cur: 1024, rlim_max: hard.rlim_max.min(524_288) };
        let mut cmd = host.command(&["watch"]);
        // SAFETY: between fork and exec only setrlimit(2), async-signal-safe, with a struct
        // copied before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| fail(e));
        let lines = lines_of(child.stderr.take().unwrap_or_else(|| fail("no stderr")));
        let mut addr = None;
        let deadline = Instant::now() + GIVE_UP;
        while let Ok((_, line)) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let Some(a) = line.split("metrics on http://").nth(1).and_then(|a| a.strip_suffix("/metrics")) {
                addr = a.parse().ok();
            }
            if line == "vgpu watch: ready" {
                break;
            }
        }
        Watch { child, lines, addr: addr.unwrap_or_else(|| fail("the watch did not start")) }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The attacker, as user nobody, killed when dropped.
struct Attacker {
    child: Child,
    _stdin: ChildStdin,
    lines: Receiver<(Instant, String)>,
}

impl Attacker {
    fn start(host: &workload::Host, args: &[String]) -> Attacker {
        let mut child = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", "/usr/bin/python3"])
            .arg(host.path("stall_attacker.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(format!("setpriv: {e}")));
        let lines = lines_of(child.stdout.take().unwrap_or_else(|| fail("no stdout")));
        let stdin = child.stdin.take().unwrap_or_else(|| fail("no stdin"));
        Attacker { child, _stdin: stdin, lines }
    }

    /// Wait for its line starting with `prefix` (the attack is in place).
    fn until(&self, prefix: &str) {
        if wait_line(&self.lines, |l| l.starts_with(prefix)).is_none() {
            fail(format!("the attacker never said {prefix:?}"));
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a bypasser lives: from its allocation to its `vgpu run`'s end (None: more
/// than [`GIVE_UP`]).
fn bypasser_life(host: &workload::Host, workload: &Path, trial: usize) -> Option<Duration> {
    let ready = host.path(&format!("ready-{trial}-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let mut run = host
        .command(&["run", "--mem", "1G", "--", "env", "-u", "LD_PRELOAD"])
        .arg(workload)
        .args(["idle", "120", "--alloc-mib", "3072", "--ready"])
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(e));
    let deadline = Instant::now() + GIVE_UP;
    while !ready.exists() {
        if Instant::now() > deadline {
            fail("the bypasser never allocated");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let allocated = Instant::now();
    loop {
        if let Ok(Some(_)) = run.try_wait() {
            return Some(allocated.elapsed());
        }
        if allocated.elapsed() > GIVE_UP {
            let _ = run.kill();
            let _ = run.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "> 60 s".to_string(), |d| format!("{:.3} s", d.as_secs_f64()))
}

fn config(listen: &str) -> String {
    format!("[watch]\nlisten = \"{listen}\"\n")
}

fn main() {
    let mut trials = 5usize;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => {}
            n => trials = n.parse().unwrap_or_else(|_| fail(format!("usage: cargo bench --bench watch_stall [-- TRIALS], not `{n}`"))),
        }
    }
    let workload = workload::build("watch_stall");
    println!("attack     bypasser lives: mean    max      SIGHUP→reloaded  SIGTERM→exited   ({trials} trials each; defaults, descriptor limit 1024)");
    for attack in ["none", "idle", "pipeline", "header", "locks"] {
        let host = workload::Host::new("watch_stall", &config("127.0.0.1:0"));
        // User nobody reads the script from there, and the public copy of the history.
        let _ = std::fs::set_permissions(host.path(""), std::fs::Permissions::from_mode(0o755));
        std::fs::copy(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/stall_attacker.py"), host.path("stall_attacker.py")).unwrap_or_else(|e| fail(e));
        let mut watch = Watch::start(&host);
        let (ip, port) = (watch.addr.ip().to_string(), watch.addr.port().to_string());
        let lib = |name: &str| -> String { host.path("lib").join(name).display().to_string() };
        let _attacker = match attack {
            "idle" => {
                let a = Attacker::start(&host, &["idle".into(), ip, port, "600".into(), "20".into()]);
                a.until("opened");
                Some(a)
            }
            "pipeline" => {
                let a = Attacker::start(&host, &["pipeline".into(), ip, port, "50000".into()]);
                a.until("stalled");
                Some(a)
            }
            "header" => Some(Attacker::start(&host, &["header".into(), ip, port, "400".into(), "1000".into()])),
            "locks" => {
                let copy = PathBuf::from(lib("history-snapshot.db"));
                let deadline = Instant::now() + GIVE_UP;
                while !copy.exists() {
                    if Instant::now() > deadline {
                        fail("no public copy of the history");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let a = Attacker::start(&host, &["lock".into(), lib("history.db"), lib("history.db-shm"), lib("history-snapshot.db")]);
                for _ in 0..3 {
                    a.until("");
                }
                Some(a)
            }
            _ => None,
        };
        let lives: Vec<Option<Duration>> = (0..trials).map(|t| bypasser_life(&host, &workload, t)).collect();
        let known: Vec<Duration> = lives.iter().flatten().copied().collect();
        let mean = (known.len() == lives.len()).then(|| known.iter().sum::<Duration>() / known.len().max(1) as u32);
        let max = (known.len() == lives.len()).then(|| known.iter().max().copied().unwrap_or_default());
        // A SIGHUP that moves the endpoint (and joined the old server's thread before).
        std::fs::write(host.path("vgpu.toml"), config("127.0.0.2:0")).unwrap_or_else(|e| fail(e));
        let sent = Instant::now();
        watch.signal(libc::SIGHUP);
        let reloaded = wait_line(&watch.lines, |l| l.contains("reloaded the config")).map(|at| at.duration_since(sent));
        let sent = Instant::now();
        watch.signal(libc::SIGTERM);
        let mut exited = None;
        while sent.elapsed() < GIVE_UP {
            if let Ok(Some(_)) = watch.child.try_wait() {
                exited = Some(sent.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("{attack:<10} {:>22}  {:>8}  {:>15}  {:>15}", secs(mean), secs(max), secs(reloaded), secs(exited));
    }
}
