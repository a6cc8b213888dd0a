//! Harness for integration tests that run the real `vgpu` binary against the simulated
//! driver. Every test gets its own simulated GPUs, driver state and vgpu state:
//!
//!     let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
//!     let out = sim.vgpu(&["devices", "--json"]).assert().success();
//!
//! Its submodules: [`process`] (running a command to completion), [`watch`] (a `vgpu watch`
//! in the background, its log read line by line) and [`workload`] (the GPU workload
//! program, built on first use).

#![allow(dead_code)]

// Also included by shim/ and tests/fakegpu/ test harnesses, by this path: it stays there.
#[path = "../support/process.rs"]
pub mod process;
pub mod watch;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use assert_cmd::Command;
use tempfile::TempDir;

/// target/debug (or release): where cargo put `vgpu`, `libvgpu.so` and `libfakegpu.so`.
pub fn artefact_dir() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_vgpu"));
    bin.parent().expect("binary has a directory").to_path_buf()
}

/// Path of a built library, failing clearly when the workspace was not built first.
pub fn artefact(file: &str) -> PathBuf {
    let path = artefact_dir().join(file);
    assert!(
        path.is_file(),
        "{} missing: run `cargo build --workspace` before the tests",
        path.display()
    );
    path
}

/// One simulation: its temporary directory holds the simulated driver's config and state
/// and vgpu's config, state and lib directories. Dropping it (when the test ends, passed or
/// failed) kills every process it started and thaws its frozen workloads, then removes the
/// directory: see its `Drop`.
pub struct Sim {
    pub dir: TempDir,
}

impl Sim {
    /// Simulated GPUs given as (name, memory).
    pub fn new(devices: &[(&str, &str)]) -> Sim {
        let toml: String = devices
            .iter()
            .map(|(name, memory)| {
                format!("[[device]]\nname = \"{name}\"\nmemory = \"{memory}\"\n\n")
            })
            .collect();
        Sim::with_config(&toml)
    }

    /// Simulated GPUs from a full FAKEGPU_CONFIG text.
    pub fn with_config(fakegpu_toml: &str) -> Sim {
        artefact("libfakegpu.so");
        let dir = tempfile::Builder::new()
            .prefix("vgpu-test-")
            .tempdir()
            .expect("tempdir");
        std::fs::write(dir.path().join("fakegpu.toml"), fakegpu_toml)
            .expect("write fakegpu config");
        std::fs::write(dir.path().join("vgpu.toml"), "").expect("write vgpu config");
        for sub in ["fakegpu-state", "run", "lib"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        Sim { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Write the vgpu config file used by `vgpu()`.
    pub fn write_vgpu_config(&self, text: &str) -> PathBuf {
        let path = self.path("vgpu.toml");
        std::fs::write(&path, text).expect("write vgpu config");
        path
    }

    /// Environment every process of this simulation gets.
    pub fn env(&self) -> Vec<(String, PathBuf)> {
        let mut env = vec![
            ("FAKEGPU_CONFIG".to_string(), self.path("fakegpu.toml")),
            ("FAKEGPU_STATE".to_string(), self.path("fakegpu-state")),
            ("VGPU_STATE_DIR".to_string(), self.path("run")),
            ("VGPU_LIB_DIR".to_string(), self.path("lib")),
        ];
        env.push(("VGPU_CONFIG".to_string(), self.path("vgpu.toml")));
        // Workload cgroups under each hierarchy's vgpu/, as in CI, also on a machine where
        // systemd is PID 1 (whose `auto` would ask it for a scope): tests/host/systemd_cgroup.rs
        // overrides it to test the other managers.
        env.push(("VGPU_CGROUP_MANAGER".to_string(), "cgroupfs".into()));
        env
    }

    /// `vgpu --simulate ARGS…` in this simulation.
    pub fn vgpu(&self, args: &[&str]) -> Command {
        let mut cmd = Command::cargo_bin("vgpu").expect("vgpu binary");
        cmd.arg("--simulate")
            .args(args)
            .env_remove("VGPU_SIMULATE")
            .env("VGPU_LOG", "vgpu=warn");
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// `vgpu ARGS…` without `--simulate` (what a host with no NVIDIA driver sees).
    pub fn vgpu_real(&self, args: &[&str]) -> Command {
        let mut cmd = Command::cargo_bin("vgpu").expect("vgpu binary");
        cmd.args(args).env_remove("VGPU_SIMULATE");
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// JSON stdout of a successful `vgpu --simulate ARGS…`.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.vgpu(args).output().expect("run vgpu");
        assert!(
            out.status.success(),
            "vgpu {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "vgpu {args:?}: bad JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

impl Sim {
    /// `vgpu ps --json`'s rows (its `workloads`).
    pub fn ps(&self) -> Vec<serde_json::Value> {
        self.json(&["ps", "--json"])["workloads"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `vgpu run --name NAME RUN_ARGS… -- sh -c SCRIPT` in the background, once `vgpu ps`
    /// shows it running with its process.
    pub fn spawn_running(
        &self,
        name: &str,
        run_args: &[&str],
        script: &str,
    ) -> std::process::Child {
        let mut args = vec!["run", "--name", name];
        args.extend_from_slice(run_args);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let child = self.spawn(&args);
        wait_for(&format!("workload {name} to run"), || {
            self.ps().iter().any(|w| {
                w["name"] == name
                    && w["state"] == "running"
                    && w["pids"].as_array().is_some_and(|p| !p.is_empty())
            })
        });
        child
    }

    /// The `vgpu ps --json` row of workload `name`; fails the test when there is none.
    pub fn row(&self, name: &str) -> serde_json::Value {
        self.ps()
            .into_iter()
            .find(|w| w["name"] == name)
            .unwrap_or_else(|| panic!("no workload {name} in ps"))
    }
}

/// Poll `f` every 50 ms for up to 20 s; panic naming `what` if it never holds.
pub fn wait_for<F: FnMut() -> bool>(what: &str, mut f: F) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

impl Sim {
    /// `vgpu --simulate ARGS…` started in the background (output discarded).
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(args);
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn vgpu")
    }
}

/// The kill guard. Every process a test starts in this simulation carries its directory in
/// its environment (`Sim::env`'s paths all point into it, and vgpu passes them on to the
/// workloads it runs), whoever started it: the test, a `vgpu run`, a watch. Each of them is
/// SIGKILLed here, the test process itself excepted, and then every workload cgroup that
/// this simulation's state records is thawed if frozen (a task frozen by the v1 freezer
/// dies only once thawed), in a few rounds for what was forked meanwhile. It runs before
/// the fields are dropped, so before the `TempDir` is removed. Nothing here may panic (it
/// also runs while a failed test unwinds): what cannot be read has gone, or is not ours.
impl Drop for Sim {
    fn drop(&mut self) {
        let dir = self.dir.path().as_os_str().as_encoded_bytes().to_vec();
        for round in 0..5 {
            let pids = processes_carrying(&dir);
            for &pid in &pids {
                // SAFETY: kill(2) with a pid and a signal number, no memory involved.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            thaw_workloads(&self.path("run/workloads"));
            if pids.is_empty() || round == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The bytes of `sim`'s simulated GPU's state file (`<sim>/fakegpu-state/*.state`), its
/// magic and layout version checked: version 5 of crates/fakegpu/src/state.rs, whose
/// `layout_is_stable` test pins the offsets the callers read. Not through the fakegpu crate:
/// linking its rlib into a harness would rebuild libfakegpu.so under the other tests' feet.
pub fn fakegpu_state(sim: &Sim) -> Vec<u8> {
    let file = std::fs::read_dir(sim.path("fakegpu-state"))
        .expect("the driver's state directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "state"))
        .expect("the driver's state file");
    let bytes = std::fs::read(&file).expect("the driver's state file");
    assert_eq!(&bytes[..8], b"FAKEGPU\x01", "not a fakegpu state file");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")), 5, "fakegpu's state layout changed: update the offsets its readers use");
    bytes
}

/// Held by the [`serial`] test that runs now.
static SERIAL: Mutex<()> = Mutex::new(());

/// The nice value of a [`serial`] test's thread, and so of every process it starts (a child
/// keeps its parent's): under CFS a task at -15 weighs about 29 times one at 0.
const SERIAL_NICE: libc::c_int = -15;

/// One test at a time among the tests that take it, ahead of every other test on the CPU.
/// For tests that measure time or rates: their thread, and every process it starts (`vgpu
/// run`, the watch, the workloads), run at nice -15, so the harness's other tests (which
/// spend most of their time waiting) take only the CPU time they leave. The others go on
/// meanwhile: they used to wait, and the threads stood idle for a third of the run.
/// Take it first thing in the test (`let _serial = serial();`), before it starts anything.
pub fn serial() -> Serial {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    set_thread_nice(SERIAL_NICE);
    Serial(guard)
}

/// This thread's nice value (Linux's is per thread; a thread or process it starts keeps it).
fn set_thread_nice(nice: libc::c_int) {
    // SAFETY: gettid(2) and setpriority(2) on this thread's id, no memory involved.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    assert_eq!(rc, 0, "setpriority({nice}) for a serial test (run as root): {}", std::io::Error::last_os_error());
}

/// What [`serial`] returns: the test runs ahead of the others until it is dropped.
pub struct Serial(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Serial {
    fn drop(&mut self) {
        // Back to the harness's nice value, before the next serial test may start (the
        // guard is dropped after this body). The thread may run another test (one thread).
        // SAFETY: as in set_thread_nice.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 0) };
    }
}

/// The processes (other than this one) whose environment holds the path `dir` (followed by
/// `/`, `:` or the end of a value).
pub fn processes_carrying(dir: &[u8]) -> Vec<libc::pid_t> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Gone meanwhile, a zombie (empty) or not readable: not one to kill.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let holds = environ.windows(dir.len()).enumerate().any(|(at, w)| {
            w == dir && matches!(environ.get(at + dir.len()), None | Some(b'/' | b':' | 0))
        });
        if holds {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Thaw the frozen cgroup of every workload recorded in `workloads` (a state directory's
/// `workloads/`), where its record says it lives.
fn thaw_workloads(workloads: &Path) {
    use vgpu_cgroups::Cgroup;
    use vgpu_cgroups::CgroupHome;
    use vgpu_cgroups::FreezerState;
    use vgpu_cgroups::Layout;
    let Ok(entries) = std::fs::read_dir(workloads) else {
        return;
    };
    let Some(layout) = Layout::detect() else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read(entry.path()) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(name) = record["cgroup"].as_str() else {
            continue;
        };
        let home: CgroupHome = serde_json::from_value(record["cgroup_home"].clone()).unwrap_or_default();
        if let Ok(cgroup) = Cgroup::open_at(&layout, &home, name) {
            if cgroup.state().is_ok_and(|s| s != FreezerState::Thawed) {
                let _ = cgroup.thaw();
            }
        }
    }
}

/// Every file below `dir`, for "nothing was written" assertions.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}
