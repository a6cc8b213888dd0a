//! `vgpu carbon plan/apply/reset` through the simulated driver, observed with
//! `vgpu devices --json`: a busy GPU runs at the locked cap, a second apply writes nothing,
//! reset restores the defaults, the power-limit fallback, partial failure, non-root refusal.
//!
//! A busy GPU needs a CUDA client: the test binary re-runs itself as one (`busy_client`),
//! loading the simulated `libcuda.so.1` and queueing two minutes of kernels on GPU 0.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::Sim;
use serde_json::Value;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");
/// Set in the re-run child: the path of the libcuda.so.1 to load.
const BUSY_ENV: &str = "VGPU_CARBON_TEST_LIBCUDA";

/// Not a test of its own: the body of the CUDA client child (a no-op when run normally).
#[test]
fn busy_client() {
    let Some(lib) = std::env::var_os(BUSY_ENV) else {
        return;
    };
    type Cu = c_int;
    let path = CString::new(lib.into_encoded_bytes()).expect("path");
    // SAFETY: dlopen/dlsym with valid C strings; each symbol is cast to its cuda.h signature.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!handle.is_null(), "dlopen libcuda.so.1");
        let sym = |name: &str| {
            let c = CString::new(name).expect("name");
            let p = libc::dlsym(handle, c.as_ptr());
            assert!(!p.is_null(), "dlsym {name}");
            p
        };
        let init: unsafe extern "C" fn(c_uint) -> Cu = std::mem::transmute(sym("cuInit"));
        let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> Cu = std::mem::transmute(sym("cuDeviceGet"));
        let ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> Cu =
            std::mem::transmute(sym("cuCtxCreate_v2"));
        let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Cu =
            std::mem::transmute(sym("cuModuleLoadData"));
        let get: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Cu =
            std::mem::transmute(sym("cuModuleGetFunction"));
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> Cu;
        let launch: Launch = std::mem::transmute(sym("cuLaunchKernel"));
        assert_eq!(init(0), 0);
        let mut dev = 0;
        assert_eq!(device_get(&mut dev, 0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut ctx, 0, dev), 0);
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(load(&mut module, c"fake cubin".as_ptr().cast()), 0);
        assert_eq!(get(&mut function, module, c"kernel".as_ptr()), 0);
        // About two minutes of waves at full clock, queued asynchronously.
        assert_eq!(
            launch(
                function,
                158_400_000,
                1,
                1,
                256,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
    }
    println!("busy-ready {}", std::process::id());
    // Stay until the parent closes stdin (or dies).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// A CUDA client keeping GPU 0 busy; killed when dropped.
struct Busy {
    child: Child,
    pid: u32,
}

impl Busy {
    fn start(sim: &Sim) -> Busy {
        // Any simulated command makes the link directory that holds libcuda.so.1.
        sim.json(&["devices", "--json"]);
        let lib = sim.path("run/simulate/libcuda.so.1");
        assert!(lib.exists(), "{} missing", lib.display());
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            // Its name in the harness (tests/integration.rs): module path, then the function.
            .args(["carbon::carbon_apply::busy_client", "--exact", "--nocapture", "--test-threads=1"])
            .envs(sim.env())
            .env(BUSY_ENV, &lib)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the CUDA client");
        let stdout = child.stdout.take().expect("stdout");
        let mut pid = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("client output");
            // The harness may have printed "test busy_client ... " on the same line.
            if let Some((_, p)) = line.split_once("busy-ready ") {
                pid = Some(p.trim().parse().expect("pid"));
                break;
            }
        }
        let pid = pid.expect("the CUDA client did not get ready");
        Busy { child, pid }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gpu(v: &Value, index: usize) -> &Value {
    &v["gpus"][index]
}

fn devices(sim: &Sim) -> Value {
    sim.json(&["devices", "--json"])["gpus"].clone()
}

fn log_actions(sim: &Sim) -> Vec<String> {
    let text = std::fs::read_to_string(sim.path("lib/carbon.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("log line is JSON")["action"].as_str().unwrap_or("").to_string()
        })
        .collect()
}

fn all_writes_empty(v: &Value) -> bool {
    v["gpus"].as_array().unwrap().iter().all(|g| g["writes"].as_array().unwrap().is_empty())
}

#[test]
fn apply_caps_the_busy_gpu_idempotently_and_reset_restores() {
    let sim = Sim::new(&[H100, H100]);
    sim.write_vgpu_config("");
    let busy = Busy::start(&sim);
    assert_eq!(devices(&sim)[0]["sm_clock_mhz"], 1980, "busy and uncapped: full clock");

    let plan = sim.json(&["carbon", "plan", "--json", "--intensity", "400", "--budget", "200"]);
    assert_eq!(plan["intensity_g_per_kwh"], 400.0);
    assert_eq!(plan["budget_g_per_hour"], 200.0);
    assert!(plan["predicted_g_per_hour"].as_f64().unwrap() <= 200.0);
    assert_eq!(gpu(&plan, 0)["workload_name"], format!("pid {}", busy.pid));
    let clock = gpu(&plan, 0)["clock_mhz"].as_u64().unwrap();
    assert!(345 < clock && clock < 1980, "capped between the extremes: {clock}");
    assert_eq!((gpu(&plan, 1)["gpu_index"].as_u64(), gpu(&plan, 1)["clock_mhz"].as_u64()), (Some(1), Some(345)), "idle GPU at its lowest clock");
    assert!(!sim.path("lib/carbon.jsonl").exists(), "plan changes nothing");

    let first = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "200"]);
    let writes = gpu(&first, 0)["writes"].as_array().unwrap().clone();
    assert!(writes.contains(&serde_json::json!({"op": "enable-persistence"})), "{writes:?}");
    assert!(writes.contains(&serde_json::json!({"op": "lock-clocks", "min_mhz": 345, "max_mhz": clock})), "{writes:?}");
    let now = devices(&sim);
    assert_eq!(now[0]["sm_clock_mhz"].as_u64(), Some(clock), "the busy GPU runs at the cap");
    assert_eq!(now[1]["sm_clock_mhz"], 345);

    let second = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "200"]);
    assert!(all_writes_empty(&second), "a second identical apply writes nothing: {second}");
    let table = sim.vgpu(&["carbon", "apply", "--intensity", "400", "--budget", "200"]).output().unwrap();
    assert!(table.status.success());
    assert_eq!(String::from_utf8_lossy(&table.stdout).matches("unchanged").count(), 2);

    let dirtier = sim.json(&["carbon", "apply", "--json", "--intensity", "800", "--budget", "200"]);
    let lower = gpu(&dirtier, 0)["clock_mhz"].as_u64().unwrap();
    assert!(lower < clock, "higher intensity, lower cap: {lower} vs {clock}");
    assert_eq!(devices(&sim)[0]["sm_clock_mhz"].as_u64(), Some(lower));

    let reset = sim.json(&["carbon", "reset", "--json"]);
    assert_eq!(reset["action"], "reset");
    assert!(gpu(&reset, 0)["writes"].as_array().unwrap().contains(&serde_json::json!({"op": "reset-clocks"})));
    assert_eq!(devices(&sim)[0]["sm_clock_mhz"], 1980, "reset: full clock again");
    assert_eq!(log_actions(&sim), ["apply", "apply", "apply", "apply", "reset"]);
    drop(busy);
}

#[test]
fn without_clock_locking_the_power_limit_caps() {
    let sim =
        Sim::with_config("[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\nclock_locking = false\n");
    sim.write_vgpu_config("");
    let _busy = Busy::start(&sim);
    let first = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "120"]);
    let g = gpu(&first, 0);
    assert!(g["error"].is_null(), "{g}");
    assert!(g["notes"].to_string().contains("clock locking is not supported"), "{g}");
    let mw = g["writes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["op"] == "set-power-limit")
        .and_then(|w| w["mw"].as_u64())
        .expect("a power limit was set");
    let now = devices(&sim);
    assert_eq!(now[0]["power_limit_w"].as_f64(), Some(mw as f64 / 1000.0));
    assert!(now[0]["sm_clock_mhz"].as_u64().unwrap() < 1980, "the power cap slows the busy GPU: {}", now[0]);

    let second = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "120"]);
    assert!(all_writes_empty(&second), "{second}");

    sim.json(&["carbon", "reset", "--json"]);
    assert_eq!(devices(&sim)[0]["power_limit_w"], 700.0);
}

#[test]
fn one_failing_gpu_does_not_stop_the_others() {
    let sim = Sim::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\n\
         [[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\nclock_locking = false\npower_limit_settable = false\n",
    );
    sim.write_vgpu_config("[carbon]\nbudget_g_per_hour = 500\n");
    let out = sim.vgpu(&["carbon", "apply", "--json", "--intensity", "300"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "carbon apply failed on 1 of 2 GPUs: GPU 1: cannot lock clocks (not supported) nor set the power limit"
        ),
        "{stderr}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(gpu(&report, 0)["error"].is_null());
    assert!(gpu(&report, 0)["writes"].to_string().contains("lock-clocks"), "GPU 0 was still capped: {report}");
    assert_eq!(log_actions(&sim), ["apply"], "the decision is logged all the same");
}

#[test]
fn an_unmeetable_budget_applies_the_lowest_clocks_and_says_so() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config("");
    let out = sim.vgpu(&["carbon", "apply", "--json", "--intensity", "800", "--budget", "50"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["budget_met"], false);
    assert_eq!(gpu(&report, 0)["clock_mhz"], 345);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be met"));
}

#[test]
fn missing_or_bad_budget_is_a_usage_error() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config("");
    for (args, want) in [
        (vec!["carbon", "plan", "--intensity", "100"], "no carbon budget"),
        (vec!["carbon", "apply", "--intensity", "100", "--budget=-3"], "--budget must be a non-negative number"),
    ] {
        let out = sim.vgpu(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(want));
    }
    assert!(!sim.path("lib/carbon.jsonl").exists());
}

fn open_up(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = if meta.is_dir() { 0o777 } else { 0o666 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        if meta.is_dir() {
            open_up(&path);
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn not_root_is_refused_in_one_line() {
    assert!(nix_is_root(), "this test runs as root (it switches to nobody), like the rest of the suite");
    let sim = Sim::new(&[H100, H100]);
    sim.write_vgpu_config("");
    devices(&sim);
    open_up(sim.dir.path());
    for args in [&["carbon", "apply", "--intensity", "300", "--budget", "100"][..], &["carbon", "reset"][..]] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_vgpu"))
            .arg("--simulate")
            .args(args)
            .envs(sim.env())
            .env("VGPU_LOG", "vgpu=warn")
            .output()
            .expect("run setpriv");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        // Up front, before NVML is asked anything (issue 29: it used to warn "lowest clocks
        // applied", print a table of refusals, then an error about carbon.jsonl).
        assert!(stderr.starts_with(&format!("vgpu: error: vgpu {} {} must run as root (through sudo)", args[0], args[1])), "{stderr}");
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn workloads_recorded_by_vgpu_run_are_planned_by_name() {
    let sim = Sim::new(&[H100, H100]);
    sim.write_vgpu_config("");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--gpu", "1", "--mem", "1G", "--name", "trainer", "--", "sleep", "60"]);
    let mut run = cmd.envs(sim.env()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("vgpu run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let plan = loop {
        let plan = sim.json(&["carbon", "plan", "--json", "--intensity", "200", "--budget", "1000"]);
        if gpu(&plan, 1)["workload_name"] == "trainer" || std::time::Instant::now() > deadline {
            break plan;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // SIGTERM: vgpu run relays it to the workload and cleans up.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = run.wait();
    assert_eq!(gpu(&plan, 1)["workload_name"], "trainer", "{plan}");
    assert!(gpu(&plan, 0)["workload_name"].is_null());
    assert_eq!(gpu(&plan, 1)["clock_mhz"], 1980, "a generous budget: full clock");
}

#[test]
fn a_held_apply_lock_fails_in_time_naming_its_holder() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config("");
    devices(&sim);
    sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
    // An apply that hangs (a stuck NVML call) holds the lock: the timer's next run must not
    // queue behind it forever.
    let lock_path = sim.path("run/carbon-applied.lock");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&lock_path).unwrap();
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).unwrap();
    std::fs::write(&lock_path, format!("{}\n", std::process::id())).unwrap();
    let out = sim.vgpu(&["carbon", "apply", "--intensity", "400", "--budget", "100"]).env("VGPU_LOCK_TIMEOUT_MS", "300").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(&format!("pid {}", std::process::id())) && stderr.contains("carbon-applied.lock"), "{stderr}");
    drop(held);
    sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
}
