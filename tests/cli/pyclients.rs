//! Real clients: unmodified third-party programs from PyPI that talk to NVML or the CUDA
//! driver API themselves (installed, pinned, by tests/fetch-pyclients.sh), run on the
//! simulated driver as a new user would run them: bare, where each sees the whole device
//! (an 80 GiB H100), and under `vgpu run --mem 4G`, where each sees 4 GiB; the client that
//! allocates (cuda-bindings) stops with a clean CUDA_ERROR_OUT_OF_MEMORY at the quota and
//! exits normally. gpustat also reports, inside and outside, the memory a vGPU's process
//! holds, and lists that process.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use crate::common::{self, artefact, Sim};

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");
const GIB: u64 = 1 << 30;
/// Every client runs to completion within this, or the test fails.
const LIMIT: Duration = Duration::from_secs(120);

/// The virtualenv holding the clients (tests/fetch-pyclients.sh; installs once). Fails the
/// test, with the script's message, when they cannot be had.
fn venv() -> PathBuf {
    let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fetch-pyclients.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "tests/fetch-pyclients.sh could not install the clients (these tests need them; no skipping):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(dir.join("bin/python").is_file(), "fetch-pyclients printed no virtualenv: {}", dir.display());
    dir
}

/// The program `bin/NAME` of the virtualenv, as a command line.
fn client(name: &str) -> Vec<String> {
    vec![venv().join("bin").join(name).display().to_string()]
}

/// The driver-API client: cuda-bindings' `cuda.bindings.driver` under a short script.
fn cuda_bindings_client() -> Vec<String> {
    vec![
        venv().join("bin/python").display().to_string(),
        format!("{}/tests/fixtures/cuda_bindings_alloc.py", concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
    ]
}

/// Run `argv` bare on the simulated driver: `libcuda.so.1` and `libnvidia-ml.so.1` are the
/// fake, found through LD_LIBRARY_PATH, as a driver install would provide them; no shim.
fn bare(sim: &Sim, argv: &[String]) -> Output {
    let dir = sim.path("driver");
    std::fs::create_dir_all(&dir).expect("mkdir driver");
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let link = dir.join(soname);
        if !link.exists() {
            std::os::unix::fs::symlink(artefact("libfakegpu.so"), &link).expect("driver link");
        }
    }
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).env("LD_LIBRARY_PATH", &dir).env_remove("LD_PRELOAD").env_remove("PYTHONPATH");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    finished("bare", argv, cmd.timeout(LIMIT).output().expect("run client"))
}

/// Run `argv` under `vgpu run --mem 4G`.
fn inside(sim: &Sim, argv: &[String]) -> Output {
    let mut args = vec!["run", "--mem", "4G", "--"];
    args.extend(argv.iter().map(String::as_str));
    let mut cmd = sim.vgpu(&args);
    cmd.env_remove("PYTHONPATH");
    finished("under vgpu run --mem 4G", argv, cmd.timeout(LIMIT).output().expect("run vgpu"))
}

/// The output of a client that exited 0 (a timeout or a crash fails the test).
fn finished(how: &str, argv: &[String], out: Output) -> Output {
    assert!(
        out.status.success(),
        "{argv:?} {how}: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// gpustat 1.1.1 (`gpustat --json`, NVML through nvidia-ml-py): `memory.total` in MiB.
#[test]
fn gpustat_sees_the_device_bare_and_4_gib_under_vgpu() {
    let sim = Sim::new(&[H100]);
    let argv = [client("gpustat"), vec!["--json".to_string()]].concat();
    let total_mib = |out: &Output| {
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("gpustat --json: bad JSON ({e}):\n{}", stdout(out)));
        let gpus = json["gpus"].as_array().expect("gpus").clone();
        assert_eq!(gpus.len(), 1, "{json}");
        assert_eq!(gpus[0]["name"], H100.0, "{json}");
        gpus[0]["memory.total"].as_u64().unwrap_or_else(|| panic!("no memory.total: {json}"))
    };
    assert_eq!(total_mib(&bare(&sim, &argv)), 80 * 1024, "bare: the whole device");
    assert_eq!(total_mib(&inside(&sim, &argv)), 4 * 1024, "inside: the quota");
}

/// The device row's "USED / TOTAL" memory figure of a text table, from the first line
/// where `/` follows a figure ending in `unit`: the text after the slash up to the next `│`
/// or `|`, trimmed (e.g. "80.00GiB", "4096MiB").
fn table_total(text: &str, unit: &str) -> String {
    for line in text.lines() {
        for (i, _) in line.match_indices(" / ") {
            if line[..i].trim_end().ends_with(unit) {
                let rest = &line[i + 3..];
                let end = rest.find(['│', '|']).unwrap_or(rest.len());
                return rest[..end].trim().to_string();
            }
        }
    }
    panic!("no USED / TOTAL memory figure in:\n{text}");
}

/// nvitop 1.7.2 (`nvitop --once`, NVML through nvidia-ml-py): its device table's
/// Memory-Usage column.
#[test]
fn nvitop_sees_the_device_bare_and_4_gib_under_vgpu() {
    let sim = Sim::new(&[H100]);
    let argv = [client("nvitop"), vec!["--once".to_string()]].concat();
    let out = stdout(&bare(&sim, &argv));
    assert!(out.contains("H100 80GB HBM3"), "{out}");
    assert_eq!(table_total(&out, "B"), "80.00GiB", "bare: the whole device\n{out}");
    let out = stdout(&inside(&sim, &argv));
    assert_eq!(table_total(&out, "B"), "4096MiB", "inside: the quota\n{out}");
}

/// py3nvml 0.2.7 (`py3smi`, NVML through its own ctypes bindings): its nvidia-smi-like
/// Memory-Usage column.
#[test]
fn py3smi_sees_the_device_bare_and_4_gib_under_vgpu() {
    let sim = Sim::new(&[H100]);
    let argv = client("py3smi");
    let out = stdout(&bare(&sim, &argv));
    assert_eq!(table_total(&out, "MiB"), "81920MiB", "bare: the whole device\n{out}");
    let out = stdout(&inside(&sim, &argv));
    assert_eq!(table_total(&out, "MiB"), "4096MiB", "inside: the quota\n{out}");
}

/// `KEY=` of the driver-API client's output.
fn field(out: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{out}"))
        .to_string()
}

fn bytes(out: &str, key: &str) -> u64 {
    field(out, key).parse().unwrap_or_else(|e| panic!("{key}= is not a number ({e}):\n{out}"))
}

/// cuda-bindings 12.9.4 (`cuda.bindings.driver`, the CUDA driver API): cuMemGetInfo's total,
/// then cuMemAlloc until the driver refuses: at the device's size bare, at the quota inside,
/// with CUDA_ERROR_OUT_OF_MEMORY and a normal exit both times.
#[test]
fn cuda_bindings_allocates_up_to_the_device_bare_and_up_to_the_quota_under_vgpu() {
    let sim = Sim::new(&[H100]);
    let argv = cuda_bindings_client();
    let chunk = 256 << 20;

    let out = stdout(&bare(&sim, &argv));
    assert_eq!(bytes(&out, "total"), 80 * GIB, "bare: the whole device\n{out}");
    assert_eq!(bytes(&out, "free"), 80 * GIB, "{out}");
    assert_eq!(field(&out, "stopped"), "CUDA_ERROR_OUT_OF_MEMORY", "{out}");
    assert_eq!(bytes(&out, "allocated"), 80 * GIB, "bare: allocation stops when the device is full\n{out}");

    let out = stdout(&inside(&sim, &argv));
    assert_eq!(bytes(&out, "total"), 4 * GIB, "inside: the quota\n{out}");
    assert_eq!(bytes(&out, "free"), 4 * GIB, "{out}");
    assert_eq!(field(&out, "stopped"), "CUDA_ERROR_OUT_OF_MEMORY", "inside: a clean OOM at the quota\n{out}");
    let allocated = bytes(&out, "allocated");
    assert!(
        allocated > 4 * GIB - chunk && allocated <= 4 * GIB,
        "inside: allocation stops at the 4 GiB quota, not before or past it: {allocated}\n{out}"
    );
}

/// `tests/fixtures/cuda_hold.py`: holds GIB GiB through the driver API, touches READY once
/// it does, and holds until its stdin closes.
fn hold_script() -> String {
    format!("{}/tests/fixtures/cuda_hold.py", concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// gpustat's one GPU: (memory.used MiB, memory.total MiB, [(pid, gpu_memory_usage MiB)]).
fn gpustat_memory(json_text: &str) -> (u64, u64, Vec<(u64, u64)>) {
    let json: serde_json::Value =
        serde_json::from_str(json_text).unwrap_or_else(|e| panic!("gpustat --json: bad JSON ({e}):\n{json_text}"));
    let gpu = &json["gpus"][0];
    let mib = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a number: {v} in {json}"));
    let processes = gpu["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes: {json}"))
        .iter()
        .map(|p| (mib(&p["pid"]), mib(&p["gpu_memory_usage"])))
        .collect();
    (mib(&gpu["memory.used"]), mib(&gpu["memory.total"]), processes)
}

/// While a process of a 4 GiB vGPU holds 1 GiB, gpustat inside that vGPU reports 1024 of
/// 4096 MiB used and the process with its 1024 MiB; gpustat outside, bare, reports the same
/// 1024 MiB used of the whole device's 81920.
#[test]
fn gpustat_reports_what_a_vgpu_holds_inside_and_outside() {
    let sim = Sim::new(&[H100]);
    let gpustat = client("gpustat").remove(0);
    let (hold, dir) = (hold_script(), sim.path("inside"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let d = dir.display();
    // The holder reads a FIFO that the shell keeps open on fd 3 until gpustat has run.
    let script = format!(
        "set -e\n\
         mkfifo {d}/hold.in\n\
         python3 {hold} 1 {d}/ready < {d}/hold.in > {d}/hold.out &\n\
         holder=$!\n\
         exec 3> {d}/hold.in\n\
         i=0; while [ ! -e {d}/ready ]; do i=$((i+1)); [ $i -le 400 ] || exit 3; sleep 0.05; done\n\
         echo holder=$holder\n\
         {gpustat} --json\n\
         exec 3>&-\n\
         wait $holder\n"
    );
    let out = stdout(&inside(&sim, &["sh".to_string(), "-c".to_string(), script]));
    let (first, json) = out.split_once('\n').unwrap_or_else(|| panic!("{out}"));
    let holder: u64 = first.strip_prefix("holder=").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{out}"));
    let (used, total, processes) = gpustat_memory(json);
    assert_eq!((used, total), (1024, 4096), "inside: 1 GiB of the 4 GiB quota\n{out}");
    assert_eq!(processes, vec![(holder, 1024)], "inside: the holder and its 1 GiB\n{out}");

    // Outside: the same vGPU's holding seen by gpustat run bare.
    let ready = sim.path("outside.ready");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    run.args(["--simulate", "run", "--mem", "4G", "--", "python3", &hold, "1"]).arg(&ready).env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        run.env(k, v);
    }
    let mut run = run
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn vgpu run");
    let stdin = run.stdin.take();
    common::wait_for("the holder to allocate", || ready.exists());
    let (used, total, processes) = gpustat_memory(&stdout(&bare(&sim, &[gpustat, "--json".to_string()])));
    drop(stdin);
    let status = run.wait().expect("wait vgpu run");
    assert!(status.success(), "vgpu run of the holder: {status:?}");
    assert_eq!((used, total), (1024, 80 * 1024), "outside: 1 GiB of the whole device");
    assert_eq!(processes.iter().map(|p| p.1).collect::<Vec<_>>(), vec![1024], "outside: one process with 1 GiB: {processes:?}");
}
