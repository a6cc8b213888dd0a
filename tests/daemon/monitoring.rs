//! Monitoring for every user (issue #11, item 7): `ps`, `pool`, `devices`, `partition list`
//! and `carbon plan|intensity` work for users who may not write the store, write nothing,
//! and never wait for the store lock; `--watch` refreshes them. Runs as root; the other user
//! is `nobody` (uid 65534) through `setpriv`. The store lock is held by the test process
//! itself while the listings run, so a listing that waited for it would never return.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;

use crate::common::{wait_for, Sim};

const A100: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB")];
const GIB: u64 = 1 << 30;
/// How long a listing may take before the test calls it hung (it should take well under a
/// second; the lock the test holds would keep a waiting one forever).
const HUNG: &str = "60";
/// Carbon commands read a static intensity.
const CARBON: &str = "[carbon]\nsource = \"static\"\nvalue = 300\nbudget_g_per_hour = 400\n";

/// A CUDA client that allocates `GIB` GiB through the simulated driver, writes `ready`, and
/// waits until killed.
const HOLD: &str = "import ctypes, sys, time\n\
    cuda = ctypes.CDLL('libcuda.so.1')\n\
    assert cuda.cuInit(0) == 0\n\
    dev = ctypes.c_int()\n\
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0\n\
    ctx = ctypes.c_void_p()\n\
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0\n\
    assert cuda.cuCtxSetCurrent(ctx) == 0\n\
    ptr = ctypes.c_uint64()\n\
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[2]) << 30)) == 0\n\
    open(sys.argv[1], 'w').write('ready')\n\
    time.sleep(3600)\n";

/// A simulation other users can look into (its temporary directory is the test's, 0700),
/// whose simulated driver they can use (its state is shared, like /dev/nvidia*), with a
/// static carbon intensity.
fn shared_sim() -> Sim {
    let sim = Sim::new(A100);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sim.path("fakegpu-state"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    sim.write_vgpu_config(CARBON);
    sim
}

/// `vgpu --simulate ARGS…` in `sim` as `nobody`, or as root with `as_root`, failing the test
/// if it runs for `HUNG` seconds. The store lock's wait is set far beyond that, so a command
/// that waited for the lock shows as hung, not as its own timeout.
fn listing(sim: &Sim, as_root: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=5", HUNG]);
    if !as_root {
        cmd.args(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_vgpu")).arg("--simulate").args(args);
    cmd.envs(sim.env()).env("VGPU_LOCK_TIMEOUT_MS", "3600000").env("VGPU_LOG", "vgpu=warn").current_dir("/");
    let started = Instant::now();
    let out = cmd.output().expect("run timeout(1)");
    assert_ne!(out.status.code(), Some(124), "vgpu {args:?} hung for {:?} (waiting for the lock?)", started.elapsed());
    out
}

/// JSON stdout of a successful [`listing`].
fn listing_json(sim: &Sim, as_root: bool, args: &[&str]) -> Value {
    let out = listing(sim, as_root, args);
    let who = if as_root { "root" } else { "nobody" };
    assert!(
        out.status.success(),
        "vgpu {args:?} as {who} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("vgpu {args:?} as {who}: bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// A root workload of `gib` GiB in use, started with `vgpu run --mem 4G`, running once its
/// process has allocated.
struct Workload {
    child: Child,
}

impl Workload {
    fn start(sim: &Sim, name: &str, gib: u64) -> Workload {
        let ready = sim.path(&format!("{name}.ready"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.args(["--simulate", "run", "--mem", "4G", "--name", name, "--", "python3", "-c", HOLD])
            .arg(&ready)
            .arg(gib.to_string())
            .envs(sim.env())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().expect("spawn vgpu run");
        let workload = Workload { child };
        wait_for(&format!("workload {name} to allocate"), || ready.exists());
        workload
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // SIGTERM to `vgpu run` reaches the workload; it then cleans up after itself.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// A process this test started, killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Hold the store lock as a writer does (an exclusive `flock` on `<state>/lock`). A command
/// of this test (a workload's `vgpu run` tidying up, a reconcile) may hold it for a moment:
/// retried until it is free, for at most 10 s.
fn hold_lock(sim: &Sim) -> Flock<File> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let file = File::options().read(true).write(true).open(sim.path("run/lock")).expect("open the store lock");
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return lock,
            Err((_, nix::errno::Errno::EAGAIN)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Err((_, e)) => panic!("take the store lock: {e}"),
        }
    }
}

/// Everything below `dir`: each path's type, mode, owner and, for a file, its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, (u32, u32, Option<Vec<u8>>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())).flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let bytes = meta.file_type().is_file().then(|| std::fs::read(&path).unwrap());
            if meta.file_type().is_dir() {
                stack.push(path.clone());
            }
            out.insert(path, (meta.mode(), meta.uid(), bytes));
        }
    }
    out
}

/// The state and library directories, for "nothing was written".
fn store_tree(sim: &Sim) -> BTreeMap<PathBuf, (u32, u32, Option<Vec<u8>>)> {
    let mut all = tree(&sim.path("run"));
    all.extend(tree(&sim.path("lib")));
    all
}

/// The workload named `name` in a `ps --json` document (or its `workloads` array).
fn workload_in<'a>(ps: &'a Value, name: &str) -> &'a Value {
    let rows = ps["workloads"].as_array().or(ps.as_array()).unwrap_or_else(|| panic!("ps --json has no workloads: {ps}"));
    rows.iter().find(|w| w["name"] == name).unwrap_or_else(|| panic!("no workload {name} in {ps}"))
}

#[test]
fn every_user_lists_everything_while_a_writer_holds_the_lock_and_writes_nothing() {
    let sim = shared_sim();
    let _w = Workload::start(&sim, "train", 1);
    sim.vgpu(&["partition", "create", "svc", "--gpu", "0", "--mem", "2G"]).assert().success();
    // Root's own view first: the shim's figure.
    let root = sim.json(&["ps", "--json"])["workloads"].clone();
    let row = workload_in(&root, "train");
    assert_eq!((row["gpus"][0]["memory_used_bytes"].as_u64(), row["gpus"][0]["memory_used_source"].as_str()), (Some(GIB), Some("shim")), "{row}");

    let _lock = hold_lock(&sim);
    let before = store_tree(&sim);

    // ps: the workload, its quota, and a memory figure from the driver (its usage file is
    // root's, 0600), said to be the driver's.
    let ps = listing_json(&sim, false, &["ps", "--json"]);
    let row = workload_in(&ps, "train");
    let gpu = &row["gpus"][0];
    assert_eq!(gpu["memory_quota_bytes"].as_u64(), Some(4 * GIB), "{row}");
    assert_eq!(gpu["memory_used_bytes"].as_u64(), Some(GIB), "the driver's figure: {row}");
    assert_eq!(gpu["memory_used_source"], "driver", "{row}");
    assert_eq!(row["usage_readable"], false, "{row}");
    assert_eq!((row["state"].as_str(), row["user"].as_str(), row["supervisor_alive"].as_bool()), (Some("running"), Some("root"), Some(true)), "{row}");
    assert_eq!(row["pids"].as_array().map(Vec::len), Some(1), "its process, from its cgroup: {row}");
    // With -a, its processes from the driver.
    let ps = listing_json(&sim, false, &["ps", "-a", "--json"]);
    let procs = &workload_in(&ps, "train")["processes"];
    assert_eq!(procs[0]["memory_used_bytes"][0].as_u64(), Some(GIB), "{procs}");
    assert_eq!(procs[0]["memory_used_source"], "driver", "{procs}");
    // The table marks the driver's figure.
    let out = listing(&sim, false, &["ps"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains("train") && table.contains("1 GiB* / 4 GiB"), "{table}{}", String::from_utf8_lossy(&out.stderr));

    // pool, devices, partition list, carbon plan and intensity.
    let pool = listing_json(&sim, false, &["pool", "--json"]);
    assert!(pool["total_blocks"].as_u64().is_some_and(|b| b > 0), "{pool}");
    let devices = listing_json(&sim, false, &["devices", "--json"]);
    assert_eq!(devices["gpus"][0]["memory_used_bytes"].as_u64(), Some(GIB), "{devices}");
    assert_eq!(devices["gpus"][0]["processes"].as_array().map(Vec::len), Some(1), "{devices}");
    let parts = listing_json(&sim, false, &["partition", "list", "--json"]);
    assert_eq!(parts["partitions"][0]["name"], "svc", "{parts}");
    assert_eq!(parts["partitions"][0]["memory_quota_bytes"].as_u64(), Some(2 * GIB), "{parts}");
    let plan = listing_json(&sim, false, &["carbon", "plan", "--json"]);
    assert!(plan["gpus"][0]["workload_name"].as_str().is_some_and(|w| w.contains("train")), "{plan}");
    let intensity = listing_json(&sim, false, &["carbon", "intensity", "--json"]);
    assert_eq!(intensity["intensity_g_per_kwh"].as_f64(), Some(300.0), "{intensity}");
    for args in [&["carbon", "plan"][..], &["carbon", "intensity"], &["pool"], &["devices"], &["partition", "list"]] {
        let out = listing(&sim, false, args);
        assert!(out.status.success(), "vgpu {args:?} as nobody: {}", String::from_utf8_lossy(&out.stderr));
    }

    // Root, while the lock is held: listed as it is, at once.
    let ps = listing_json(&sim, true, &["ps", "--json"]);
    assert_eq!(workload_in(&ps, "train")["gpus"][0]["memory_used_source"], "shim", "root reads the counters: {ps}");
    listing_json(&sim, true, &["pool", "--json"]);

    assert_eq!(store_tree(&sim), before, "a listing wrote to the state or library directory");
}

#[test]
fn a_fresh_store_is_listed_by_anyone_without_making_anything() {
    let sim = shared_sim();
    let before = store_tree(&sim);
    assert!(before.is_empty(), "{before:?}");
    let ps = listing_json(&sim, false, &["ps", "--json"]);
    assert_eq!(ps, serde_json::json!({"schema": 1, "workloads": []}));
    let devices = listing_json(&sim, false, &["devices", "--json"]);
    assert_eq!(devices["gpus"][0]["name"], "NVIDIA A100-SXM4-40GB", "{devices}");
    let pool = listing_json(&sim, false, &["pool", "--json"]);
    assert_eq!(pool["used_blocks"].as_u64(), Some(0), "{pool}");
    assert_eq!(listing_json(&sim, false, &["partition", "list", "--json"]), serde_json::json!({"schema": 1, "partitions": []}));
    listing_json(&sim, false, &["carbon", "plan", "--json"]);
    listing_json(&sim, false, &["carbon", "intensity", "--json"]);
    let out = listing(&sim, false, &["ps"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("No workloads running."), "{out:?}");
    assert_eq!(store_tree(&sim), before, "a listing made something in the state or library directory");
    // What only root may do says so in one line.
    let out = listing(&sim, false, &["pool", "compact"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.lines().count()), (Some(1), 1), "{stderr}");
    assert!(stderr.contains("must run as root"), "{stderr}");
}

/// A record whose supervisor died is shown, marked, while the lock is held (nobody may
/// clean it up then), and cleaned up by the next root listing once the lock is free.
#[test]
fn a_dead_supervisor_is_shown_marked_until_root_reconciles() {
    let sim = shared_sim();
    let ready = sim.path("orphan.pid");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--name", "orphan", "--", "sh", "-c", "echo $$ > \"$0.tmp\" && mv \"$0.tmp\" \"$0\" && exec sleep 3600"])
        .arg(&ready)
        .envs(sim.env())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut supervisor = Killed(cmd.spawn().expect("spawn vgpu run"));
    wait_for("the workload to start", || ready.exists());
    let pid: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    // Its process outlives its supervisor; whatever happens below, it does not outlive the test.
    let _orphan = Orphan(pid);
    let lock = hold_lock(&sim);
    supervisor.0.kill().expect("SIGKILL vgpu run");
    supervisor.0.wait().unwrap();
    for as_root in [false, true] {
        let ps = listing_json(&sim, as_root, &["ps", "--json"]);
        let row = workload_in(&ps, "orphan");
        assert_eq!(row["supervisor_alive"], false, "{row}");
        let out = listing(&sim, as_root, &["ps"]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("supervisor gone"), "{}", String::from_utf8_lossy(&out.stdout));
    }
    drop(lock);
    let out = listing(&sim, true, &["ps", "--json"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cleaned up workload orphan"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), serde_json::json!({"schema": 1, "workloads": []}));
}

/// The process of a workload whose supervisor was killed, killed when the test ends.
struct Orphan(i32);

impl Drop for Orphan {
    fn drop(&mut self) {
        // Only while it is still the workload's `sleep` (its pid may have been reused).
        if std::fs::read(format!("/proc/{}/cmdline", self.0)).is_ok_and(|c| c == b"sleep\x003600\x00") {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Processes on a vGPU's GPU that are in no vGPU: in the table always, in JSON with
/// `--unmanaged` (the plain `--json` lists the workloads only).
#[test]
fn processes_in_no_vgpu_are_listed() {
    let sim = shared_sim();
    let _w = Workload::start(&sim, "train", 1);
    // The same client, started without vgpu: the simulated driver through its link directory.
    let ready = sim.path("rogue.ready");
    let rogue = Killed(Command::new("python3")
        .args(["-c", HOLD])
        .arg(&ready)
        .arg("2")
        .envs(sim.env())
        .env("LD_LIBRARY_PATH", sim.path("run/simulate"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start the unmanaged client"));
    wait_for("the unmanaged client to allocate", || ready.exists());
    let ps = listing_json(&sim, false, &["ps", "--json", "--unmanaged"]);
    workload_in(&ps["workloads"], "train");
    let unmanaged = ps["unmanaged"].as_array().unwrap_or_else(|| panic!("{ps}"));
    assert_eq!(unmanaged.len(), 1, "{ps}");
    assert_eq!(unmanaged[0]["pid"].as_u64(), Some(u64::from(rogue.0.id())), "{ps}");
    assert_eq!((unmanaged[0]["memory_used_bytes"].as_u64(), unmanaged[0]["user"].as_str()), (Some(2 * GIB), Some("root")), "{ps}");
    assert!(listing_json(&sim, false, &["ps", "--json"]).get("unmanaged").is_none(), "plain --json lists the workloads only");
    let out = listing(&sim, false, &["ps"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("1 process(es) on these GPUs are in no vGPU") && table.contains(&rogue.0.id().to_string()), "{table}");
}

/// `--watch` without a terminal: one JSON document per line per refresh (or one table
/// after another, each under a header), until SIGTERM or SIGINT, then exit 0.
#[test]
fn watch_refreshes_until_a_signal_and_exits_0() {
    let sim = shared_sim();
    let _w = Workload::start(&sim, "train", 1);
    let _lock = hold_lock(&sim);
    for (args, signal, lines_per_refresh) in [
        (&["ps", "--watch", "0.2", "--json"][..], nix::sys::signal::Signal::SIGTERM, None),
        (&["devices", "--watch=0.2"][..], nix::sys::signal::Signal::SIGINT, Some("Every 200ms: vgpu devices")),
    ] {
        let mut child = Killed(Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_vgpu"))
            .arg("--simulate")
            .args(args)
            .envs(sim.env())
            .env("VGPU_LOCK_TIMEOUT_MS", "3600000")
            .current_dir("/")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the watch"));
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        let mut refreshes = 0;
        while refreshes < 2 {
            let line = lines.next().unwrap_or_else(|| panic!("vgpu {args:?} ended after {refreshes} refreshes")).unwrap();
            match lines_per_refresh {
                None => {
                    let ps: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not one JSON document ({e}): {line}"));
                    assert_eq!(workload_in(&ps, "train")["gpus"][0]["memory_used_bytes"].as_u64(), Some(GIB), "{line}");
                    refreshes += 1;
                }
                Some(header) => refreshes += usize::from(line.starts_with(header)),
            }
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.0.id() as i32), signal).unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(status.code(), Some(0), "vgpu {args:?} after {signal}: {status}");
    }
    // A bad interval is a usage error.
    let out = listing(&sim, false, &["ps", "--watch", "0.01"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}
