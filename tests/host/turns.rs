//! Turns (issue 27) end to end: vGPUs sharing one simulated GPU, whose time-slicing model is
//! on (75 µs per switch between contexts, 1 ms slices: its defaults), put their work on it
//! one at a time. The GPU's own count of the context switches it paid (two words of the
//! simulated driver's state file) shows whether they did; `VGPU_TURNS=off` in the
//! tenants' environment is the "before" (each test says what it does then). Each measures
//! time or rates on a busy simulated GPU, so each is serial (`serial()`: one at a time,
//! ahead of the other tests on the CPU).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::workload::workload_bin;
use crate::common::{serial, wait_for, Sim};

const H100: &str = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n";

/// The simulated GPU's context switches so far and their time (ns), at offsets 160 and 168
/// of its state file ([`crate::common::fakegpu_state`]).
fn switches(sim: &Sim) -> (u64, u64) {
    let bytes = crate::common::fakegpu_state(sim);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    (u64_at(160), u64_at(168))
}

/// One tenant: `vgpu run` arguments and `gpu_workload` arguments.
struct Tenant<'a> {
    vgpu: &'a [&'a str],
    workload: &'a [&'a str],
}

/// `gpu_workload`'s JSON line.
fn parse(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not gpu_workload's JSON ({e}): {line}"))
}

/// Tenants started under `vgpu run`, their timed loops started together; each is killed
/// and reaped when this is dropped (pass or fail).
struct Running {
    children: Vec<Child>,
    progress: Vec<PathBuf>,
}

impl Running {
    fn start(sim: &Sim, tenants: &[Tenant]) -> Running {
        workload_bin();
        let dir = sim.path("");
        let go = dir.join(format!("go-{}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let mut children = Vec::new();
        let mut ready = Vec::new();
        let mut progress = Vec::new();
        for (i, t) in tenants.iter().enumerate() {
            let (r, p) = (dir.join(format!("ready{i}")), dir.join(format!("progress{i}")));
            let _ = std::fs::remove_file(&r);
            let _ = std::fs::remove_file(&p);
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
            cmd.arg("--simulate").arg("run").args(["--mem", "10G"]).args(t.vgpu).arg("--");
            cmd.arg(workload_bin()).args(t.workload).arg("--ready").arg(&r).arg("--go").arg(&go).arg("--progress").arg(&p);
            cmd.env_remove("VGPU_SIMULATE").env_remove("LD_PRELOAD").env("VGPU_LOG", "vgpu=warn");
            for (k, v) in sim.env() {
                cmd.env(k, v);
            }
            children.push(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run"));
            ready.push(r);
            progress.push(p);
        }
        let mut running = Running { children, progress };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.iter().all(|r| r.exists()) {
            assert!(running.children.iter_mut().all(|c| matches!(c.try_wait(), Ok(None))), "a tenant exited before it was ready");
            assert!(Instant::now() < deadline, "the tenants were not ready after 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(&go, "go").expect("go file");
        running
    }

    /// Steps tenant `i` has completed.
    fn progress(&self, i: usize) -> u64 {
        std::fs::read_to_string(&self.progress[i]).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Wait for every tenant to end; each one's JSON line.
    fn finish(mut self) -> Vec<serde_json::Value> {
        let children = std::mem::take(&mut self.children);
        children
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().expect("wait for vgpu run");
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(out.status.success(), "vgpu run failed: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
                parse(stdout.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no report: {stdout}")))
            })
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn kernels(r: &serde_json::Value) -> u64 {
    r["kernels"].as_u64().expect("kernels")
}

/// A workload's row in `ps --json`, by name.
fn row(sim: &Sim, name: &str) -> Option<serde_json::Value> {
    sim.ps().into_iter().find(|w| w["name"] == name)
}

fn gpu_field(row: &serde_json::Value, field: &str) -> u64 {
    row["gpus"][0][field].as_u64().unwrap_or(0)
}

/// The split: two saturating tenants (1 ms kernels, synchronizing after each), 30/70
/// strict. Left to the GPU they alternate kernel by kernel and it pays a switch at almost
/// every kernel (with `VGPU_TURNS=off`: a switch for 50–90 % of the kernels); taking turns,
/// it switches about once a turn. `ps --json` shows the turns while they run.
#[test]
fn two_tenants_take_turns_and_the_gpu_hardly_switches() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "t30", "--compute", "30"], workload: &["sync", "2", "--kernel-us", "1000"] },
            Tenant { vgpu: &["--name", "t70", "--compute", "70"], workload: &["sync", "2", "--kernel-us", "1000"] },
        ],
    );
    wait_for("ps to show both taking turns", || {
        ["t30", "t70"].iter().all(|n| row(&sim, n).is_some_and(|r| gpu_field(&r, "turns_taken") > 0 && gpu_field(&r, "switches_avoided") > 0))
    });
    let r = run.finish();
    let all = kernels(&r[0]) + kernels(&r[1]);
    let (n, ns) = switches(&sim);
    eprintln!("{all} kernels ({} + {}), {n} context switches ({} ms)", kernels(&r[0]), kernels(&r[1]), ns / 1_000_000);
    assert!(kernels(&r[0]) > 100 && kernels(&r[1]) > 300, "both ran: {r:?}");
    assert!(n * 20 <= all, "{n} switches for {all} kernels: more than one in 20");
}

/// Two processes of ONE vGPU are two contexts too: left to the GPU they alternate kernel by
/// kernel and it pays a switch at almost every kernel (with `VGPU_TURNS=off`: a switch for
/// 50–90 % of the kernels, as before turns between a vGPU's processes); taking turns through
/// their vGPU's `process_turn` word, it hardly switches — unlimited (no budget, its
/// processes governed only while both launch) and limited alike.
#[test]
fn two_processes_of_one_vgpu_take_turns() {
    let _serial = serial();
    for compute in [None, Some("90")] {
        let sim = Sim::with_config(H100);
        let w = workload_bin().display().to_string();
        let (r1, r2, go) = (sim.path("ready1"), sim.path("ready2"), sim.path("go"));
        let one = |r: &Path| format!("{w} sync 1 --kernel-us 1000 --ready {} --go {}", r.display(), go.display());
        let script = format!("{} & a=$!; {} & b=$!; wait $a && wait $b", one(&r1), one(&r2));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").arg("run").args(["--mem", "10G"]);
        if let Some(p) = compute {
            cmd.args(["--compute", p]);
        }
        cmd.args(["--", "sh", "-c", &script]);
        cmd.env_remove("VGPU_SIMULATE").env_remove("LD_PRELOAD").env("VGPU_LOG", "vgpu=warn");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run");
        let mut run = Running { children: vec![child], progress: Vec::new() };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(r1.exists() && r2.exists()) {
            assert!(matches!(run.children[0].try_wait(), Ok(None)), "the workload exited before it was ready");
            assert!(Instant::now() < deadline, "not ready after 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(&go, "go").expect("go file");
        let child = run.children.remove(0);
        let out = child.wait_with_output().expect("wait for vgpu run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "vgpu run failed: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        let r: Vec<serde_json::Value> = stdout.lines().filter(|l| l.starts_with('{')).map(parse).collect();
        assert_eq!(r.len(), 2, "{stdout}");
        let all = kernels(&r[0]) + kernels(&r[1]);
        let (n, ns) = switches(&sim);
        eprintln!("--compute {compute:?}: {all} kernels ({} + {}), {n} context switches ({} ms)", kernels(&r[0]), kernels(&r[1]), ns / 1_000_000);
        assert!(kernels(&r[0]) > 100 && kernels(&r[1]) > 100, "both ran: {r:?}");
        assert!(n * 10 <= all, "--compute {compute:?}: {n} switches for {all} kernels: more than one in 10");
    }
}

/// A latency tenant (priority 90, 20 %: a 2 ms kernel every 10 ms) beside a batch tenant
/// (priority 10, 80 %: storms of 1000 × 20 µs kernels). Left to the GPU, each request
/// queues behind up to 20 ms of the batch's kernels (with `VGPU_TURNS=off`: a median of
/// 15–20 ms); with turns the batch keeps little queued while a higher priority is active
/// and gives its turn up at the next kernel: the median stays near the kernel's 2 ms.
#[test]
fn a_latency_tenant_is_served_first() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant {
                vgpu: &["--name", "latency", "--compute", "20", "--priority", "90"],
                workload: &["sync", "2", "--kernel-us", "2000", "--period-us", "10000"],
            },
            Tenant {
                vgpu: &["--name", "batch", "--compute", "80", "--priority", "10"],
                workload: &["storm", "2", "--kernel-us", "20", "--batch", "1000"],
            },
        ],
    );
    let r = run.finish();
    let p50 = r[0]["latency_p50_us"].as_u64().expect("latency_p50_us");
    eprintln!("latency p50 {p50} us, p99 {} us; batch {} kernels", r[0]["latency_p99_us"], kernels(&r[1]));
    assert!(kernels(&r[1]) > 10_000, "the batch ran: {}", r[1]);
    assert!(p50 <= 4_000, "median request {p50} us for a 2 ms kernel: {}", r[0]);
}

/// A vGPU of higher priority on the GPU that has launched nothing yet (a service waiting for
/// its first request) already keeps a batch's queue short: the batch, a storm of 1000 × 20
/// µs kernels per synchronize that would otherwise queue 20 ms at once, publishes what it
/// queues in its board slot and keeps it within `turn::QUEUE_AHEAD_NS` (a kernel more at
/// most) of now, so that the service's first request is served at once. Before, a vGPU
/// that had not published counted for nothing: the batch queued whole storms, unpublished.
#[test]
fn a_resting_higher_priority_keeps_a_lower_ones_queue_short() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "service", "--compute", "20", "--priority", "90"], workload: &["idle", "30"] },
            Tenant {
                vgpu: &["--name", "batch", "--compute", "80", "--priority", "10"],
                workload: &["storm", "30", "--kernel-us", "20", "--batch", "1000"],
            },
        ],
    );
    wait_for("two storms of the batch", || run.progress(1) >= 2);
    let slot = board_slot(&sim, row(&sim, "batch").expect("batch in ps")["id"].as_str().expect("id"));
    // The batch's queue as it publishes it, looked at until it has run 3 storms more.
    let (mut looks, mut ahead, mut most) = (0u32, 0u32, 0u64);
    let until = run.progress(1) + 3;
    let deadline = Instant::now() + Duration::from_secs(20);
    while run.progress(1) < until {
        assert!(Instant::now() < deadline, "the batch stopped: {} storms of {until}", run.progress(1));
        let (_, queued_until) = turn_words(&slot);
        let now = vgpu_abi::layout::now_mono_ns();
        looks += 1;
        if queued_until > now {
            ahead += 1;
            most = most.max(queued_until - now);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    eprintln!("{looks} looks, {ahead} with work queued, at most {most} ns ahead");
    assert!(ahead > looks / 4, "the batch published its queue at {ahead} of {looks} looks");
    assert!(
        most <= vgpu_abi::turn::QUEUE_AHEAD_NS + 1_000_000,
        "the batch queued {most} ns ahead beside a resting higher priority"
    );
    drop(run);
}

/// A tenant SIGKILLed while it holds the turn (its slot on the GPU's board says so, its
/// kernel queued) stalls the other for at most a turn: its claim expires and its queued
/// work drains, and the other goes on.
#[test]
fn a_tenant_killed_holding_the_turn_does_not_stall_the_other() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "holder", "--compute", "70"], workload: &["sync", "30", "--kernel-us", "5000"] },
            Tenant { vgpu: &["--name", "other", "--compute", "30"], workload: &["sync", "30", "--kernel-us", "1000"] },
        ],
    );
    wait_for("both to run", || run.progress(0) >= 5 && run.progress(1) >= 5);
    let holder = row(&sim, "holder").expect("holder in ps");
    let id = holder["id"].as_str().expect("id").to_string();
    let slot = board_slot(&sim, &id);
    // Wait (state, not time) until it holds the turn with work queued, then kill it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (turn_until, queued_until) = turn_words(&slot);
        let now = vgpu_abi::layout::now_mono_ns();
        if turn_until > now && queued_until > now {
            break;
        }
        assert!(Instant::now() < deadline, "the holder never held the turn");
        std::thread::sleep(Duration::from_micros(200));
    }
    for pid in holder["pids"].as_array().expect("pids") {
        let pid = nix::unistd::Pid::from_raw(pid.as_u64().expect("pid") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill the holder's process");
    }
    let before = run.progress(1);
    let killed_at = Instant::now();
    wait_for("the other tenant to go on", || run.progress(1) >= before + 200);
    eprintln!("200 steps of the other tenant {:?} after the kill", killed_at.elapsed());
    drop(run);
}

/// `<state>/gpus/<uuid>/<vGPU id>` of the one GPU: the workload's vGPU slot.
fn board_slot(sim: &Sim, vgpu: &str) -> PathBuf {
    let gpus = sim.path("run").join("gpus");
    let gpu = std::fs::read_dir(&gpus).expect("the boards' directory").flatten().next().expect("a GPU's board").path();
    let slot = gpu.join(vgpu);
    assert!(slot.is_file(), "no slot {}", slot.display());
    slot
}

/// The slot's `turn_until_ns` and `queued_until_ns` (vgpu_abi::layout::BoardSlot, after the
/// 64-byte header: words 0 and 6).
fn turn_words(slot: &Path) -> (u64, u64) {
    let bytes = std::fs::read(slot).expect("slot file");
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    (u64_at(64), u64_at(64 + 48))
}

/// A live `vgpu update` of both shares while they take turns: 20/80 becomes 80/20 and
/// the first tenant's rate follows (its last windows well above its first).
#[test]
fn update_changes_the_shares_mid_turn() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "up", "--compute", "20"], workload: &["sync", "3", "--kernel-us", "1000", "--window-ms", "500"] },
            Tenant { vgpu: &["--name", "down", "--compute", "80"], workload: &["sync", "3", "--kernel-us", "1000", "--window-ms", "500"] },
        ],
    );
    wait_for("the first second", || run.progress(0) >= 150);
    for (name, pct) in [("down", "20"), ("up", "80")] {
        let id = row(&sim, name).expect("in ps")["id"].as_str().expect("id").to_string();
        sim.vgpu(&["update", &id, "--compute", pct]).assert().success();
    }
    let r = run.finish();
    let windows: Vec<u64> = r[0]["windows"].as_array().expect("windows").iter().map(|w| w.as_u64().unwrap_or(0)).collect();
    let (first, last) = (windows[0], windows[windows.len() - 2]);
    eprintln!("up: {windows:?}; down: {}", r[1]["windows"]);
    assert!(last > 2 * first, "the raised tenant's rate: first window {first}, last full one {last}");
}

/// `fair` lends the turns a quiet tenant leaves: a fair 30 % tenant beside a 70 % one that
/// launches a 1 ms kernel every 50 ms gets far more than 30 % of the GPU's time once its
/// allowance has grown (in a later second of the run; 45 %, not the 95 % it grows to on an
/// idle machine: on a loaded one lending is slow to show).
#[test]
fn fair_lends_unused_turns() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "fair", "--compute", "30", "--compute-policy", "fair"], workload: &["sync", "4", "--kernel-us", "1000"] },
            Tenant { vgpu: &["--name", "quiet", "--compute", "70"], workload: &["sync", "4", "--kernel-us", "1000", "--period-us", "50000"] },
        ],
    );
    let r = run.finish();
    let windows: Vec<u64> = r[0]["windows"].as_array().expect("windows").iter().map(|w| w.as_u64().unwrap_or(0)).collect();
    eprintln!("fair tenant's kernels per second: {windows:?}; quiet {} kernels", kernels(&r[1]));
    assert!(kernels(&r[1]) >= 30, "the quiet tenant ran: {}", r[1]);
    let best = windows.iter().take(4).copied().max().unwrap_or(0);
    assert!(best >= 450, "the fair tenant never had 45 % of the GPU in a second: {windows:?}");
}

/// A tenant that never lets go of the turn (root writes a claim renewed every 20 ms into
/// its board slot, as a lying tenant could into its own) costs another tenant one wait of
/// `vgpu_abi::turn::MAX_WAIT_NS` (200 ms), after which that tenant's processes take no turns
/// on the GPU for a while: it runs at its share. Without that distrust every launch would
/// wait 200 ms: about 15 kernels in 3 s instead of hundreds.
#[test]
fn a_tenant_that_never_lets_go_costs_one_wait() {
    let _serial = serial();
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let sim = Sim::with_config(H100);
    let run = Running::start(
        &sim,
        &[
            Tenant { vgpu: &["--name", "liar", "--compute", "50"], workload: &["idle", "5"] },
            Tenant { vgpu: &["--name", "honest", "--compute", "50"], workload: &["sync", "3", "--kernel-us", "1000"] },
        ],
    );
    let liar = row(&sim, "liar").expect("liar in ps")["id"].as_str().expect("id").to_string();
    let slot = std::fs::OpenOptions::new().write(true).open(board_slot(&sim, &liar)).expect("the liar's slot");
    let stop = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let now = vgpu_abi::layout::now_mono_ns();
                // BoardSlot after the 64-byte header: turn_until (0), heartbeat (8),
                // queued_until (48).
                for (at, value) in [(64, now + 5_000_000_000), (72, now), (112, now + 5_000_000_000)] {
                    slot.write_at(&u64::to_le_bytes(value), at).expect("write the liar's slot");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = run.finish();
        stop.store(true, Ordering::Relaxed);
        r
    });
    eprintln!("honest: {}", r[1]);
    assert!(kernels(&r[1]) >= 300, "the honest tenant was held by the liar's claim: {}", r[1]);
}

/// `[compute] turn` bounds the turns of a vGPU while one of higher priority is active on the
/// GPU, and `vgpu run --turn` sets it per workload: a batch tenant (priority 10, 80 %: 12 ms
/// turns of the 15 ms cycle otherwise) beside a latency tenant (priority 90) never holds a
/// claim reaching more than 2 ms ahead, sampled from its board slot while they run. Without
/// the bound its claims reach up to 12 ms ahead (the first claim seen above 2 ms fails it).
#[test]
fn the_turn_setting_bounds_a_low_priority_turn() {
    let _serial = serial();
    let sim = Sim::with_config(H100);
    sim.write_vgpu_config("[compute]\nturn = \"2ms\"\n");
    let run = Running::start(
        &sim,
        &[
            Tenant {
                vgpu: &["--name", "latency", "--compute", "20", "--priority", "90", "--turn", "15ms"],
                workload: &["sync", "2", "--kernel-us", "1000", "--period-us", "5000"],
            },
            Tenant { vgpu: &["--name", "batch", "--compute", "80", "--priority", "10"], workload: &["sync", "2", "--kernel-us", "1000"] },
        ],
    );
    wait_for("both to run", || run.progress(0) >= 5 && run.progress(1) >= 5);
    let ids: Vec<String> = ["latency", "batch"].iter().map(|n| row(&sim, n).expect("in ps")["id"].as_str().expect("id").to_string()).collect();
    // Each vGPU's bound as its root-owned limits hold it: --turn over the config's.
    let bound = |id: &str| {
        let usage = vgpu_abi::usage::UsageFile::open(&sim.path("run").join("vgpus").join(id).join("usage")).expect("the vGPU's usage file");
        usage.turn_max_ns(0)
    };
    assert_eq!((bound(&ids[0]), bound(&ids[1])), (15_000_000, 2_000_000));
    let slot = board_slot(&sim, &ids[1]);
    let (mut held, mut longest) = (0u32, 0u64);
    let deadline = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < deadline {
        let (turn_until, _) = turn_words(&slot);
        // Read after the slot: a claim made at or before this moment ends at most its
        // bound after it.
        let now = vgpu_abi::layout::now_mono_ns();
        if turn_until > now {
            held += 1;
            longest = longest.max(turn_until - now);
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    drop(run);
    eprintln!("the batch held the turn at {held} samples; its claim reached at most {} us ahead", longest / 1000);
    assert!(held >= 20, "the batch hardly held a turn ({held} samples)");
    assert!(longest <= 2_000_000, "a claim reached {} us ahead: more than the 2 ms bound", longest / 1000);
}
