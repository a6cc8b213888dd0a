//! `vgpu watch` as a daemon (issue #11): the systemd units verify; one watch per state
//! directory; SIGHUP reloads the config (a bad one is one warning, the running one stays);
//! `Type=notify` (READY=1, RELOADING=1, STOPPING=1, WATCHDOG=1, exit 0 on SIGTERM and
//! SIGINT, never stalled by a manager that stops reading); it runs safely beside a burst of
//! CLI commands; it refuses to run as non-root; the unit's capability bounding set is
//! enough for its work, which fails without it; install.sh installs the unit and says why
//! it does not start it; without NVML it still reconciles. Runs as root (real cgroups, `setpriv`); every wait is for a
//! line, a datagram or an exit, never a guessed delay.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::common::{self, artefact_dir, wait_for, Sim};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const GPU: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB")];
const UNIT_DIR: &str = concat!(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."), "/systemd");
const WATCH_UNIT: &str = "vgpu-watch.service";
/// How long any one expected line, datagram or exit may take.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// A running `vgpu watch`.

/// `vgpu --simulate watch` in the background, its stderr read line by line.
struct Watch {
    child: Child,
    lines: Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
}

impl Watch {
    fn spawn(sim: &Sim, env: &[(&str, &str)]) -> Watch {
        Watch::spawn_via(sim, &[], env)
    }

    /// `PREFIX… vgpu --simulate watch` (PREFIX: e.g. `setpriv …`).
    fn spawn_via(sim: &Sim, prefix: &[&str], env: &[(&str, &str)]) -> Watch {
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(env!("CARGO_BIN_EXE_vgpu"));
                cmd
            }
            None => Command::new(env!("CARGO_BIN_EXE_vgpu")),
        };
        cmd.args(["--simulate", "watch"]).env_remove("VGPU_SIMULATE").env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC");
        cmd.env_remove("JOURNAL_STREAM").env("VGPU_LOG", "vgpu=warn");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn vgpu watch");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines, seen: Vec::new() }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid() as i32), signal).expect("signal the watch");
    }

    /// The next line containing `needle`; the lines before it are kept in `seen`.
    fn expect_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("no line with {needle:?} from the watch; it said:\n{}", self.seen.join("\n")),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the watch ended ({:?}) before saying {needle:?}; it said:\n{}", self.child.try_wait(), self.seen.join("\n"))
                }
            }
        }
    }

    fn ready(&mut self) {
        self.expect_line("vgpu watch: ready");
    }

    /// Its exit status once it has exited (which it must within PATIENCE), and every line
    /// it said.
    fn wait(mut self) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the watch") {
                break status;
            }
            assert!(Instant::now() < deadline, "the watch did not exit; it said:\n{}", self.seen.join("\n"));
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends with the pipe.
        while let Ok(line) = self.lines.recv_timeout(PATIENCE) {
            self.seen.push(line);
        }
        (status, std::mem::take(&mut self.seen))
    }

    /// Stop it with `signal`; it must exit 0 and say so.
    fn stop(self, signal: Signal) -> Vec<String> {
        self.signal(signal);
        let (status, lines) = self.wait();
        assert_eq!(status.code(), Some(0), "the watch's exit on {signal}: {status:?}; it said:\n{}", lines.join("\n"));
        let last = format!("vgpu watch: stopped (signal {})", signal as i32);
        assert_eq!(lines.last().map(String::as_str), Some(last.as_str()), "it said:\n{}", lines.join("\n"));
        lines
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

/// A `[watch]` table with this interval and no metrics endpoint (tests run side by side:
/// they would all want the default port).
fn watch_config(interval: &str) -> String {
    format!("[watch]\ninterval = \"{interval}\"\nlisten = \"\"\n")
}

fn sim_with_interval(interval: &str) -> Sim {
    let sim = Sim::new(GPU);
    sim.write_vgpu_config(&watch_config(interval));
    sim
}

/// Lines that report trouble.
fn complaints(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("warning") || l.contains("error") || l.contains("cleaned up")).collect()
}

// ---------------------------------------------------------------------------------------
// (a) The units.

/// The units of `systemd/` as install.sh installs them (`/usr/local/bin/vgpu` → `bin`),
/// in a new directory.
fn units_for(bin: &Path) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for entry in std::fs::read_dir(UNIT_DIR).expect("systemd/") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let copy = dir.path().join(path.file_name().unwrap());
        std::fs::write(&copy, text.replace("/usr/local/bin/vgpu", bin.to_str().unwrap())).unwrap();
        units.push(copy);
    }
    units.sort();
    assert!(units.iter().any(|u| u.ends_with(WATCH_UNIT)), "no {WATCH_UNIT} in systemd/: {units:?}");
    (dir, units)
}

fn systemd_analyze() -> Command {
    let found = Command::new("systemd-analyze").arg("--version").stdout(Stdio::null()).status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "systemd-analyze not found: install the systemd package (apt-get install systemd; .ci/run does)"
    );
    Command::new("systemd-analyze")
}

/// What `systemd-analyze verify` says is wrong with `units`: its failure, and every line it
/// prints about them (an unknown key is only a warning, exit 0). Lines about other units
/// of the host (their dependencies) are not theirs to answer for. The man page check is left
/// out (`vgpu(1)` is not installed here); [`documentation_is_the_man_page`] does it.
fn verify_problems(units: &[PathBuf]) -> Vec<String> {
    let out = systemd_analyze().arg("verify").arg("--man=no").args(units).output().expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours = |line: &&str| units.iter().any(|u| line.contains(u.file_name().unwrap().to_str().unwrap()) || line.contains(u.to_str().unwrap()));
    let mut problems: Vec<String> = stderr.lines().filter(ours).map(str::to_owned).collect();
    if !out.status.success() {
        problems.push(format!("systemd-analyze verify: {}: {stderr}", out.status));
    }
    problems
}

#[test]
fn systemd_analyze_verify_passes_on_every_unit() {
    let (_dir, units) = units_for(Path::new(env!("CARGO_BIN_EXE_vgpu")));
    let problems = verify_problems(&units);
    assert!(problems.is_empty(), "systemd-analyze verify:\n{}", problems.join("\n"));

    // The check itself catches a wrong unit: a misspelt key (a warning only, exit 0), and an
    // ExecStart that is not there.
    let (_dir, units) = units_for(Path::new(env!("CARGO_BIN_EXE_vgpu")));
    let watch = units.iter().find(|u| u.ends_with(WATCH_UNIT)).unwrap();
    let good = std::fs::read_to_string(watch).unwrap();
    std::fs::write(watch, good.replace("RestartSec=", "RestartSecs=")).unwrap();
    assert!(!verify_problems(&units).is_empty(), "a misspelt key passed");
    let (_dir, units) = units_for(Path::new("/nonexistent/vgpu"));
    assert!(!verify_problems(&units).is_empty(), "a missing ExecStart binary passed");
}

#[test]
fn documentation_is_the_man_page() {
    for entry in std::fs::read_dir(UNIT_DIR).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("Documentation=")).collect();
        assert_eq!(docs, ["man:vgpu(1)"], "{}", path.display());
    }
    assert!(Path::new(concat!(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."), "/man/vgpu.1")).is_file());
}

/// `systemd-analyze security --offline=true`'s overall exposure (0 best, 10 worst) of each
/// service unit in `systemd/`, so hardening taken out of one fails a test. With systemd
/// 252: vgpu-watch 4.2 (3.2 before it ran services' replicas, whose sandbox it is),
/// vgpu-carbon 2.9 (9.6 before it was hardened), vgpu@ 4.2, vgpu-service@ 4.2 (vgpu@'s
/// sandbox: it is its replicas'). The timer is not rated (systemd
/// rates what a service may do; the timer's is vgpu-carbon).
const EXPOSURE_LIMITS: [(&str, f64); 4] =
    [("vgpu-carbon.service", 5.0), ("vgpu-service@.service", 5.0), ("vgpu-watch.service", 5.0), ("vgpu@.service", 5.0)];

fn exposure(dir: &Path, unit: &str) -> f64 {
    let out = systemd_analyze()
        .args(["security", "--offline=true", "--no-pager", unit])
        .current_dir(dir)
        .output()
        .expect("run systemd-analyze security");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "systemd-analyze security {unit}: {}\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("→ Overall exposure level for ")?.split_once(": ")?.1.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure for {unit} in:\n{stdout}"))
}

#[test]
fn the_units_stay_hardened() {
    let (dir, units) = units_for(Path::new(env!("CARGO_BIN_EXE_vgpu")));
    let services: Vec<String> =
        units.iter().filter_map(|u| u.file_name()?.to_str()).filter(|n| n.ends_with(".service")).map(str::to_owned).collect();
    let limited: Vec<&str> = EXPOSURE_LIMITS.iter().map(|(unit, _)| *unit).collect();
    assert_eq!(services, limited, "every service unit in systemd/ has an agreed exposure limit");
    for (unit, limit) in EXPOSURE_LIMITS {
        let level = exposure(dir.path(), unit);
        assert!(level <= limit, "{unit}'s exposure is {level}, above the agreed {limit}");
    }
    // The check catches a unit losing its hardening.
    let carbon = dir.path().join("vgpu-carbon.service");
    let text = std::fs::read_to_string(&carbon).unwrap();
    let bare: String = text.lines().take_while(|l| !l.starts_with("# Hardening.")).map(|l| format!("{l}\n")).collect();
    std::fs::write(&carbon, bare).unwrap();
    assert!(exposure(dir.path(), "vgpu-carbon.service") > 5.0, "an unhardened unit passed");
}

// ---------------------------------------------------------------------------------------
// (b) One watch per state directory.

#[test]
fn a_second_watch_on_the_same_state_directory_refuses_in_one_line() {
    let sim = sim_with_interval("100ms");
    let mut first = Watch::spawn(&sim, &[]);
    first.ready();

    let out = sim.vgpu(&["watch"]).timeout(PATIENCE).output().expect("run a second watch");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the second watch: {:?}, {stderr}", out.status);
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    let state = std::fs::canonicalize(sim.path("run")).unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!("vgpu: error: vgpu watch is already running for {} (pid {})", state.display(), first.pid())
    );

    // The first goes on: it still answers, and it lets go of the state directory when it
    // stops.
    first.signal(Signal::SIGHUP);
    first.expect_line("reloaded the config (interval 100ms)");
    first.stop(Signal::SIGTERM);
    let mut next = Watch::spawn(&sim, &[]);
    next.ready();
    next.stop(Signal::SIGTERM);
}

// ---------------------------------------------------------------------------------------
// (c) SIGHUP.

#[test]
fn sighup_reloads_the_config_and_a_bad_config_keeps_the_running_one() {
    let sim = sim_with_interval("1s");
    let mut watch = Watch::spawn(&sim, &[]);
    watch.ready();

    sim.write_vgpu_config(&watch_config("250ms"));
    watch.signal(Signal::SIGHUP);
    watch.expect_line("vgpu watch: reloaded the config (interval 250ms)");

    // A value out of range and a file that is not TOML: one warning line each, naming the
    // problem, and the watch goes on with what it had.
    let from = watch.seen.len();
    for (bad, says) in [("[watch]\ninterval = \"1ms\"\n", "[watch] interval"), ("[watch\ninterval = \n", "vgpu.toml")] {
        sim.write_vgpu_config(bad);
        watch.signal(Signal::SIGHUP);
        let line = watch.expect_line("kept the running config");
        assert!(line.starts_with("vgpu watch: warning: kept the running config: invalid config "), "{line}");
        assert!(line.contains(says), "{line}");
    }
    sim.write_vgpu_config(&watch_config("300ms"));
    watch.signal(Signal::SIGHUP);
    watch.expect_line("reloaded the config (interval 300ms)");
    let said: Vec<&String> = watch.seen[from..].iter().collect();
    assert_eq!(said.len(), 3, "one line per SIGHUP, nothing else:\n{said:#?}");
    assert!(said[..2].iter().all(|l| l.contains("warning: kept the running config")), "{said:#?}");

    let lines = watch.stop(Signal::SIGTERM);
    assert_eq!(complaints(&lines).len(), 2, "{lines:#?}");
}

// ---------------------------------------------------------------------------------------
// (d) Type=notify.

/// A service manager's notification socket, bound by the test.
struct Manager {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
}

impl Manager {
    fn new() -> Manager {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(PATIENCE)).unwrap();
        Manager { _dir: dir, path, socket }
    }

    fn env(&self) -> (&'static str, &str) {
        ("NOTIFY_SOCKET", self.path.to_str().unwrap())
    }

    /// Datagrams until one holds `line` (a whole line); returns that one.
    fn expect(&self, line: &str) -> String {
        let mut got = Vec::new();
        loop {
            let mut buf = [0u8; 4096];
            let n = self.socket.recv(&mut buf).unwrap_or_else(|e| panic!("no {line:?} ({e}); got {got:?}"));
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            if message.lines().any(|l| l == line) {
                return message;
            }
            got.push(message);
        }
    }
}

#[test]
fn type_notify_ready_reloading_watchdog_stopping_and_exit_0() {
    let sim = sim_with_interval("100ms");
    for stop in [Signal::SIGTERM, Signal::SIGINT] {
        let manager = Manager::new();
        let mut watch = Watch::spawn(&sim, &[manager.env(), ("WATCHDOG_USEC", "400000")]);
        // READY=1 is the first thing it says, after its first round.
        let mut buf = [0u8; 4096];
        let n = manager.socket.recv(&mut buf).expect("a first notification");
        assert_eq!(&buf[..n], b"READY=1\n");
        watch.ready();
        manager.expect("WATCHDOG=1");

        watch.signal(Signal::SIGHUP);
        let reloading = manager.expect("RELOADING=1");
        let usec: u64 = reloading
            .lines()
            .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {reloading:?}"));
        assert!(usec > 0);
        manager.expect("READY=1");

        watch.signal(stop);
        manager.expect("STOPPING=1");
        watch.stop(stop); // exit 0
    }
}

#[test]
fn a_manager_that_stops_reading_does_not_stall_the_watch() {
    let sim = sim_with_interval("50ms");
    let manager = Manager::new();
    let mut watch = Watch::spawn(&sim, &[manager.env(), ("WATCHDOG_USEC", "100000")]);
    watch.ready();
    // Fill the socket's queue: from now on every notification finds no room.
    let filler = UnixDatagram::unbound().unwrap();
    filler.set_nonblocking(true).unwrap();
    let mut sent = 0;
    while filler.send_to(b"X=1\n", &manager.path).is_ok() {
        sent += 1;
        assert!(sent < 1_000_000, "the queue never filled");
    }
    watch.signal(Signal::SIGHUP);
    watch.expect_line("reloaded the config");
    watch.stop(Signal::SIGTERM);
}

// ---------------------------------------------------------------------------------------
// (e) Beside CLI commands.

/// Every cgroup directory a workload `id` would have.
fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    use vgpu_cgroups::Layout;
    use vgpu_cgroups::Mode;
    let layout = Layout::detect().expect("a cgroup filesystem");
    match layout.mode {
        Mode::V2 => layout.unified.iter().map(|root| root.join("vgpu").join(id)).collect(),
        Mode::V1 | Mode::Hybrid => layout.v1.values().map(|mount| mount.join("vgpu").join(id)).collect(),
    }
}

#[test]
fn a_burst_of_cli_commands_beside_a_watch_all_succeed_and_leave_nothing() {
    let sim = sim_with_interval("50ms");
    let mut watch = Watch::spawn(&sim, &[]);
    watch.ready();

    // One workload that lives through the whole burst (until its stdin closes): the watch
    // reconciles many times meanwhile and must leave it alone.
    let mut long = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    long.args(["--simulate", "run", "--name", "long", "--mem", "1G", "--", "sh", "-c", "read x; echo $VGPU_WORKLOAD_ID"]);
    long.env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        long.env(k, v);
    }
    let mut long = long.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for("the long workload to run", || {
        sim.json(&["ps", "--json"])["workloads"].as_array().is_some_and(|rows| rows.iter().any(|w| w["name"] == "long" && w["state"] == "running"))
    });

    let ids: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let sim = &sim;
                scope.spawn(move || {
                    let mut ids = Vec::new();
                    for i in 0..5 {
                        let name = format!("burst-{t}-{i}");
                        let out = sim.vgpu(&["run", "--name", &name, "--mem", "1G", "--", "sh", "-c", "echo $VGPU_WORKLOAD_ID"]).output().unwrap();
                        assert!(out.status.success(), "vgpu run {name}: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
                        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
                        let ps = sim.vgpu(&["ps", "--json"]).output().unwrap();
                        assert!(ps.status.success(), "vgpu ps: {}", String::from_utf8_lossy(&ps.stderr));
                    }
                    ids
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(ids.len(), 20);
    assert!(ids.iter().all(|id| !id.is_empty()), "{ids:?}");

    drop(long.stdin.take()); // "read" ends
    let out = long.wait_with_output().unwrap();
    assert!(out.status.success(), "the long workload: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let long_id = String::from_utf8_lossy(&out.stdout).trim().to_string();

    // Nothing left: no record, vGPU, intent, temporary file or cgroup.
    let state = sim.path("run");
    for sub in ["workloads", "vgpus", "intents"] {
        let left = common::files_below(&state.join(sub));
        assert!(left.is_empty(), "left in {sub}/: {left:?}");
    }
    let temp: Vec<PathBuf> = common::files_below(&state).into_iter().filter(|p| p.to_string_lossy().contains(".tmp")).collect();
    assert!(temp.is_empty(), "{temp:?}");
    for id in ids.iter().chain([&long_id]) {
        for dir in cgroup_dirs(id) {
            assert!(!dir.exists(), "{} left behind", dir.display());
        }
    }
    let lines = watch.stop(Signal::SIGTERM);
    assert!(complaints(&lines).is_empty(), "the watch complained or tore something down:\n{}", lines.join("\n"));
}

// ---------------------------------------------------------------------------------------
// (f) Root only.

#[test]
fn a_watch_not_run_as_root_refuses_in_one_line() {
    let sim = sim_with_interval("1s");
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", env!("CARGO_BIN_EXE_vgpu"), "--simulate", "watch"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let out = cmd.env("VGPU_LOG", "vgpu=warn").stdin(Stdio::null()).output().expect("setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "vgpu: error: vgpu watch must run as root: it reconciles the store, signals workloads and freezes cgroups\n"
    );
    assert!(!sim.path("run/watch.lock").exists(), "it took the lock before refusing");
}

// ---------------------------------------------------------------------------------------
// (g) The unit's capabilities.

/// The unit's `CapabilityBoundingSet=` as setpriv's `--bounding-set` (`-all,+kill,…`).
fn unit_bounding_set() -> String {
    let text = std::fs::read_to_string(Path::new(UNIT_DIR).join(WATCH_UNIT)).unwrap();
    let caps: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .flat_map(|l| l.split_whitespace())
        .map(|cap| cap.strip_prefix("CAP_").unwrap_or_else(|| panic!("{cap}")).to_lowercase())
        .collect();
    assert!(!caps.is_empty(), "no CapabilityBoundingSet= in {WATCH_UNIT}");
    std::iter::once("-all".to_string()).chain(caps.iter().map(|c| format!("+{c}"))).collect::<Vec<_>>().join(",")
}

/// `vgpu run --user nobody --name NAME -- sleep 600` in the background.
fn nobody_sleeps(sim: &Sim, name: &str) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--user", "nobody", "--name", name, "--mem", "1G", "--", "sleep", "600"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.env("VGPU_LOG", "vgpu=warn").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

fn row(sim: &Sim, name: &str) -> Option<serde_json::Value> {
    // Read the records directly: `vgpu ps` (full root) would reconcile them itself.
    let dir = sim.path("run/workloads");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
        (v["name"] == name).then_some(v)
    })
}

#[test]
fn the_units_capabilities_are_enough_to_reconcile_other_users_workloads() {
    let sim = sim_with_interval("100ms");
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sim.path("fakegpu-state"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    // A tenant's workload that lives on, and one whose supervisor is killed: its `sleep` (the
    // tenant's), cgroup, vGPU directory (a procs/ only the tenant may read) and record are
    // left for the watch.
    let mut alive = nobody_sleeps(&sim, "alive");
    let mut orphan = nobody_sleeps(&sim, "orphan");
    wait_for("both workloads to run", || ["alive", "orphan"].iter().all(|n| row(&sim, n).is_some_and(|w| w["state"] == "running")));
    orphan.kill().unwrap();
    orphan.wait().unwrap();
    let record = row(&sim, "orphan").unwrap();
    let id = record["id"].as_str().unwrap().to_string();
    let vgpu_dir = sim.path("run/vgpus").join(record["vgpu"].as_str().unwrap());
    assert!(vgpu_dir.join("procs").is_dir());

    // Without the capabilities, the watch cannot: the oracle can fail.
    let mut bare = Watch::spawn_via(&sim, &["setpriv", "--bounding-set", "-all", "--no-new-privs", "--"], &[("VGPU_LOG", "vgpu=debug")]);
    let warning = format!("vgpu watch: warning: cannot clean up workload orphan ({id})");
    bare.expect_line(&warning);
    // It fails again every round, and says so once.
    bare.expect_line("round 4 done");
    let lines = bare.stop(Signal::SIGTERM);
    assert_eq!(lines.iter().filter(|l| l.contains(&warning)).count(), 1, "{}", lines.join("\n"));
    assert!(row(&sim, "orphan").is_some() && vgpu_dir.exists());

    // With the unit's, it cleans up after the orphan and leaves the live one alone.
    let set = unit_bounding_set();
    let mut watch = Watch::spawn_via(&sim, &["setpriv", "--bounding-set", &set, "--no-new-privs", "--"], &[]);
    watch.expect_line(&format!("vgpu watch: cleaned up workload orphan ({id})"));
    watch.ready();
    watch.signal(Signal::SIGHUP);
    watch.expect_line("reloaded the config"); // a few rounds more
    let lines = watch.stop(Signal::SIGTERM);
    assert!(
        lines.iter().all(|l| !l.contains("warning") && !l.contains("error")),
        "with {set}:\n{}",
        lines.join("\n")
    );
    assert!(row(&sim, "orphan").is_none(), "the orphan's record is left");
    assert!(!vgpu_dir.exists(), "{} is left", vgpu_dir.display());
    for dir in cgroup_dirs(&id) {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
    assert!(row(&sim, "alive").is_some_and(|w| w["state"] == "running"));
    assert!(alive.try_wait().unwrap().is_none(), "the live workload's supervisor ended");
    alive.kill().unwrap();
    alive.wait().unwrap();
    sim.vgpu(&["ps"]).assert().success(); // cleans up after "alive"
}

// ---------------------------------------------------------------------------------------
// (h) install.sh.

/// install.sh with the build step stubbed (a `cargo` that does nothing; the artefacts of
/// this test build stand in for the release build), into a temporary prefix, unit and
/// config directory. Returns its stdout.
fn install(root: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let fake_bin = root.join("fake-bin");
    let release = root.join("target/release");
    if !fake_bin.exists() {
        std::fs::create_dir_all(&fake_bin).unwrap();
        std::fs::write(fake_bin.join("cargo"), "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(fake_bin.join("cargo"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(&release).unwrap();
        for file in ["vgpu", "libvgpu.so", "libfakegpu.so"] {
            std::os::unix::fs::symlink(artefact_dir().join(file), release.join(file)).unwrap();
        }
    }
    let path = format!("{}:{}", fake_bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(concat!(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."), "/install.sh"));
    cmd.args(["--prefix", root.join("prefix").to_str().unwrap()])
        .args(args)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env("SYSTEMD_DIR", root.join("units"))
        .env("VGPU_ETC_DIR", root.join("etc"))
        .env_remove("VGPU_NO_WATCH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run install.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "install.sh {args:?}: {:?}\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn install_sh_installs_the_watch_unit_and_says_why_it_does_not_start_it() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let unit = root.join("units").join(WATCH_UNIT);
    let bin = root.join("prefix/bin/vgpu");

    let out = install(root, &["--no-watch"], &[]);
    assert!(out.contains(&format!("{WATCH_UNIT} installed, not enabled (--no-watch / VGPU_NO_WATCH=1)")), "{out}");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains(&format!("ExecStart={} watch\n", bin.display())), "{text}");
    assert_eq!(std::fs::metadata(&unit).unwrap().permissions().mode() & 0o777, 0o644);
    let installed: Vec<PathBuf> = std::fs::read_dir(root.join("units")).unwrap().map(|e| e.unwrap().path()).collect();
    let problems = verify_problems(&installed);
    assert!(problems.is_empty(), "the installed units:\n{}", problems.join("\n"));

    let out = install(root, &[], &[("VGPU_NO_WATCH", "1")]);
    assert!(out.contains("not enabled (--no-watch / VGPU_NO_WATCH=1)"), "{out}");

    // Without an opt-out: here systemd is not running (CI), or (a developer's machine) does
    // not load units from the temporary directory; either way it says so and succeeds.
    let out = install(root, &[], &[]);
    let reason = if Path::new("/run/systemd/system").is_dir() {
        "not started: systemd does not load units from there"
    } else {
        "not started: systemd is not running here"
    };
    assert!(out.contains(&format!("{WATCH_UNIT} installed")) && out.contains(reason), "{out}");

    let out = install(root, &["--uninstall"], &[]);
    assert!(out.contains("vgpu uninstalled"), "{out}");
    assert!(!unit.exists() && !bin.exists());
}

// ---------------------------------------------------------------------------------------
// (i) No NVML at start.

#[test]
fn without_nvml_it_still_reconciles_says_so_once_and_takes_nvml_up_on_reload() {
    let sim = sim_with_interval("50ms");
    // A workload whose supervisor died, for the first round to clean up.
    let mut orphan = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    orphan.args(["--simulate", "run", "--name", "orphan", "--mem", "1G", "--", "sleep", "600"]);
    for (k, v) in sim.env() {
        orphan.env(k, v);
    }
    let mut orphan = orphan.env("VGPU_LOG", "vgpu=warn").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the workload to run", || row(&sim, "orphan").is_some_and(|w| w["state"] == "running"));
    orphan.kill().unwrap();
    orphan.wait().unwrap();

    // The watch's simulated driver cannot start: its config is not TOML.
    let driver = sim.path("watch-gpus.toml");
    std::fs::write(&driver, "not toml [[").unwrap();
    let mut watch = Watch::spawn(&sim, &[("FAKEGPU_CONFIG", driver.to_str().unwrap())]);
    let said = watch.expect_line("reconciling only");
    assert!(said.starts_with("vgpu watch: warning: the simulated driver did not initialise"), "{said}");
    watch.expect_line("vgpu watch: cleaned up workload orphan");
    watch.ready();
    assert!(row(&sim, "orphan").is_none());

    // A reload tries again: the same problem is not said again; once the driver works, it
    // says it audits again.
    watch.signal(Signal::SIGHUP);
    watch.expect_line("reloaded the config");
    std::fs::copy(sim.path("fakegpu.toml"), &driver).unwrap();
    watch.signal(Signal::SIGHUP);
    watch.expect_line("vgpu watch: NVML is available again: auditing the GPUs");
    watch.expect_line("reloaded the config");
    let lines = watch.stop(Signal::SIGTERM);
    let warnings: Vec<&String> = lines.iter().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings, [&said], "{lines:#?}");
}
