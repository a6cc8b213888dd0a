//! Live resize, end to end through the real binary on the simulated driver (as root, real
//! cgroups): `vgpu update --mem` and `vgpu partition update --mem` change a running vGPU's
//! quota, which its shim-governed processes follow at their next allocation; a raise goes
//! through admission and a cut below what is in use is refused, each changing nothing (or,
//! with `--wait`, is made once it can be); `vgpu update --priority` reaches the record and
//! the limits file; and `vgpu update --tflops` resizes a pool workload's blocks, preempting
//! or settling, its compute share following live.

use std::path::PathBuf;
use std::process::Child;

use crate::common::{self, wait_for, workload, Sim};
use vgpu_abi::usage::UsageFile;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const ONE_GPU: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

/// A workload whose shell runs gpu_workload processes on request: the test writes
/// `cmd.N` ("hold MIB": allocate and keep it until `release.N` exists, `ready.N` once
/// allocated; "try MIB": allocate and exit) and reads `rc.N`, each such process's exit status.
struct Driven {
    child: Child,
    dir: PathBuf,
    next: usize,
}

impl Driven {
    fn start(sim: &Sim, name: &str, run_args: &[&str]) -> Driven {
        let bin = workload::workload_bin().display().to_string();
        let dir = sim.path(name);
        std::fs::create_dir(&dir).unwrap();
        let d = dir.display();
        let script = format!(
            "i=0; while [ ! -e {d}/done ]; do \
               if [ -e {d}/cmd.$i ]; then read mode mib < {d}/cmd.$i; \
                 if [ \"$mode\" = hold ]; then (\"{bin}\" idle 0.01 --alloc-mib $mib --ready {d}/ready.$i --go {d}/release.$i >/dev/null 2>&1; echo $? > {d}/rc.$i.t; mv {d}/rc.$i.t {d}/rc.$i) & \
                 else \"{bin}\" idle 0.01 --alloc-mib $mib >/dev/null 2>{d}/err.$i; echo $? > {d}/rc.$i.t; mv {d}/rc.$i.t {d}/rc.$i; fi; \
                 i=$((i+1)); \
               fi; sleep 0.02; \
             done; wait"
        );
        let child = sim.spawn_running(name, run_args, &script);
        Driven { child, dir, next: 0 }
    }

    fn send(&mut self, line: &str) -> usize {
        let n = self.next;
        self.next += 1;
        let tmp = self.dir.join("cmd.tmp");
        std::fs::write(&tmp, format!("{line}\n")).unwrap();
        std::fs::rename(&tmp, self.dir.join(format!("cmd.{n}"))).unwrap();
        n
    }

    fn rc(&self, n: usize) -> i32 {
        let path = self.dir.join(format!("rc.{n}"));
        wait_for(&format!("{}", path.display()), || path.exists());
        std::fs::read_to_string(&path).unwrap().trim().parse().unwrap()
    }

    /// Whether a new process of the workload can allocate `mib` MiB (it exits at once); a
    /// failure must be the quota's (out of memory).
    fn can_allocate(&mut self, mib: u64) -> bool {
        let n = self.send(&format!("try {mib}"));
        if self.rc(n) == 0 {
            return true;
        }
        let err = std::fs::read_to_string(self.dir.join(format!("err.{n}"))).unwrap_or_default();
        assert!(err.contains("cuMemAlloc") && err.contains("OUT_OF_MEMORY"), "not refused by the quota: {err}");
        false
    }

    /// A process that allocates `mib` MiB and keeps it; the handle releases it.
    fn hold(&mut self, mib: u64) -> usize {
        let n = self.send(&format!("hold {mib}"));
        let ready = self.dir.join(format!("ready.{n}"));
        let rc = self.dir.join(format!("rc.{n}"));
        wait_for("the holder's allocation", || ready.exists() || rc.exists());
        assert!(ready.exists(), "the holder of {mib} MiB failed");
        n
    }

    fn release(&self, n: usize) {
        std::fs::write(self.dir.join(format!("release.{n}")), b"").unwrap();
        assert_eq!(self.rc(n), 0);
    }

    fn stop(mut self) {
        std::fs::write(self.dir.join("done"), b"").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

fn quota(sim: &Sim, vgpu: &str) -> u64 {
    UsageFile::open(&sim.path(&format!("run/vgpus/{vgpu}/usage"))).expect("the vGPU's usage file").quota_bytes(0)
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The store's files, for "nothing changed" checks.
fn snapshot(sim: &Sim) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = common::files_below(&sim.path("run/workloads"))
        .into_iter()
        .chain(common::files_below(&sim.path("lib")))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn update_mem_raises_through_admission_and_lowers_down_to_what_is_used() {
    let sim = Sim::new(ONE_GPU);
    let mut w = Driven::start(&sim, "train", &["--gpu", "0", "--mem", "1G"]);
    let other = Driven::start(&sim, "other", &["--gpu", "0", "--mem", "12G"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();
    assert!(!w.can_allocate(1536), "1.5 GiB within a 1 GiB quota");

    // Raised: a new process of it can, and ps and the limits file say 2 GiB.
    let out = sim.vgpu(&["update", &id[..4], "--mem", "2G"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(line.trim(), format!("updated train ({id}): memory on GPU 0 1 GiB → 2 GiB"));
    assert_eq!(quota(&sim, &id), 2 * GIB);
    assert_eq!(sim.row("train")["gpus"][0]["memory_quota_bytes"], 2 * GIB);
    assert!(w.can_allocate(1536), "1.5 GiB within a 2 GiB quota");

    // Beyond what admission allows (16 GiB - 12 GiB held by the other): refused, naming the
    // holder; nothing changed.
    let before = snapshot(&sim);
    let out = sim.vgpu(&["update", "train", "--mem", "5G"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("does not fit on GPU 0") && err.contains("workload other") && err.contains("12 GiB"), "{err}");
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, &id), 2 * GIB);
    // Up to what is left is fine, as a percentage too (25% of 16 GiB).
    let out = sim.json(&["update", "train", "--mem", "25%", "--json"])["workloads"].clone();
    assert_eq!(out[0]["gpus"][0]["memory_quota_bytes"], 4 * GIB);
    assert_eq!(out[0]["gpus"][0]["previous_memory_quota_bytes"], 2 * GIB);
    assert_eq!(quota(&sim, &id), 4 * GIB);

    // Below what is in use: refused with both figures, nothing changed.
    let held = w.hold(1536);
    let before = snapshot(&sim);
    let out = sim.vgpu(&["update", "train", "--mem", "1G"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("to 1 GiB") && err.contains("1.50 GiB is in use"), "{err}");
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, &id), 4 * GIB);

    // Above what is in use: done, and the shim refuses what passes the new quota.
    sim.vgpu(&["update", "train", "--mem", "2G"]).assert().success();
    assert_eq!(quota(&sim, &id), 2 * GIB);
    assert!(!w.can_allocate(768), "1.5 GiB held + 768 MiB over a 2 GiB quota");
    assert!(w.can_allocate(256));
    w.release(held);

    // A bad id among good ones changes nothing; so does a usage error.
    let before = snapshot(&sim);
    sim.vgpu(&["update", "train", "nosuch", "--mem", "3G"]).assert().failure();
    sim.vgpu(&["update", "train", "--mem", "0"]).assert().code(2);
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, &id), 2 * GIB);
    w.stop();
    other.stop();
}

#[test]
fn partition_update_mem_resizes_its_shared_vgpu() {
    let sim = Sim::new(ONE_GPU);
    sim.vgpu(&["partition", "create", "team", "--gpu", "0", "--mem", "1G"]).assert().success();
    sim.vgpu(&["partition", "create", "big", "--gpu", "0", "--mem", "12G"]).assert().success();
    let mut w = Driven::start(&sim, "member", &["--partition", "team"]);
    let id = sim.row("member")["id"].as_str().unwrap().to_string();
    assert!(!w.can_allocate(1536));

    // A workload in a partition is resized through its partition.
    let out = sim.vgpu(&["update", &id, "--mem", "2G"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("vgpu partition update team"), "{}", stderr_of(&out));

    let out = sim.vgpu(&["partition", "update", "team", "--mem", "2G"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("updated partition team: memory on GPU 0 1 GiB → 2 GiB"));
    assert_eq!(quota(&sim, "p-team"), 2 * GIB);
    assert_eq!(sim.row("member")["gpus"][0]["memory_quota_bytes"], 2 * GIB);
    let listed = sim.json(&["partition", "list", "--json"])["partitions"].clone();
    assert_eq!(listed.as_array().unwrap().iter().find(|p| p["name"] == "team").unwrap()["memory_quota_bytes"], 2 * GIB);
    assert!(w.can_allocate(1536));

    // Past admission: refused naming the other partition; below use: both figures.
    let before = snapshot(&sim);
    let out = sim.vgpu(&["partition", "update", "team", "--mem", "5G"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("partition big 12 GiB"), "{}", stderr_of(&out));
    let held = w.hold(1536);
    let out = sim.vgpu(&["partition", "update", "team", "--mem", "1G"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("1.50 GiB is in use"), "{}", stderr_of(&out));
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, "p-team"), 2 * GIB);

    // Above use: done, and the shim holds the new line.
    sim.vgpu(&["partition", "update", "team", "--mem", "1792M"]).assert().success();
    assert_eq!(quota(&sim, "p-team"), 1792 * MIB);
    assert!(!w.can_allocate(512));
    assert!(w.can_allocate(128));
    w.release(held);
    w.stop();
}

#[test]
fn update_priority_reaches_ps_and_the_limits_file() {
    let sim = Sim::new(ONE_GPU);
    let w = Driven::start(&sim, "prio", &["--gpu", "0", "--mem", "1G", "--priority", "40"]);
    let id = sim.row("prio")["id"].as_str().unwrap().to_string();
    let out = sim.vgpu(&["update", "prio", "--priority", "90"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("updated prio ({id}): priority 40 → 90"));
    assert_eq!(sim.row("prio")["priority"], 90);
    let usage = UsageFile::open(&sim.path(&format!("run/vgpus/{id}/usage"))).unwrap();
    assert_eq!(usage.priority(0), 90);
    sim.vgpu(&["update", "prio", "--priority", "101"]).assert().code(2);
    assert_eq!(sim.row("prio")["priority"], 90);
    w.stop();
}

#[test]
fn update_priority_reaches_the_pool_allocation_and_settles_the_pool() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\nenv = \"SIM_NPU_VISIBLE\"\n");
    let state = |name: &str| sim.ps().into_iter().find(|w| w["name"] == name).map(|w| w["state"].as_str().unwrap_or("").to_string());
    let mut holder = sim.spawn(&["run", "--tflops", "10", "--kind", "npu", "--priority", "20", "--name", "holder", "--", "sleep", "60"]);
    wait_for("holder", || state("holder").as_deref() == Some("running"));
    let marker = sim.path("waiter-ran");
    let mut waiter = sim.spawn(&["run", "--tflops", "4", "--kind", "npu", "--priority", "20", "--wait", "--name", "waiter", "--", "touch", marker.to_str().unwrap()]);
    wait_for("the waiter to queue", || state("waiter").as_deref() == Some("waiting"));

    // A waiting workload's priority can change: raised above the holder's, it preempts it.
    let out = sim.vgpu(&["update", "waiter", "--priority", "90"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let pool = sim.json(&["pool", "--json"]);
    let priority_of = |pool: &serde_json::Value, name: &str| {
        pool["allocations"].as_array().unwrap().iter().find(|a| a["name"] == name).map(|a| a["priority"].clone())
    };
    assert!(matches!(priority_of(&pool, "waiter"), Some(p) if p == 90) || marker.exists(), "{pool}");
    assert!(waiter.wait().unwrap().success());
    assert!(marker.exists(), "the waiter ran once its priority let it preempt");
    wait_for("the holder to run again", || state("holder").as_deref() == Some("running"));
    // The holder's own priority: in ps and in its allocation.
    sim.vgpu(&["update", "holder", "--priority", "60"]).assert().success();
    assert_eq!(sim.row("holder")["priority"], 60);
    assert_eq!(priority_of(&sim.json(&["pool", "--json"]), "holder"), Some(serde_json::json!(60)));
    sim.vgpu(&["kill", "--signal", "KILL", "holder"]).assert().success();
    holder.wait().unwrap();
}

// ---- `--wait`: a change the host refuses for now is made once it can be ----

/// `vgpu --simulate ARGS…` in the background, its stdout and stderr into files.
struct Background {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Background {
    fn start(sim: &Sim, tag: &str, args: &[&str]) -> Background {
        let (out, err) = (sim.path(&format!("{tag}.out")), sim.path(&format!("{tag}.err")));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(args).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=warn");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("spawn vgpu");
        Background { child, out, err }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Once it says it waits: its one line about it.
    fn waiting(&self) -> String {
        wait_for("vgpu update to say it waits", || self.stderr().contains("vgpu: waiting: "));
        self.stderr()
    }

    fn finish(mut self) -> (std::process::ExitStatus, String, String) {
        let status = self.child.wait().unwrap();
        (status, std::fs::read_to_string(&self.out).unwrap_or_default(), self.stderr())
    }
}

#[test]
fn update_mem_cut_with_wait_completes_once_the_workload_frees_memory() {
    let sim = Sim::new(ONE_GPU);
    let mut w = Driven::start(&sim, "train", &["--gpu", "0", "--mem", "4G"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();
    let held = w.hold(1536);

    // Ctrl-C while it waits: it dies of the signal and nothing changed.
    let before = snapshot(&sim);
    let bg = Background::start(&sim, "int", &["update", "train", "--mem", "1G", "--wait"]);
    bg.waiting();
    // SAFETY: kill(2) on the pid of the child this test started.
    unsafe { libc::kill(bg.child.id() as i32, libc::SIGINT) };
    let (status, _, err) = bg.finish();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGINT), "{err}");
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, &id), 4 * GIB);

    let bg = Background::start(&sim, "cut", &["update", "train", "--mem", "1G", "--wait"]);
    let err = bg.waiting();
    assert!(err.contains("1.50 GiB in use on GPU 0, above the new 1 GiB"), "{err}");
    assert_eq!(err.matches("waiting").count(), 1, "one line when it starts waiting: {err}");
    // Meanwhile the shim keeps allocating under the old quota.
    assert!(w.can_allocate(1024), "1.5 GiB held + 1 GiB within the old 4 GiB");
    assert_eq!(quota(&sim, &id), 4 * GIB);
    w.release(held);
    let (status, out, err) = bg.finish();
    assert!(status.success(), "{err}");
    assert_eq!(out.trim(), format!("updated train ({id}): memory on GPU 0 4 GiB → 1 GiB"));
    assert_eq!(quota(&sim, &id), GIB);
    assert_eq!(sim.row("train")["gpus"][0]["memory_quota_bytes"], GIB);
    assert!(!w.can_allocate(1536), "the new quota holds");
    w.stop();
}

#[test]
fn update_mem_raise_with_wait_completes_when_another_workload_exits() {
    let sim = Sim::new(ONE_GPU);
    let w = Driven::start(&sim, "train", &["--gpu", "0", "--mem", "1G"]);
    let other = Driven::start(&sim, "other", &["--gpu", "0", "--mem", "12G"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();
    let bg = Background::start(&sim, "raise", &["update", "train", "--mem", "5G", "--wait"]);
    let err = bg.waiting();
    assert!(err.contains("does not fit on GPU 0") && err.contains("workload other"), "{err}");
    assert_eq!(quota(&sim, &id), GIB);
    other.stop();
    let (status, out, err) = bg.finish();
    assert!(status.success(), "{err}");
    assert_eq!(out.trim(), format!("updated train ({id}): memory on GPU 0 1 GiB → 5 GiB"));
    assert_eq!(quota(&sim, &id), 5 * GIB);
    w.stop();
}

#[test]
fn update_wait_that_times_out_changes_nothing() {
    let sim = Sim::new(ONE_GPU);
    let mut w = Driven::start(&sim, "train", &["--gpu", "0", "--mem", "4G"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();
    let held = w.hold(1536);
    let before = snapshot(&sim);
    let started = std::time::Instant::now();
    let out = sim.vgpu(&["update", "train", "--mem", "1G", "--wait=1s"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    let err = stderr_of(&out);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("vgpu: error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("timed out after 1s") && errors[0].contains("nothing was changed"), "{err}");
    assert_eq!(snapshot(&sim), before);
    assert_eq!(quota(&sim, &id), 4 * GIB);
    sim.vgpu(&["update", "train", "--mem", "1G", "--wait=soon"]).assert().code(2);
    w.release(held);
    w.stop();
}

// ---- `--tflops`: a pool workload's blocks, on the GPU it runs on ----

/// A host whose pool is one 10-TFLOPS GPU: 10 blocks, each 10 % of it.
fn ten_block_gpu() -> Sim {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 10\n");
    sim
}

/// A pool workload counting into a file as fast as it can, seen running; and how far it
/// has counted.
fn counting(sim: &Sim, name: &str, run_args: &[&str]) -> (Child, impl Fn() -> u64) {
    let counter = sim.path(&format!("{name}.count"));
    let script = format!("i=0; while :; do i=$((i+1)); echo $i > {}; done", counter.display());
    let child = sim.spawn_running(name, run_args, &script);
    let read = move || std::fs::read_to_string(&counter).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
    wait_for(&format!("{name} to make progress"), || read() > 100);
    (child, read)
}

fn keeps_counting(what: &str, read: &impl Fn() -> u64) {
    let at = read();
    wait_for(what, || read() > at + 100);
}

fn compute_of(sim: &Sim, id: &str) -> u32 {
    UsageFile::open(&sim.path(&format!("run/vgpus/{id}/usage"))).expect("the vGPU's usage file").compute_pct(0)
}

fn blocks_in_pool(sim: &Sim, name: &str) -> serde_json::Value {
    let pool = sim.json(&["pool", "--json"]);
    pool["allocations"].as_array().unwrap().iter().find(|a| a["name"] == name).map(|a| a["blocks"].clone()).unwrap_or_default()
}

fn kill(sim: &Sim, name: &str, mut child: Child) {
    sim.vgpu(&["kill", "--signal", "KILL", name]).assert().success();
    child.wait().unwrap();
}

#[test]
fn update_tflops_raise_takes_free_blocks_and_the_share_follows_live() {
    let sim = ten_block_gpu();
    let (train, read) = counting(&sim, "train", &["--tflops", "4"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();
    assert_eq!((compute_of(&sim, &id), sim.row("train")["gpus"][0]["compute_pct"].as_u64()), (40, Some(40)));

    let out = sim.vgpu(&["update", "train", "--tflops", "6"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("updated train ({id}): 4 → 6 TFLOPS (GPU 0 compute 40% → 60%)"));
    assert_eq!(compute_of(&sim, &id), 60);
    let row = sim.row("train");
    assert_eq!((row["gpus"][0]["compute_pct"].as_u64(), row["state"].as_str()), (Some(60), Some("running")), "{row}");
    assert_eq!(blocks_in_pool(&sim, "train"), 6);
    keeps_counting("train to keep running", &read);

    // --json: the TFLOPS before and after; and down again.
    let out = sim.json(&["update", "train", "--tflops", "3", "--json"])["workloads"].clone();
    assert_eq!((out[0]["previous_tflops"].as_f64(), out[0]["tflops"].as_f64()), (Some(6.0), Some(3.0)), "{out}");
    assert_eq!((out[0]["gpus"][0]["previous_compute_pct"].as_u64(), out[0]["gpus"][0]["compute_pct"].as_u64()), (Some(60), Some(30)));
    assert_eq!(compute_of(&sim, &id), 30);
    // Past the GPU's 10 blocks, or below one block: usage errors, nothing changed.
    sim.vgpu(&["update", "train", "--tflops", "11"]).assert().code(2);
    sim.vgpu(&["update", "train", "--tflops", "0"]).assert().code(2);
    assert_eq!(compute_of(&sim, &id), 30);
    kill(&sim, "train", train);
}

#[test]
fn update_tflops_raise_preempts_lower_priority_and_lowering_resumes_it() {
    let sim = ten_block_gpu();
    let (low, low_count) = counting(&sim, "low", &["--tflops", "5", "--priority", "10"]);
    let (train, _) = counting(&sim, "train", &["--tflops", "4", "--priority", "50"]);
    let (id, low_id) = (sim.row("train")["id"].as_str().unwrap().to_string(), sim.row("low")["id"].as_str().unwrap().to_string());

    let out = sim.vgpu(&["update", "train", "--tflops", "8"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("updated train ({id}): 4 → 8 TFLOPS (GPU 0 compute 40% → 80%); suspended low ({low_id}) to make room")
    );
    let row = sim.row("low");
    assert_eq!(
        (row["state"].as_str(), row["suspended_reason"].as_str(), row["suspended_by"]["id"].as_str()),
        (Some("suspended"), Some("preempted"), Some(id.as_str())),
        "{row}"
    );
    let frozen_at = low_count();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(low_count(), frozen_at, "the preempted workload kept running");
    assert_eq!(compute_of(&sim, &id), 80);

    let out = sim.vgpu(&["update", "train", "--tflops", "4"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("; resumed low ({low_id})")), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(sim.row("low")["state"], "running");
    keeps_counting("low to resume", &low_count);
    kill(&sim, "train", train);
    kill(&sim, "low", low);
}

#[test]
fn update_tflops_raise_against_higher_priority_is_refused_or_waits() {
    let sim = ten_block_gpu();
    let (train, _) = counting(&sim, "train", &["--tflops", "4", "--priority", "50"]);
    let (high, high_count) = counting(&sim, "high", &["--tflops", "6", "--priority", "90"]);
    let id = sim.row("train")["id"].as_str().unwrap().to_string();

    let before = snapshot(&sim);
    let out = sim.vgpu(&["update", "train", "--tflops", "6"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot raise train") && err.contains("high (") && err.contains("priority 90"), "{err}");
    assert_eq!(snapshot(&sim), before);
    assert_eq!(compute_of(&sim, &id), 40);
    assert_eq!(sim.row("high")["state"], "running");
    keeps_counting("high to keep running", &high_count);
    let out = sim.vgpu(&["update", "train", "--tflops", "6", "--wait=300ms"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("timed out"), "{}", stderr_of(&out));
    assert_eq!(snapshot(&sim), before);

    // With --wait: done once high exits.
    let bg = Background::start(&sim, "raise", &["update", "train", "--tflops", "6", "--wait"]);
    let err = bg.waiting();
    assert!(err.contains("2 more blocks, 0 free") && err.contains("high ("), "{err}");
    assert_eq!(compute_of(&sim, &id), 40);
    kill(&sim, "high", high);
    let (status, out, err) = bg.finish();
    assert!(status.success(), "{err}");
    assert_eq!(out.trim(), format!("updated train ({id}): 4 → 6 TFLOPS (GPU 0 compute 40% → 60%)"));
    assert_eq!(compute_of(&sim, &id), 60);
    kill(&sim, "train", train);
}

#[test]
fn update_tflops_lower_starts_a_waiting_workload() {
    let sim = ten_block_gpu();
    // Memory as asked, not in proportion to the blocks: lowering the blocks leaves it.
    let (holder, _) = counting(&sim, "holder", &["--tflops", "10", "--mem", "4G"]);
    let marker = sim.path("waiter-ran");
    let mut waiter = sim.spawn(&["run", "--tflops", "4", "--mem", "4G", "--wait", "--name", "waiter", "--", "touch", marker.to_str().unwrap()]);
    wait_for("the waiter to queue", || sim.ps().iter().any(|w| w["name"] == "waiter" && w["state"] == "waiting"));
    // A waiting workload's blocks cannot change yet.
    sim.vgpu(&["update", "waiter", "--tflops", "2"]).assert().code(2);
    let out = sim.vgpu(&["update", "holder", "--tflops", "6"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("10 → 6 TFLOPS (GPU 0 compute 100% → 60%); started waiter ("), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(waiter.wait().unwrap().success());
    assert!(marker.exists(), "the waiter ran in the blocks given back");
    kill(&sim, "holder", holder);
}

#[test]
fn update_tflops_on_a_workload_outside_the_pool_is_a_usage_error() {
    let sim = ten_block_gpu();
    let w = Driven::start(&sim, "plain", &["--gpu", "0", "--mem", "1G"]);
    let before = snapshot(&sim);
    let out = sim.vgpu(&["update", "plain", "--tflops", "4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("holds no compute pool blocks"), "{err}");
    assert_eq!(snapshot(&sim), before);
    sim.vgpu(&["update", "plain", "other", "--tflops", "4"]).assert().code(2);
    w.stop();
}
