//! The checkpoint API (`cuCheckpointProcess*`): a controller process moves a target process
//! through RUNNING → LOCKED → CHECKPOINTED → LOCKED → RUNNING by pid. The target is the
//! `ckpt_target` probe (it holds memory, and with a progress file works in a loop); the
//! controller is the `ckpt_ctl` probe (one call per run, found with `cuGetProcAddress_v2`,
//! plus NVML's view of device 0 after it).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{field, Fake, Holder};
use cudarc::driver::sys::CUresult;
use fakegpu::state::{CheckpointOp, CheckpointState, DeviceState};

/// Every operation the controller probe knows: the six functions.
const ALL_OPS: [&str; 6] = ["get_state", "tid", "lock", "checkpoint", "restore", "unlock"];
const GIB: u64 = 1 << 30;

/// One 4 GiB device, so that memory runs out quickly.
const SMALL: &str = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"4GiB\"\n";

/// SMALL with checkpoint and restore copying at `gbps` GB/s.
fn small_at(gbps: &str) -> String {
    format!("checkpoint_gbps = {gbps}\n{SMALL}")
}

const RUNNING: &str = "0";
const LOCKED: &str = "1";
const CHECKPOINTED: &str = "2";

fn code(r: CUresult) -> String {
    (r as u32).to_string()
}

/// Run the controller: `op` on `pid`, with extra environment; its stdout.
fn ctl(fake: &Fake, pid: impl ToString, op: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = fake.probe("ckpt_ctl");
    cmd.env("CKPT_OP", op).env("CKPT_PID", pid.to_string());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ckpt_ctl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ckpt_ctl {op} {} failed: {}\n{stdout}{}",
        pid.to_string(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `op` on `pid` must give `expected` (and be found by cuGetProcAddress).
fn expect(fake: &Fake, pid: impl ToString, op: &str, expected: CUresult) -> String {
    let out = ctl(fake, pid, op, &[]);
    assert_eq!(
        field(&out, "getproc"),
        "0 status=0",
        "{op} resolves at 12080"
    );
    assert_eq!(field(&out, "result"), code(expected), "{op}:\n{out}");
    out
}

fn state(fake: &Fake, pid: u32) -> String {
    field(
        &expect(fake, pid, "get_state", CUresult::CUDA_SUCCESS),
        "state",
    )
    .to_string()
}

fn spawn_target(fake: &Fake, mib: u64, progress: Option<&Path>, kernel: &str) -> Holder {
    let mut cmd = fake.probe("ckpt_target");
    cmd.env("CKPT_ALLOC_MIB", mib.to_string())
        .env("FAKEGPU_KERNELS", format!("kernel={kernel}"));
    if let Some(p) = progress {
        cmd.env("CKPT_PROGRESS", p);
    }
    Holder::spawn(&mut cmd)
}

/// Start the controller on `op` without waiting for it (it is to be killed).
fn spawn_ctl(fake: &Fake, pid: u32, op: &str, env: &[(&str, &str)]) -> Child {
    let mut cmd = fake.probe("ckpt_ctl");
    cmd.env("CKPT_OP", op)
        .env("CKPT_PID", pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn ckpt_ctl")
}

/// Poll the shared state until `pid` is in operation `op`, which must be owned by
/// `controller`: true; false if the controller exited first (its status must be success).
fn wait_op(state: &DeviceState, pid: u32, op: CheckpointOp, controller: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((seen, owner)) = state.checkpoint_op(pid) {
            if seen == op {
                assert_eq!(owner, controller.id(), "{op:?} is owned by its controller");
                return true;
            }
        }
        if let Some(status) = controller.try_wait().expect("try_wait ckpt_ctl") {
            assert!(status.success(), "ckpt_ctl exited with {status}");
            return false;
        }
        assert!(Instant::now() < deadline, "{pid} never got to {op:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGKILL the controller and reap it.
fn kill(mut controller: Child) {
    controller.kill().expect("SIGKILL ckpt_ctl");
    let status = controller.wait().expect("reap ckpt_ctl");
    assert!(!status.success(), "ckpt_ctl finished before it was killed");
}

fn progress(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Wait (polling the target's own progress file) until it reports `at_least` iterations.
fn wait_progress(path: &Path, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = progress(path);
        if n >= at_least {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "the target stayed at {n} iterations (waiting for {at_least})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A target holding 1 GiB, making progress into `file`, and locked, on a driver copying at
/// `gbps` GB/s; `held` is the device memory it holds.
struct Locked {
    fake: Fake,
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
    target: Holder,
    pid: u32,
    states: Vec<DeviceState>,
    held: u64,
}

fn locked_target(gbps: &str) -> Locked {
    let fake = Fake::with_config(&small_at(gbps));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("progress");
    let target = spawn_target(&fake, 1024, Some(&file), "100us");
    let pid = target.pid();
    let states = fake.states();
    wait_progress(&file, 1);
    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    let held = states[0].used();
    assert!(held >= GIB);
    Locked { fake, _dir: dir, file, target, pid, states, held }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

#[test]
fn full_cycle_moves_memory_off_the_device_and_back() {
    let fake = Fake::with_config(SMALL);
    let target = spawn_target(&fake, 3072, None, "100us");
    let pid = target.pid();
    let states = fake.states();

    let out = expect(&fake, pid, "tid", CUresult::CUDA_SUCCESS);
    assert_eq!(
        field(&out, "tid"),
        pid.to_string(),
        "the thread that made the context"
    );
    assert_eq!(state(&fake, pid), RUNNING);
    assert_eq!(field(&out, "nvml_used"), (3 * GIB).to_string());
    assert_eq!(field(&out, "nvml_procs"), format!("{pid}:{}", 3 * GIB));

    let out = expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    assert_eq!(
        field(&out, "nvml_used"),
        (3 * GIB).to_string(),
        "locked keeps memory"
    );
    assert_eq!(state(&fake, pid), LOCKED);

    let out = expect(&fake, pid, "checkpoint", CUresult::CUDA_SUCCESS);
    assert_eq!(
        field(&out, "nvml_used"),
        "0",
        "checkpointed memory left the device"
    );
    assert_eq!(
        field(&out, "nvml_procs"),
        "",
        "a checkpointed process is not listed"
    );
    assert_eq!(state(&fake, pid), CHECKPOINTED);
    let procs = states[0].processes();
    assert_eq!(procs.len(), 1);
    assert_eq!(
        (procs[0].pid, procs[0].bytes, procs[0].checkpoint),
        (pid, 0, CheckpointState::Checkpointed)
    );

    // Another process takes memory that only fits because the target's left.
    let other = spawn_target(&fake, 2048, None, "100us");
    assert_eq!(states[0].used(), 2 * GIB);
    let out = expect(&fake, pid, "restore", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        field(&out, "nvml_used"),
        (2 * GIB).to_string(),
        "nothing half-restored"
    );
    assert_eq!(
        state(&fake, pid),
        CHECKPOINTED,
        "a failed restore stays checkpointed"
    );
    other.finish();
    assert_eq!(states[0].used(), 0);

    let out = expect(&fake, pid, "restore", CUresult::CUDA_SUCCESS);
    assert_eq!(field(&out, "nvml_used"), (3 * GIB).to_string());
    assert_eq!(field(&out, "nvml_procs"), format!("{pid}:{}", 3 * GIB));
    assert_eq!(state(&fake, pid), LOCKED, "restore leaves it locked");
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    assert_eq!(state(&fake, pid), RUNNING);

    // The target checks its allocation is still there, at the same address, and frees it.
    target.finish();
    assert_eq!(states[0].used(), 0);
    assert!(states[0].processes().is_empty());
}

#[test]
fn a_locked_process_makes_no_progress_until_unlocked() {
    let fake = Fake::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("progress");
    const KERNEL_MS: u64 = 2;
    let target = spawn_target(&fake, 1024, Some(&file), &format!("{KERNEL_MS}ms"));
    let pid = target.pid();
    let states = fake.states();
    wait_progress(&file, 3);

    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    let locked_at = now_ns();
    assert!(
        states[0].busy_until_ns() <= locked_at,
        "lock returned before the target's queued kernels finished"
    );
    let before = progress(&file);
    let launches = states[0].processes()[0].launches;
    assert_eq!(state(&fake, pid), LOCKED);
    // 25 of its kernel times: an unlocked target does at least a dozen iterations.
    std::thread::sleep(Duration::from_millis(25 * KERNEL_MS));
    let after = progress(&file);
    assert!(
        after <= before + 1,
        "the target went on from {before} to {after} iterations while locked"
    );
    assert_eq!(
        states[0].processes()[0].launches,
        launches,
        "a locked process launched kernels"
    );

    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    assert_eq!(state(&fake, pid), RUNNING);
    wait_progress(&file, after + 5);
    target.finish();
    assert_eq!(states[0].used(), 0);
}

#[test]
fn lock_waits_for_queued_kernels_and_honours_its_timeout() {
    let fake = Fake::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("progress");
    let target = spawn_target(&fake, 0, Some(&file), "300ms");
    let pid = target.pid();
    let states = fake.states();
    wait_progress(&file, 1);

    // The target is almost always inside a 300 ms synchronize; a lock that caught it
    // between two iterations succeeds at once, so try again then.
    let mut timed_out = false;
    for _ in 0..5 {
        let out = ctl(&fake, pid, "lock", &[("CKPT_TIMEOUT_MS", "30")]);
        if field(&out, "result") == code(CUresult::CUDA_ERROR_NOT_READY) {
            let ms: u64 = field(&out, "lock_ms").parse().expect("lock_ms");
            assert!(ms >= 30, "gave up after {ms} ms, before its timeout");
            timed_out = true;
            break;
        }
        assert_eq!(field(&out, "result"), "0", "{out}");
        expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    }
    assert!(
        timed_out,
        "a lock with a 30 ms timeout never timed out on 300 ms kernels"
    );
    assert_eq!(
        state(&fake, pid),
        RUNNING,
        "a timed-out lock leaves it running"
    );
    let n = progress(&file);
    wait_progress(&file, n + 1);

    // Without a timeout, lock returns once the kernel in flight has run.
    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    assert!(states[0].busy_until_ns() <= now_ns());
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    target.finish();
}

#[test]
fn illegal_transitions_bad_pids_and_arguments() {
    use CUresult::*;
    let fake = Fake::new();
    let target = spawn_target(&fake, 1024, None, "100us");
    let pid = target.pid();

    for op in ["checkpoint", "restore", "unlock"] {
        expect(&fake, pid, op, CUDA_ERROR_ILLEGAL_STATE);
    }
    let reserved = [("CKPT_RESERVED", "1")];
    for op in ["lock", "checkpoint", "restore", "unlock"] {
        let out = ctl(&fake, pid, op, &reserved);
        assert_eq!(
            field(&out, "result"),
            code(CUDA_ERROR_INVALID_VALUE),
            "{op}"
        );
    }
    assert_eq!(state(&fake, pid), RUNNING);
    expect(&fake, pid, "lock", CUDA_SUCCESS);
    for op in ["lock", "restore"] {
        expect(&fake, pid, op, CUDA_ERROR_ILLEGAL_STATE);
    }
    assert_eq!(state(&fake, pid), LOCKED);
    expect(&fake, pid, "checkpoint", CUDA_SUCCESS);
    for op in ["lock", "checkpoint", "unlock"] {
        expect(&fake, pid, op, CUDA_ERROR_ILLEGAL_STATE);
    }
    assert_eq!(state(&fake, pid), CHECKPOINTED);
    expect(&fake, pid, "restore", CUDA_SUCCESS);
    expect(&fake, pid, "restore", CUDA_ERROR_ILLEGAL_STATE);
    expect(&fake, pid, "unlock", CUDA_SUCCESS);
    assert_eq!(state(&fake, pid), RUNNING);

    // Pids that are no CUDA process: this test (never called cuInit), a reaped child,
    // 0 and negative ones.
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let dead = child.id();
    child.wait().expect("reap");
    let no_cuda = std::process::id().to_string();
    for bad in [no_cuda, dead.to_string(), "0".into(), "-1".into()] {
        for op in ALL_OPS {
            expect(&fake, &bad, op, CUDA_ERROR_INVALID_VALUE);
        }
    }
    for op in ["get_state", "tid"] {
        let out = ctl(&fake, pid, op, &[("CKPT_NULL", "1")]);
        assert_eq!(
            field(&out, "result"),
            code(CUDA_ERROR_INVALID_VALUE),
            "{op}"
        );
    }
    let out = ctl(&fake, pid, "lock", &[("CKPT_NO_INIT", "1")]);
    assert_eq!(field(&out, "result"), code(CUDA_ERROR_NOT_INITIALIZED));
    assert_eq!(state(&fake, pid), RUNNING);
    target.finish();
}

#[test]
fn checkpoint_false_models_a_driver_without_the_api() {
    let fake = Fake::with_config(&format!("checkpoint = false\n{SMALL}"));
    let target = spawn_target(&fake, 1024, None, "100us");
    for op in ALL_OPS {
        let out = ctl(&fake, target.pid(), op, &[]);
        assert_eq!(
            field(&out, "getproc"),
            format!("{} status=1", code(CUresult::CUDA_ERROR_NOT_FOUND)),
            "{op}: cuGetProcAddress reports CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND"
        );
        assert_eq!(
            field(&out, "result"),
            code(CUresult::CUDA_ERROR_NOT_SUPPORTED),
            "{op}: the export says not supported"
        );
    }
    // Before cuInit too, cuGetProcAddress does not find them.
    let out = ctl(&fake, target.pid(), "lock", &[("CKPT_NO_INIT", "1")]);
    assert_eq!(
        field(&out, "getproc"),
        format!("{} status=1", code(CUresult::CUDA_ERROR_NOT_FOUND))
    );
    target.finish();
}

#[test]
fn a_target_killed_while_checkpointed_or_locked_leaks_nothing() {
    let fake = Fake::with_config(SMALL);
    let states = fake.states();

    let target_a = spawn_target(&fake, 3072, None, "100us");
    let pid = target_a.pid();
    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    expect(&fake, pid, "checkpoint", CUresult::CUDA_SUCCESS);
    target_a.kill();
    expect(&fake, pid, "get_state", CUresult::CUDA_ERROR_INVALID_VALUE);
    expect(&fake, pid, "restore", CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(states[0].used(), 0);
    assert!(states[0].processes().is_empty(), "its slot was reclaimed");

    let target_b = spawn_target(&fake, 3072, None, "100us");
    let pid = target_b.pid();
    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    target_b.kill();
    expect(&fake, pid, "unlock", CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(states[0].used(), 0);
    assert!(states[0].processes().is_empty());

    // The whole device is free again.
    spawn_target(&fake, 4096, None, "100us").finish();
    assert_eq!(states[0].used(), 0);
}

#[test]
fn a_controller_killed_while_its_lock_waits_leaves_the_target_running() {
    let fake = Fake::with_config(SMALL);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("progress");
    // Each iteration synchronizes on a 1 s kernel: a lock waits for it.
    let target = spawn_target(&fake, 1024, Some(&file), "1s");
    let pid = target.pid();
    let states = fake.states();
    wait_progress(&file, 1);

    let mut killed = false;
    for _ in 0..5 {
        let mut controller = spawn_ctl(&fake, pid, "lock", &[("CKPT_TIMEOUT_MS", "600000")]);
        if wait_op(&states[0], pid, CheckpointOp::Locking, &mut controller) {
            kill(controller);
            killed = true;
            break;
        }
        // The lock caught the target between two kernels and succeeded at once.
        expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    }
    assert!(killed, "no lock ever had to wait for a 1 s kernel");

    let out = expect(&fake, pid, "get_state", CUresult::CUDA_SUCCESS);
    assert_eq!(
        field(&out, "state"),
        RUNNING,
        "an abandoned lock ends like a timed-out one"
    );
    assert_eq!(states[0].checkpoint_op(pid), None, "nothing left LOCKING");
    let n = progress(&file);
    wait_progress(&file, n + 2);

    // A whole new cycle works.
    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    let out = expect(&fake, pid, "checkpoint", CUresult::CUDA_SUCCESS);
    assert_eq!(field(&out, "nvml_used"), "0");
    expect(&fake, pid, "restore", CUresult::CUDA_SUCCESS);
    assert!(states[0].used() >= GIB);
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    assert_eq!(state(&fake, pid), RUNNING);
    let n = progress(&file);
    wait_progress(&file, n + 2);
    target.finish();
    assert_eq!(states[0].used(), 0);
}

#[test]
fn a_controller_killed_during_the_checkpoint_copy_leaves_it_checkpointed() {
    // 1 GiB at 0.5 GB/s: a copy of about 2 s.
    let Locked { fake, _dir, file, target, pid, states, held } = locked_target("0.5");

    let mut controller = spawn_ctl(&fake, pid, "checkpoint", &[]);
    assert!(
        wait_op(
            &states[0],
            pid,
            CheckpointOp::Checkpointing,
            &mut controller
        ),
        "a 2 s copy was over before it was seen"
    );
    assert_eq!(
        states[0].used(),
        held,
        "memory stays on the device during the copy"
    );
    let out = ctl(&fake, pid, "get_state", &[]);
    assert_eq!(
        field(&out, "state"),
        LOCKED,
        "checkpointing reads as locked"
    );
    assert_eq!(field(&out, "nvml_used"), held.to_string());
    kill(controller);

    // The next controller finds the checkpoint finished.
    let out = expect(&fake, pid, "get_state", CUresult::CUDA_SUCCESS);
    assert_eq!(field(&out, "state"), CHECKPOINTED);
    assert_eq!(field(&out, "nvml_used"), "0", "the memory left the device");
    assert_eq!(
        field(&out, "nvml_procs"),
        "",
        "a checkpointed process is not listed"
    );
    assert_eq!(states[0].checkpoint_op(pid), None);
    assert_eq!(
        states[0].processes()[0].checkpoint,
        CheckpointState::Checkpointed
    );
    // Another process can have the whole device (cuMemGetInfo and cuMemAlloc see it free).
    spawn_target(&fake, 4096, None, "100us").finish();

    expect(&fake, pid, "restore", CUresult::CUDA_SUCCESS);
    assert_eq!(states[0].used(), held);
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    let n = progress(&file);
    wait_progress(&file, n + 3);
    target.finish();
    assert_eq!(states[0].used(), 0);
}

#[test]
fn a_controller_killed_during_the_restore_copy_leaves_it_checkpointed() {
    let Locked { fake, _dir, file, target, pid, states, held } = locked_target("0.5");
    expect(&fake, pid, "checkpoint", CUresult::CUDA_SUCCESS);
    assert_eq!(states[0].used(), 0);

    let mut controller = spawn_ctl(&fake, pid, "restore", &[]);
    assert!(
        wait_op(&states[0], pid, CheckpointOp::Restoring, &mut controller),
        "a 2 s copy was over before it was seen"
    );
    // The operation is published first, then the memory is reserved, then the 2 s copy
    // runs: the reservation must be seen while the operation is still restoring.
    let deadline = Instant::now() + Duration::from_secs(30);
    while states[0].used() != held {
        assert_eq!(
            states[0].checkpoint_op(pid).map(|(op, _)| op),
            Some(CheckpointOp::Restoring),
            "restore reserves the memory before copying (used {} of {held})",
            states[0].used()
        );
        assert!(Instant::now() < deadline, "restore never reserved the memory");
        std::thread::sleep(Duration::from_millis(1));
    }
    kill(controller);

    let out = expect(&fake, pid, "get_state", CUresult::CUDA_SUCCESS);
    assert_eq!(
        field(&out, "state"),
        CHECKPOINTED,
        "an abandoned restore is undone"
    );
    assert_eq!(field(&out, "nvml_used"), "0", "nothing left half-restored");
    assert_eq!(states[0].used(), 0);
    assert_eq!(states[0].checkpoint_op(pid), None);

    expect(&fake, pid, "restore", CUresult::CUDA_SUCCESS);
    assert_eq!(states[0].used(), held);
    assert_eq!(state(&fake, pid), LOCKED);
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    let n = progress(&file);
    wait_progress(&file, n + 3);
    target.finish();
    assert_eq!(states[0].used(), 0);
}

#[test]
fn checkpoint_and_restore_take_time_by_size() {
    const GBPS: u64 = 2;
    let fake = Fake::with_config(&small_at(&GBPS.to_string()));
    let target = spawn_target(&fake, 1024, None, "100us");
    let pid = target.pid();
    let states = fake.states();
    // 1 GiB at 2 GB/s: at least 536 870 µs each way.
    let min_us = GIB / (GBPS * 1000);
    let took_us = |out: &str| -> u64 { field(out, "call_us").parse().expect("call_us") };

    expect(&fake, pid, "lock", CUresult::CUDA_SUCCESS);
    let out = expect(&fake, pid, "checkpoint", CUresult::CUDA_SUCCESS);
    assert!(
        took_us(&out) >= min_us,
        "checkpoint of 1 GiB at {GBPS} GB/s took {} µs, less than {min_us}",
        took_us(&out)
    );
    assert_eq!(field(&out, "nvml_used"), "0");

    // A restore that does not fit fails (at once: it reserves before it copies).
    let other = spawn_target(&fake, 3584, None, "100us");
    expect(&fake, pid, "restore", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(state(&fake, pid), CHECKPOINTED);
    assert_eq!(states[0].used(), 3584 << 20, "nothing reserved for it");
    other.finish();

    let out = expect(&fake, pid, "restore", CUresult::CUDA_SUCCESS);
    assert!(
        took_us(&out) >= min_us,
        "restore of 1 GiB at {GBPS} GB/s took {} µs, less than {min_us}",
        took_us(&out)
    );
    expect(&fake, pid, "unlock", CUresult::CUDA_SUCCESS);
    target.finish();
    assert_eq!(states[0].used(), 0);
}
