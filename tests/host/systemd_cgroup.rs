//! The cgroup managers on this machine's real cgroups: a workload started by a vgpu that
//! runs inside a delegated systemd unit lives in that unit's subtree (`<unit>/vgpu/<id>`),
//! is found there by commands run from elsewhere (`ps`, `kill`), and is removed when it
//! ends; `vgpu doctor --json` says which manager it uses.
//!
//! No systemd runs here (nor in CI), so the "unit" is a cgroup directory this test makes in
//! every hierarchy vgpu uses, handed to vgpu with `VGPU_CGROUP_SELF` (the test-only stand-in
//! for `/proc/self/cgroup`) and `VGPU_CGROUP_MANAGER=delegated` (what `Delegate=yes` makes
//! vgpu detect). Needs root, as tests/host/cgroup_real.rs does; never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::{wait_for, Sim};
use vgpu_cgroups::Controller;
use vgpu_cgroups::Layout;
use vgpu_cgroups::Mode;

/// A cgroup directory standing in for a systemd unit's, in every hierarchy vgpu uses;
/// removed (deepest first) when dropped.
struct FakeUnit {
    rel: String,
    dirs: Vec<PathBuf>,
}

impl FakeUnit {
    fn new() -> FakeUnit {
        assert!(nix::unistd::geteuid().is_root(), "tests/host/systemd_cgroup.rs must run as root (CI does): it creates cgroups");
        let layout = Layout::detect().expect("no cgroup filesystem is mounted");
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let rel = format!("/vgpu-test-unit-{}-{nanos}.service", std::process::id());
        let mut dirs: Vec<PathBuf> = match layout.mode {
            Mode::V2 => layout.unified.iter().cloned().collect(),
            Mode::V1 | Mode::Hybrid => Controller::USED.iter().filter_map(|c| layout.mount_of(*c).map(Path::to_path_buf)).collect(),
        };
        dirs.sort();
        dirs.dedup();
        let dirs: Vec<PathBuf> = dirs.into_iter().map(|mount| mount.join(&rel[1..])).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        FakeUnit { rel, dirs }
    }
}

/// Remove the (empty) cgroup directories under `dir`, deepest first, then `dir`.
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

impl Drop for FakeUnit {
    fn drop(&mut self) {
        for dir in &self.dirs {
            rmdir_tree(dir);
        }
    }
}

/// A `vgpu run` ended (SIGTERM, which it relays to its workload) if the test fails first.
struct Running(Option<std::process::Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

fn delegated(cmd: &mut Command, unit: &FakeUnit) {
    cmd.env("VGPU_CGROUP_MANAGER", "delegated").env("VGPU_CGROUP_SELF", &unit.rel);
}

/// A workload file as an admin writes it: root's, mode 0644 whatever the umask (vgpu reads
/// one only if root alone may write it).
fn write_workload(path: &Path, text: impl AsRef<[u8]>) -> std::io::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
}

/// The pids listed in `dir/cgroup.procs`.
fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn a_workload_of_a_delegated_unit_lives_in_its_subtree_and_goes_with_it() {
    let unit = FakeUnit::new();
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let started = sim.path("started");
    let script = format!("echo $$ > {}; exec sleep 600", started.display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", "svc", "--", "sh", "-c", &script]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    delegated(&mut cmd, &unit);
    let mut guard = Running(Some(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run")));
    wait_for("the workload to start", || std::fs::read_to_string(&started).is_ok_and(|s| s.ends_with('\n')));
    let pid: u32 = std::fs::read_to_string(&started).unwrap().trim().parse().expect("the workload's pid");

    // `ps` from outside the unit (no override) finds it through its record.
    let row = sim.row("svc");
    let id = row["id"].as_str().expect("an id").to_string();
    assert_eq!(
        row["pids"].as_array().map(|p| p.iter().filter_map(|v| v.as_u64()).collect::<Vec<_>>()),
        Some(vec![u64::from(pid)]),
        "{row}"
    );

    // Inside the unit's cgroup in every hierarchy; not under the hierarchies' own vgpu/.
    for dir in &unit.dirs {
        let cgroup = dir.join("vgpu").join(&id);
        assert_eq!(procs(&cgroup), vec![pid], "{} should hold the workload", cgroup.display());
        let root_vgpu = dir.parent().expect("a mount").join("vgpu").join(&id);
        assert!(!root_vgpu.exists(), "{} was made outside the unit", root_vgpu.display());
    }
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the workload's /proc/PID/cgroup");
    assert!(own.contains(&format!("{}/vgpu/{id}", unit.rel)), "{own}");

    // `kill` from outside the unit too; the workload ends, its cgroup goes.
    let out = sim.vgpu(&["kill", &id]).output().expect("vgpu kill");
    assert!(out.status.success(), "vgpu kill: {}", String::from_utf8_lossy(&out.stderr));
    let mut run = guard.0.take().expect("vgpu run");
    let status = run.wait().expect("wait for vgpu run");
    let mut stderr = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().expect("stderr"), &mut stderr).expect("read stderr");
    assert!(!status.success(), "vgpu run of a killed workload: {status} {stderr}");
    for dir in &unit.dirs {
        assert!(!dir.join("vgpu").join(&id).exists(), "{} left behind: {stderr}", dir.join("vgpu").join(&id).display());
    }
    assert!(sim.ps().is_empty(), "the record is gone");
}

/// A cgroup a user owns (one of their own delegated subtree, where they could run `sudo vgpu
/// run` from) is never taken as the workload's home: root would put the workload, and the
/// limits it was given, where its owner may move or change them.
#[test]
fn a_cgroup_a_user_owns_is_never_the_workloads_home() {
    let unit = FakeUnit::new();
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let nobody = nix::unistd::User::from_name("nobody").expect("getpwnam").expect("a nobody user");
    for dir in &unit.dirs {
        std::os::unix::fs::chown(dir, Some(nobody.uid.as_raw()), None).expect("chown the unit's cgroup");
    }
    let ran = sim.path("ran");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--", "touch"]).arg(&ran);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    delegated(&mut cmd, &unit);
    let out = cmd.output().expect("vgpu run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is not a cgroup root owns"), "{stderr}");
    assert!(!ran.exists(), "the workload ran");
    for dir in &unit.dirs {
        assert!(!dir.join("vgpu").exists(), "{} was made in a user's cgroup", dir.join("vgpu").display());
    }
    assert!(sim.ps().is_empty(), "a record was left: {stderr}");
}

fn manager_check(sim: &Sim, unit: Option<&FakeUnit>) -> serde_json::Value {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "doctor", "--json"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.env_remove("VGPU_CGROUP_MANAGER").env_remove("VGPU_CGROUP_SELF");
    if let Some(unit) = unit {
        delegated(&mut cmd, unit);
    }
    let out = cmd.output().expect("vgpu doctor --json");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "cgroup manager"))
        .cloned()
        .unwrap_or_else(|| panic!("no cgroup manager check: {report}"))
}

#[test]
fn doctor_reports_the_manager() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let check = manager_check(&sim, None);
    assert_eq!(check["status"], "ok", "{check}");
    let detail = check["detail"].as_str().unwrap_or_default();
    // This machine and CI have no systemd as PID 1.
    if !Path::new("/run/systemd/system").exists() {
        assert!(detail.starts_with("cgroupfs") && detail.contains("not PID 1"), "{detail}");
    }
    let unit = FakeUnit::new();
    let check = manager_check(&sim, Some(&unit));
    let detail = check["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("delegated") && detail.contains(&format!("{}/vgpu/", unit.rel)), "{check}");

    // The systemd manager with no systemd on its bus: a warning saying so.
    let mut unanswered = sim.vgpu(&["doctor", "--json"]);
    unanswered.env("VGPU_CGROUP_MANAGER", "systemd").env("VGPU_SYSTEMD_BUS", format!("unix:path={}", sim.path("no-bus").display()));
    let report: serde_json::Value = serde_json::from_slice(&unanswered.output().expect("vgpu doctor").stdout).expect("doctor's JSON");
    let check = report["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "cgroup manager")).cloned().expect("the check");
    assert_eq!(check["status"], "warn", "{check}");
    assert!(check["detail"].as_str().is_some_and(|d| d.starts_with("systemd") && d.contains("no-bus")), "{check}");

    let mut bad = sim.vgpu(&["doctor", "--json"]);
    bad.env("VGPU_CGROUP_MANAGER", "docker");
    let out = bad.output().expect("vgpu doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
    let check = report["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "cgroup manager")).cloned().expect("the check");
    assert_eq!(check["status"], "fail", "{check}");
    assert!(check["detail"].as_str().is_some_and(|d| d.contains("docker")), "{check}");
}

/// `vgpu run --workload NAME` (what `vgpu@NAME.service` runs) takes its options and command
/// from `NAME.toml` in the workloads directory (`VGPU_WORKLOADS_DIR` here,
/// `/etc/vgpu/workloads` by default).
#[test]
fn a_workload_file_gives_run_its_options_and_command() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let dir = sim.path("workloads");
    std::fs::create_dir(&dir).unwrap();
    let started = sim.path("started");
    write_workload(
        &dir.join("job.toml"),
        format!(
            "name = \"from-file\"\nmem = \"2G\"\ncompute = 30\nenv = {{ GREETING = \"hi\" }}\ncommand = [\"sh\", \"-c\", \"echo $GREETING $$ > {}; exec sleep 600\"]\n",
            started.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--workload", "job"]).env("VGPU_WORKLOADS_DIR", &dir);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut guard = Running(Some(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn vgpu run")));
    wait_for("the workload to start", || std::fs::read_to_string(&started).is_ok_and(|s| s.ends_with('\n')));
    let said = std::fs::read_to_string(&started).unwrap();
    assert!(said.starts_with("hi "), "the file's env: {said:?}");
    let row = sim.row("from-file");
    let text = row.to_string();
    assert!(text.contains(&(2u64 << 30).to_string()), "the file's mem = \"2G\": {row}");
    assert!(row["compute_pct"] == 30 || text.contains("\"compute_pct\":30"), "the file's compute = 30: {row}");
    let id = row["id"].as_str().expect("an id").to_string();
    let out = sim.vgpu(&["kill", &id]).output().expect("vgpu kill");
    assert!(out.status.success(), "vgpu kill: {}", String::from_utf8_lossy(&out.stderr));
    let mut run = guard.0.take().expect("vgpu run");
    run.wait().expect("wait for vgpu run");
}

#[test]
fn a_bad_workload_file_is_refused_naming_the_key() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let dir = sim.path("workloads");
    std::fs::create_dir(&dir).unwrap();
    for (text, key) in [
        ("mems = \"2G\"\ncommand = [\"true\"]\n", "mems"),
        ("mem = \"2X\"\ncommand = [\"true\"]\n", "mem"),
        ("compute = 300\ncommand = [\"true\"]\n", "compute"),
        ("mem = \"2G\"\n", "command"),
        ("partition = \"p\"\nmem = \"2G\"\ncommand = [\"true\"]\n", "partition"),
    ] {
        write_workload(&dir.join("bad.toml"), text).unwrap();
        let out = sim.vgpu(&["run", "--workload", "bad"]).env("VGPU_WORKLOADS_DIR", &dir).output().expect("vgpu run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {stderr}");
        assert!(stderr.contains(key) && stderr.contains("bad.toml"), "{text:?} should name `{key}` and the file: {stderr}");
    }
    // The command line's options may not conflict with the file's either (clap saw only its own).
    write_workload(&dir.join("ok.toml"), "mem = \"2G\"\ncommand = [\"true\"]\n").unwrap();
    let out = sim.vgpu(&["run", "--workload", "ok", "--partition", "p"]).env("VGPU_WORKLOADS_DIR", &dir).output().expect("vgpu run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--partition") && stderr.contains("`mem`"), "{stderr}");
    for (name, says) in [("nope", "nope.toml"), ("a b", "plain name"), (".hidden", "plain name")] {
        let out = sim.vgpu(&["run", "--workload", name]).env("VGPU_WORKLOADS_DIR", &dir).output().expect("vgpu run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name:?}: {stderr}");
        assert!(stderr.contains(says), "{name:?}: {stderr}");
    }
    assert!(sim.ps().is_empty());
}

// ---------------------------------------------------------------------------------------
// The systemd (D-Bus) manager, against a real dbus-daemon and a stand-in for systemd.

/// What the stand-in was asked: (unit, Delegate=, PIDs).
type Calls = std::sync::Arc<std::sync::Mutex<Vec<(String, bool, Vec<u32>)>>>;

/// A minimal `org.freedesktop.systemd1.Manager`, served on a thread of its own until dropped:
/// StartTransientUnit makes the scope's cgroup (`<mount>/<slice>/<unit>` in every hierarchy
/// vgpu uses, real cgroups), moves the PIDs there, and emits JobRemoved(…, "done") as systemd
/// does when the job ends, here before its reply (a client that listens only after the reply
/// misses it) and after another job's failed JobRemoved (a client that takes any job's
/// signal for its own fails); Subscribe and `org.freedesktop.DBus.Peer.Ping` answer empty.
struct StandIn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const MANAGER: &str = "org.freedesktop.systemd1.Manager";

impl StandIn {
    /// On the bus at `address` (`unix:path=…`) as `org.freedesktop.systemd1`, once this returns.
    fn serve(address: &str, slice: String, mounts: Vec<PathBuf>, calls: Calls) -> StandIn {
        use rustbus::connection::{ll_conn::force_finish_on_error, Timeout};
        let wait = Timeout::Duration(std::time::Duration::from_secs(30));
        let path = address.strip_prefix("unix:path=").and_then(|a| a.split(',').next()).expect("a unix:path= address");
        let addr = rustbus_nix::sys::socket::UnixAddr::new(path).expect("the bus's socket address");
        let mut conn = rustbus::RpcConn::connect_to_path(addr, wait).expect("the stand-in for systemd on the bus");
        let serial = conn
            .send_message(&mut rustbus::standard_messages::request_name("org.freedesktop.systemd1", 0))
            .and_then(|ctx| ctx.write_all().map_err(force_finish_on_error))
            .expect("RequestName");
        let reply = conn.wait_response(serial, wait).expect("RequestName's reply");
        // 1: DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
        assert_eq!(reply.body.parser().get::<u32>().ok(), Some(1), "the stand-in owns org.freedesktop.systemd1");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut jobs = 0u32;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                // Woken now and then to see whether the test is over.
                let call = match conn.wait_call(Timeout::Duration(std::time::Duration::from_millis(100))) {
                    Ok(call) => call,
                    Err(rustbus::connection::Error::TimedOut) => continue,
                    Err(e) => panic!("the stand-in's connection: {e}"),
                };
                let mut replies = Vec::new();
                match call.dynheader.member.as_deref().unwrap_or_default() {
                    "Ping" | "Subscribe" => replies.push(call.dynheader.make_response()),
                    "StartTransientUnit" => match start_transient_unit(&call, &slice, &mounts) {
                        Ok((name, delegate, pids)) => {
                            calls.lock().expect("calls").push((name.clone(), delegate, pids));
                            jobs += 1;
                            let job = format!("/org/freedesktop/systemd1/job/{jobs}");
                            // Another unit's job ending first, failed: not the one vgpu waits for.
                            let mut other = rustbus::MessageBuilder::new().signal(MANAGER, "JobRemoved", "/org/freedesktop/systemd1").build();
                            let other_path = rustbus::wire::ObjectPath::new("/org/freedesktop/systemd1/job/0").expect("a job path");
                            other.body.push_param4(0u32, other_path, "other.service", "failed").expect("JobRemoved's body");
                            replies.push(other);
                            let mut signal = rustbus::MessageBuilder::new().signal(MANAGER, "JobRemoved", "/org/freedesktop/systemd1").build();
                            let path = rustbus::wire::ObjectPath::new(job.as_str()).expect("a job path");
                            signal.body.push_param4(jobs, path, name.as_str(), "done").expect("JobRemoved's body");
                            replies.push(signal);
                            let mut reply = call.dynheader.make_response();
                            reply.body.push_param(path).expect("the job's path");
                            replies.push(reply);
                        }
                        Err(e) => {
                            let mut error = call.dynheader.make_error_response("org.freedesktop.DBus.Error.Failed", Some(e));
                            error.typ = rustbus::MessageType::Error;
                            replies.push(error);
                        }
                    },
                    _ => {
                        let mut error = rustbus::standard_messages::unknown_method(&call.dynheader);
                        error.typ = rustbus::MessageType::Error;
                        replies.push(error);
                    }
                }
                for mut message in replies {
                    conn.send_message(&mut message).and_then(|ctx| ctx.write_all().map_err(force_finish_on_error)).expect("the stand-in's answer");
                }
            }
        });
        StandIn { stop, thread: Some(thread) }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let outcome = thread.join();
            if !std::thread::panicking() {
                outcome.expect("the stand-in for systemd");
            }
        }
    }
}

/// StartTransientUnit(s name, s mode, a(sv) properties, a(sa(sv)) aux): the scope's cgroup
/// made and the PIDs moved there; (name, Delegate=, PIDs), or why not.
fn start_transient_unit(call: &rustbus::message_builder::MarshalledMessage, slice: &str, mounts: &[PathBuf]) -> Result<(String, bool, Vec<u32>), String> {
    use rustbus::wire::unmarshal::traits::Variant;
    type Properties<'a, 'b> = Vec<(&'a str, Variant<'b, 'a>)>;
    let (name, _mode, properties, _aux) = call
        .body
        .parser()
        .get4::<&str, &str, Properties, Vec<(&str, Properties)>>()
        .map_err(|e| format!("StartTransientUnit's arguments: {e:?}"))?;
    let mut delegate = false;
    let mut pids = Vec::new();
    for (key, value) in &properties {
        match *key {
            "Delegate" => delegate = value.get::<bool>().map_err(|e| format!("Delegate: {e:?}"))?,
            "PIDs" => pids.extend(value.get::<Vec<u32>>().map_err(|e| format!("PIDs: {e:?}"))?),
            _ => {}
        }
    }
    for mount in mounts {
        let slice = mount.join(slice);
        let scope = slice.join(name);
        let made = std::fs::create_dir_all(&scope);
        // What systemd does for a delegated unit on v2: its controllers handed down.
        let _ = std::fs::write(slice.join("cgroup.subtree_control"), "+cpu +memory +pids");
        for pid in &pids {
            made.as_ref().map_err(|e| format!("mkdir {}: {e}", scope.display()))?;
            std::fs::write(scope.join("cgroup.procs"), pid.to_string()).map_err(|e| format!("move {pid} to {}: {e}", scope.display()))?;
        }
    }
    Ok((name.to_string(), delegate, pids))
}

/// A private `dbus-daemon` on a socket in `dir`, ended when dropped.
struct Bus {
    daemon: std::process::Child,
    address: String,
}

impl Bus {
    fn start(dir: &Path) -> Bus {
        let socket = dir.join("bus");
        let mut daemon = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("dbus-daemon not found: install the dbus-daemon package (apt-get install dbus-daemon; .ci/run does)");
        // It prints its address once it listens.
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(daemon.stdout.take().expect("stdout")), &mut line).expect("dbus-daemon's address");
        assert!(line.starts_with("unix:"), "dbus-daemon printed {line:?}");
        Bus { daemon, address: line.trim().to_string() }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// The test slice in every hierarchy, removed (deepest first) when dropped.
struct Slice(Vec<PathBuf>);

impl Drop for Slice {
    fn drop(&mut self) {
        self.0.iter().for_each(|dir| rmdir_tree(dir));
    }
}

#[test]
fn a_run_from_a_shell_gets_a_transient_scope_over_dbus() {
    assert!(nix::unistd::geteuid().is_root(), "tests/host/systemd_cgroup.rs must run as root (CI does): it creates cgroups");
    let layout = Layout::detect().expect("no cgroup filesystem is mounted");
    let mut mounts: Vec<PathBuf> = match layout.mode {
        Mode::V2 => layout.unified.iter().cloned().collect(),
        Mode::V1 | Mode::Hybrid => Controller::USED.iter().filter_map(|c| layout.mount_of(*c).map(Path::to_path_buf)).collect(),
    };
    mounts.sort();
    mounts.dedup();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let slice = format!("vgpu-test-{}-{nanos}.slice", std::process::id());
    let _slice = Slice(mounts.iter().map(|m| m.join(&slice)).collect());

    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let bus = Bus::start(sim.dir.path());
    let calls = Calls::default();
    let _systemd = StandIn::serve(&bus.address, slice.clone(), mounts.clone(), calls.clone());

    let systemd_env = |cmd: &mut Command| {
        cmd.env("VGPU_CGROUP_MANAGER", "systemd").env("VGPU_SYSTEMD_BUS", &bus.address).env_remove("VGPU_CGROUP_SELF");
    };
    let started = sim.path("started");
    let script = format!("echo $$ > {}; exec sleep 600", started.display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", "shell", "--", "sh", "-c", &script]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    systemd_env(&mut cmd);
    let mut guard = Running(Some(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run")));
    let supervisor = guard.0.as_ref().map(std::process::Child::id).expect("vgpu run's pid");
    wait_for("the workload to start", || std::fs::read_to_string(&started).is_ok_and(|s| s.ends_with('\n')));
    let pid: u32 = std::fs::read_to_string(&started).unwrap().trim().parse().expect("the workload's pid");
    let id = sim.row("shell")["id"].as_str().expect("an id").to_string();

    // vgpu asked for vgpu-<id>.scope, delegated, holding itself.
    let scope = format!("vgpu-{id}.scope");
    assert_eq!(calls.lock().unwrap().clone(), vec![(scope.clone(), true, vec![supervisor])]);
    // The workload is in <scope>/vgpu/<id> in every hierarchy; vgpu run in the scope.
    for mount in &mounts {
        let cgroup = mount.join(&slice).join(&scope).join("vgpu").join(&id);
        assert_eq!(procs(&cgroup), vec![pid], "{} should hold the workload", cgroup.display());
    }
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the workload's /proc/PID/cgroup");
    assert!(own.contains(&format!("/{slice}/{scope}/vgpu/{id}")), "{own}");
    let sup = std::fs::read_to_string(format!("/proc/{supervisor}/cgroup")).expect("vgpu run's /proc/PID/cgroup");
    assert!(sup.contains(&format!("/{slice}/{scope}")), "{sup}");

    // doctor names the manager.
    let mut doctor = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    doctor.args(["--simulate", "doctor", "--json"]);
    for (k, v) in sim.env() {
        doctor.env(k, v);
    }
    systemd_env(&mut doctor);
    let report: serde_json::Value = serde_json::from_slice(&doctor.output().expect("vgpu doctor").stdout).expect("doctor's JSON");
    let check = report["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "cgroup manager")).cloned().expect("the check");
    assert!(check["detail"].as_str().is_some_and(|d| d.starts_with("systemd") && d.contains("answers")), "{check}");
    assert_eq!(check["status"], "ok", "{check}");

    // Killed from outside: the workload's cgroup goes; the scope is systemd's to end.
    let out = sim.vgpu(&["kill", &id]).output().expect("vgpu kill");
    assert!(out.status.success(), "vgpu kill: {}", String::from_utf8_lossy(&out.stderr));
    let mut run = guard.0.take().expect("vgpu run");
    run.wait().expect("wait for vgpu run");
    for mount in &mounts {
        let cgroup = mount.join(&slice).join(&scope).join("vgpu").join(&id);
        assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    }
    assert_eq!(calls.lock().unwrap().len(), 1);
}

/// `CapabilityBoundingSet=` of `systemd/vgpu@.service` as setpriv's `--bounding-set`.
fn template_bounding_set() -> String {
    let text = std::fs::read_to_string(concat!(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."), "/systemd/vgpu@.service")).expect("systemd/vgpu@.service");
    let caps: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .flat_map(|l| l.split_whitespace())
        .map(|cap| format!("+{}", cap.strip_prefix("CAP_").unwrap_or_else(|| panic!("{cap}")).to_lowercase()))
        .collect();
    assert!(!caps.is_empty(), "no CapabilityBoundingSet= in vgpu@.service");
    std::iter::once("-all".to_string()).chain(caps).collect::<Vec<_>>().join(",")
}

/// The template unit's capabilities (and NoNewPrivileges=) are enough for `vgpu run` to run a
/// workload file as another user; without them it cannot (so the check can fail).
#[test]
fn the_template_units_capabilities_run_another_users_workload() {
    use std::os::unix::fs::PermissionsExt;
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sim.path("fakegpu-state"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let dir = sim.path("workloads");
    std::fs::create_dir(&dir).unwrap();
    write_workload(&dir.join("tenant.toml"), "user = \"nobody\"\nmem = \"1G\"\ncommand = [\"sh\", \"-c\", \"test $(id -u) != 0 && exit 7\"]\n").unwrap();
    let run = |bounding: &str| {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--bounding-set", bounding, "--no-new-privs", "--", env!("CARGO_BIN_EXE_vgpu"), "--simulate", "run", "--workload", "tenant"]);
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        cmd.env("VGPU_WORKLOADS_DIR", &dir).output().expect("setpriv (util-linux)")
    };
    let set = template_bounding_set();
    let out = run(&set);
    assert_eq!(out.status.code(), Some(7), "with {set}: {}", String::from_utf8_lossy(&out.stderr));
    let out = run("-all");
    assert_ne!(out.status.code(), Some(7), "without capabilities the workload ran: {}", String::from_utf8_lossy(&out.stderr));
    assert!(sim.ps().is_empty());
}

/// The template unit runs the workload file of its instance, in a subtree delegated to vgpu.
#[test]
fn the_template_unit_runs_the_instances_workload_file_delegated() {
    let text = std::fs::read_to_string(concat!(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."), "/systemd/vgpu@.service")).expect("systemd/vgpu@.service");
    let values = |key: &str| -> Vec<String> { text.lines().filter_map(|l| l.strip_prefix(&format!("{key}="))).map(str::to_owned).collect() };
    assert_eq!(values("ExecStart"), ["/usr/local/bin/vgpu run --workload %i"]);
    assert_eq!(values("Delegate"), ["yes"]);
    // Stop reaches vgpu run first, which relays it and tears down.
    assert_eq!(values("KillMode"), ["mixed"]);
}
