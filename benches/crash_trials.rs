//! Random SIGKILL trials (issue #10): a random vgpu command (run, a preempting
//! run --tflops, suspend, resume, kill) is SIGKILLed at a random moment (a random delay or a
//! random stop point, VGPU_TEST_STOP_AT), then one `vgpu ps` reconciles, and the store, the
//! cgroups and the pool are checked for leaks. Needs root (cgroups) and the simulated driver.
//!
//!     cargo build --release --workspace && cargo bench --bench crash_trials [-- TRIALS [SEED]]
//!
//! Two background workloads live through the trials: `low` (pool blocks, priority 10: the
//! preemption victim) and `plain` (1 GiB); a trial that kills one starts it again (a quarter
//! of them are started to die at `exit:cgroup-removed` when they end). Leaks counted:
//! cgroups under vgpu/ no record names, frozen cgroups recorded as running (or thawed ones
//! recorded or pooled as suspended), records whose supervisor or processes are gone, vGPU
//! directories nobody owns, pool blocks held by no workload, intents left over.
//!
//! The `vgpu/` cgroup parent is the host's, shared with any other state directory (tests
//! running beside the trials): a cgroup counts as the trials' when this store named its id
//! (record, intent or vGPU directory) or when it carries the trials' memory limit (`TAG`);
//! a new empty cgroup that is neither is reported, and counted if it is still there, empty
//! and unrecorded at the end.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::FreezerState;

use vgpu_cgroups::Layout;
use vgpu_pool::AllocState;
use vgpu_store::state::Store;
use vgpu_store::state::WorkloadState;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

/// One of `items`, uniformly.
fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len() as u64) as usize]
}


/// The host memory limit of every workload the trials start: it tells their cgroups apart
/// from those of other state directories on the host.
const TAG: &str = "1111M";
const TAG_BYTES: u64 = 1111 << 20;

const STOP_RUN: &[&str] = &["run:cgroup-created", "run:recorded", "run:spawned", "exit:cgroup-removed"];
const STOP_PREEMPT: &[&str] = &["preempt:frozen", "preempt:saved", "run:cgroup-created", "run:recorded", "run:spawned", "exit:cgroup-removed"];
// A command's own steps come twice: the others fire only when its reconcile changes the pool.
const STOP_SUSPEND: &[&str] = &["suspend:frozen", "suspend:frozen", "preempt:frozen", "preempt:saved"];
const STOP_RESUME: &[&str] = &["resume:thawed", "resume:thawed", "preempt:frozen", "preempt:saved"];
const STOP_KILL: &[&str] = &["preempt:frozen", "preempt:saved"];


struct Host {
    dir: tempfile::TempDir,
    layout: Layout,
    store: Store,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::Builder::new().prefix("vgpu-crash-trials-").tempdir().expect("tempdir");
        std::fs::write(dir.path().join("fakegpu.toml"), "[[device]]\nname = \"NVIDIA L4\"\nmemory = \"24GiB\"\n").expect("write");
        std::fs::write(
            dir.path().join("vgpu.toml"),
            "[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\n",
        )
        .expect("write");
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        Host { layout: Layout::detect().expect("a cgroup filesystem"), store, dir }
    }

    fn command(&self, args: &[&str], stop_at: Option<&str>) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(args).env("VGPU_LOG", "vgpu=error").env_remove("VGPU_TEST_STOP_AT");
        let p = |rel: &str| self.dir.path().join(rel);
        for (k, v) in [
            ("FAKEGPU_CONFIG", p("fakegpu.toml")),
            ("FAKEGPU_STATE", p("fakegpu-state")),
            ("VGPU_STATE_DIR", p("run")),
            ("VGPU_LIB_DIR", p("lib")),
            ("VGPU_CONFIG", p("vgpu.toml")),
        ] {
            cmd.env(k, v);
        }
        if let Some(at) = stop_at {
            cmd.env("VGPU_TEST_STOP_AT", at);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    }

    fn ps(&self) {
        let status = self.command(&["ps", "--json"], None).status().expect("vgpu ps");
        assert!(status.success(), "vgpu ps failed after a trial");
    }

    fn cgroup_names(&self) -> BTreeSet<String> {
        Cgroup::list(&self.layout).unwrap_or_default().into_iter().collect()
    }

    fn cgroup_state(&self, name: &str) -> Option<(bool, bool)> {
        let cgroup = Cgroup::open(&self.layout, name).ok()?;
        let frozen = cgroup.state().ok()? != FreezerState::Thawed;
        let populated = !cgroup.pids().ok()?.is_empty();
        Some((frozen, populated))
    }

    /// Whether cgroup `name` carries the trials' memory limit.
    fn tagged(&self, name: &str) -> bool {
        let file = match (&self.layout.unified, self.layout.v1.get(&vgpu_cgroups::Controller::Memory)) {
            (_, Some(mount)) => mount.join("vgpu").join(name).join("memory.limit_in_bytes"),
            (Some(root), None) => root.join("vgpu").join(name).join("memory.max"),
            (None, None) => return false,
        };
        std::fs::read_to_string(file).ok().and_then(|t| t.trim().parse::<u64>().ok()) == Some(TAG_BYTES)
    }

    /// Ids the store knows of before reconcile: records, intents, vGPU directories.
    fn ids_in_store(&self) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        let names = |dir: PathBuf| -> Vec<String> {
            std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
        };
        for name in names(self.store.workloads_dir()) {
            if let Some(id) = name.strip_suffix(".json") {
                ids.insert(id.to_string());
            }
        }
        ids.extend(names(self.store.vgpus_dir()));
        for name in names(self.store.intents_dir()) {
            let Ok(text) = std::fs::read_to_string(self.store.intents_dir().join(&name)) else { continue };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
            ids.extend(v["workloads"].as_array().into_iter().flatten().filter_map(|w| w.as_str().map(str::to_owned)));
        }
        ids
    }
}

struct Background {
    name: &'static str,
    args: Vec<&'static str>,
    child: Option<Child>,
}

impl Background {
    /// Start it if it is not running (restarting after a trial killed it).
    fn ensure(&mut self, host: &Host, rng: &mut Rng) {
        if let Some(child) = &mut self.child {
            if matches!(child.try_wait(), Ok(None)) {
                return;
            }
        }
        // A quarter die at `exit:cgroup-removed` when they end (or wherever their own
        // reconcile tears a dead workload down): then they are started again.
        for _ in 0..5 {
            let crashy = rng.below(4) == 0;
            let mut args = self.args.clone();
            args.extend_from_slice(&["--name", self.name, "--", "sleep", "100000"]);
            let child = self.child.insert(host.command(&args, crashy.then_some("exit:cgroup-removed")).spawn().expect("spawn"));
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                let (workloads, _) = host.store.workloads();
                if workloads.iter().any(|w| w.name == self.name && w.pid.is_some()) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            host.ps();
        }
        panic!("background workload {} did not start", self.name);
    }

    /// After a trial: wait (boundedly) until it has either exited or still has its workload.
    fn settle(&mut self, host: &Host) {
        let Some(child) = &mut self.child else { return };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            let (workloads, _) = host.store.workloads();
            let populated = workloads.iter().find(|w| w.name == self.name).and_then(|w| host.cgroup_state(&w.cgroup)).is_some_and(|(_, p)| p);
            if populated {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn supervisor(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// Every leak found after reconcile, as one line each.
fn leaks(host: &Host, known_ids: &BTreeSet<String>, cgroups_before: &BTreeSet<String>, background: &[Background], unattributed: &mut Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    let (workloads, damaged) = host.store.workloads();
    out.extend(damaged.iter().map(|e| format!("damaged record: {e}")));
    let recorded: BTreeSet<&str> = workloads.iter().map(|w| w.cgroup.as_str()).collect();
    let supervisors: Vec<u32> = background.iter().filter_map(Background::supervisor).collect();
    for w in &workloads {
        if !w.supervisor_alive() || !supervisors.contains(&w.supervisor.pid) {
            out.push(format!("record {} ({}) of a command that is gone", w.name, w.id));
            continue;
        }
        let Some((frozen, populated)) = host.cgroup_state(&w.cgroup) else {
            out.push(format!("record {} ({}) without a cgroup", w.name, w.id));
            continue;
        };
        if !populated {
            out.push(format!("record {} ({}) without a process", w.name, w.id));
        }
        match (frozen, w.state) {
            (true, WorkloadState::Suspended) | (false, WorkloadState::Running | WorkloadState::Starting) => {}
            (true, s) => out.push(format!("{} ({}) frozen but recorded {s:?}", w.name, w.id)),
            (false, s) => out.push(format!("{} ({}) runs but recorded {s:?}", w.name, w.id)),
        }
    }
    // Cgroups: of an id this store knew, or new since the trial began, with no record.
    for name in host.cgroup_names() {
        if recorded.contains(name.as_str()) {
            continue;
        }
        let new_and_empty = !cgroups_before.contains(&name) && host.cgroup_state(&name).is_some_and(|(_, populated)| !populated);
        if known_ids.contains(&name) {
            out.push(format!("cgroup vgpu/{name} with no record (an id of this store)"));
        } else if new_and_empty && host.tagged(&name) {
            out.push(format!("cgroup vgpu/{name} with no record (made by a trial: its memory limit is the trials' tag)"));
        } else if new_and_empty {
            // Not named anywhere in this store and not tagged: another state directory's
            // (tests running beside the trials share the vgpu/ cgroup parent), or one
            // made by a trial killed before it set limits. Reported, checked again at the end.
            unattributed.push(name);
        }
    }
    for entry in std::fs::read_dir(host.store.vgpus_dir()).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !workloads.iter().any(|w| w.vgpu == name) {
            out.push(format!("vGPU directory {name} owned by no workload"));
        }
    }
    match vgpu_host::pool_effects::load(&host.store) {
        Ok(Some(pool)) => {
            for a in pool.allocations() {
                let Some(w) = workloads.iter().find(|w| w.id == a.id) else {
                    out.push(format!("pool blocks of {} ({}) held by no workload", a.name, a.id));
                    continue;
                };
                let frozen = host.cgroup_state(&w.cgroup).is_some_and(|(f, _)| f);
                if a.state == AllocState::Suspended && !frozen {
                    out.push(format!("{} runs while the pool holds it suspended (its blocks are someone else's)", w.name));
                }
            }
        }
        Ok(None) => {}
        Err(e) => out.push(format!("pool state unreadable: {e:#}")),
    }
    for entry in std::fs::read_dir(host.store.intents_dir()).into_iter().flatten().flatten() {
        out.push(format!("intent {} left over", entry.file_name().to_string_lossy()));
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let trials: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(150);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    });
    let mut rng = Rng(seed);
    let host = Host::new();
    let mut background = vec![
        Background { name: "low", args: vec!["run", "--tflops", "8", "--kind", "npu", "--priority", "10"], child: None },
        Background { name: "plain", args: vec!["run", "--mem", "1G"], child: None },
    ];
    let started = Instant::now();
    let mut unattributed: Vec<String> = Vec::new();
    let (mut leaked_trials, mut leaks_found) = (0u32, 0usize);
    let (mut at_stop_points, mut at_random_moments, mut completed) = (0u32, 0u32, 0u32);
    // A trial counts once its command was SIGKILLed; those that finished first are tried
    // (and checked) too.
    let mut trial = 0u32;
    while at_stop_points + at_random_moments < trials && trial < trials * 4 {
        trial += 1;
        for b in &mut background {
            b.ensure(&host, &mut rng);
        }
        let target = pick(&mut rng, &["low", "plain"]);
        // (what, argv, its stop points, how long it takes at most, roughly, in ms)
        let (what, args, stops, lasts): (&str, Vec<&str>, &[&str], u64) = match rng.below(5) {
            0 => ("run", vec!["run", "--mem", "1G", "--memory", TAG, "--", "sleep", "0.2"], STOP_RUN, 400),
            1 => ("run --tflops (preempting)", vec!["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--memory", TAG, "--", "sleep", "0.2"], STOP_PREEMPT, 400),
            2 => ("suspend", vec!["suspend", target], STOP_SUSPEND, 40),
            3 => ("resume", vec!["resume", target], STOP_RESUME, 40),
            _ => ("kill", vec!["kill", "--signal", "KILL", target], STOP_KILL, 40),
        };
        let stop_at = (rng.below(2) == 0).then(|| pick(&mut rng, stops));
        let delay = Duration::from_micros(rng.below(lasts * 1000));
        let cgroups_before = host.cgroup_names();
        let mut child = host.command(&args, stop_at).spawn().expect("spawn");
        let deadline = Instant::now() + delay;
        if stop_at.is_none() {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = child.kill();
        }
        let status = child.wait().expect("wait");
        if std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL) {
            match stop_at {
                Some(_) => at_stop_points += 1,
                None => at_random_moments += 1,
            }
        } else {
            completed += 1;
        }
        for b in &mut background {
            b.settle(&host);
        }
        let known = host.ids_in_store();
        host.ps();
        let found = leaks(&host, &known, &cgroups_before, &background, &mut unattributed);
        if !found.is_empty() {
            leaked_trials += 1;
            leaks_found += found.len();
            let how = stop_at.map(|s| format!("at {s}")).unwrap_or_else(|| format!("after {delay:?}"));
            for line in &found {
                println!("trial {trial}: {what} killed {how}: LEAK {line}");
            }
        }
    }
    for b in &mut background {
        let _ = host.command(&["kill", "--signal", "KILL", b.name], None).status();
        if let Some(mut child) = b.child.take() {
            let _ = child.wait();
        }
    }
    host.ps();
    // Unattributed new empty cgroups: one still there, empty and unrecorded at the end is
    // counted as a leak; those gone were another state directory's, passing by.
    let now = host.cgroup_names();
    let records = host.store.workloads().0;
    unattributed.sort();
    unattributed.dedup();
    let stayed: Vec<&String> = unattributed
        .iter()
        .filter(|n| now.contains(*n) && !records.iter().any(|w| &w.cgroup == *n) && host.cgroup_state(n).is_some_and(|(_, p)| !p))
        .collect();
    for name in &stayed {
        println!("LEAK? cgroup vgpu/{name}: new during a trial, empty, unrecorded and still there (not attributable to this store)");
    }
    leaks_found += stayed.len();
    println!(
        "{} new empty cgroups not attributable to this store were seen during trials; {} of them were still there at the end",
        unattributed.len(),
        stayed.len()
    );
    println!(
        "crash trials: {} SIGKILLed ({at_stop_points} at a stop point, {at_random_moments} at a random moment; {completed} more finished first; seed {seed}), {:.1} s; leaks found: {leaks_found} (in {leaked_trials} trials)",
        at_stop_points + at_random_moments,
        started.elapsed().as_secs_f64()
    );
}
