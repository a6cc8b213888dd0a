//! Slurm job steps as workloads, and the node's Slurm configuration from vgpu's inventory.
//!
//! `spank_vgpu.so` (crate `vgpu-spank`), loaded into each node's slurmstepd, runs
//! `vgpu slurm step-begin` before the step's tasks start and `vgpu slurm step-end` after
//! they end. [`begin_step`] admits the step as any `vgpu run` workload (placement on the
//! GPUs Slurm gave the step, memory admission, the vGPU, its board slots, the record) with
//! two differences: its supervisor is the step's slurmstepd (when that dies, the next
//! reconcile tears the step's vGPU down as it does a dead `vgpu run`'s), and its tasks are
//! never moved into vgpu's cgroup: they stay where Slurm put them, and the shim, preloaded
//! through the environment the plugin sets, fences them. [`end_step`] tears it down.
//! [`conf`] is `vgpu slurm conf`: gres.conf lines and the `NodeName` line's `Gres=`.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context as _, Result};
use vgpu_abi::process::ProcessId;
use vgpu_cgroups::{Layout, Limits};
use vgpu_gpu::GpuInfo;
use vgpu_pool::Priority;
use vgpu_store::admission::MemSpec;
use vgpu_store::compute::ComputePolicy;
use vgpu_store::state::{SlurmStep, Store, SuspendedMemory, Workload, WorkloadState};

use crate::context::Context;
use crate::context::HostGpus;
use crate::launch::{self, Placement, Request};

/// What the plugin asks for one step on this node.
#[derive(Debug, Clone)]
pub struct StepAsk {
    pub step: SlurmStep,
    /// The step's user (`S_JOB_UID`).
    pub uid: u32,
    /// The step's slurmstepd: the workload's supervisor.
    pub stepd: u32,
    /// The GPUs Slurm gave the step on this node, by index (`SLURM_STEP_GPUS`).
    pub gpus: Vec<u32>,
    /// `--vgpu-mem`.
    pub mem: Option<MemSpec>,
    /// `--vgpu-compute`.
    pub compute_pct: Option<u32>,
    /// `--vgpu-compute-policy`.
    pub compute_policy: Option<ComputePolicy>,
    /// `--vgpu-freq-sensitivity`.
    pub freq_sensitivity: Option<f64>,
    /// The shards the step holds on this node (`SLURM_SHARDS_ON_NODE`).
    pub shards: Option<u32>,
    /// The `tflops` GRES the job holds per node (`--gres=tflops:N`: pool blocks).
    pub tflops_blocks: Option<u64>,
}

/// The share of its GPUs a step holding `blocks` pool blocks gets: the blocks over all the
/// blocks its GPUs are worth (the pool's inventory: `[pool]` overrides, else the TFLOPS
/// table), percent, rounded up, at least 1 and at most 100.
fn tflops_pct(ctx: &Context, gpus: &[GpuInfo], step_gpus: &[u32], blocks: u64) -> Result<u32> {
    let nvml: Vec<vgpu_pool::NvmlGpu> = gpus.iter().map(|g| vgpu_pool::NvmlGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone() }).collect();
    let inventory = vgpu_pool::Inventory::build(&nvml, &ctx.config.pool).map_err(|e| vgpu_store::error::UsageError::new(e.to_string()))?;
    let worth: u64 = inventory
        .devices
        .iter()
        .filter(|d| matches!(&d.origin, vgpu_pool::inventory::DeviceOrigin::Nvml { index, .. } if step_gpus.contains(index)))
        .map(|d| d.blocks)
        .sum();
    if worth == 0 {
        vgpu_store::usage!("the step's GPUs are worth no pool block: cannot size {blocks} TFLOPS blocks");
    }
    Ok(blocks_pct(blocks, worth))
}

/// `blocks` of `worth` blocks, percent: rounded up, at least 1, at most 100.
pub fn blocks_pct(blocks: u64, worth: u64) -> u32 {
    (blocks.saturating_mul(100).div_ceil(worth.max(1))).clamp(1, 100) as u32
}

/// The `tflops` GRES a job holds per node, from `scontrol -o show job`'s `TresPerNode`
/// (`gres:gpu:1,gres:tflops:156`, or `gres/tflops:…` forms); None: it asked for none.
pub fn tflops_of(show_job: &str) -> Option<u64> {
    let tres = show_job.split_whitespace().find_map(|kv| kv.strip_prefix("TresPerNode="))?;
    tres.split(',').find_map(|entry| {
        let entry = entry.trim_start_matches("gres:").trim_start_matches("gres/");
        let mut parts = entry.split(':');
        if parts.next()? != "tflops" {
            return None;
        }
        parts.next_back()?.parse().ok()
    })
}

/// The record's name for a step: `slurm-JOB.STEP`.
pub fn step_name(step: &SlurmStep) -> String {
    format!("slurm-{}.{}", step.job, step.step)
}

/// A step's slice from its shards: its share of each of its GPUs, percent (at least 1).
pub fn shard_pct(shards: u32, gpus: usize, shards_per_gpu: u32) -> u32 {
    let whole = u64::from(shards_per_gpu) * gpus.max(1) as u64;
    let pct = (u64::from(shards) * 100 / whole).clamp(1, 100);
    pct as u32
}

/// How the plugin changes a task's environment: a variable set, or a search list whose
/// head vgpu sets (the job's own value, if any, after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChange {
    Set(String, String),
    Prepend(String, String),
}

impl EnvChange {
    /// One line of `vgpu slurm step-begin`'s output, which the plugin reads.
    pub fn line(&self) -> String {
        match self {
            EnvChange::Set(k, v) => format!("set {k}={v}"),
            EnvChange::Prepend(k, v) => format!("prepend {k}={v}"),
        }
    }
}

/// How long a step's admission waits for the steps of jobs Slurm is suspending (for it) to
/// stop and have their memory moved to the host.
const SUSPENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Admit `request`, following Slurm's suspensions first. Slurm starts a preemptor's step as
/// soon as it has told the node to suspend the preempted job, whose tasks may still be
/// stopping (slurmstepd's SIGTSTP, then SIGSTOP two seconds later): when admission is
/// refused while a step of this node belongs to a job that slurmctld says is suspended
/// (`job_suspended`) and still holds its memory, wait (at most [`SUSPENDING_WAIT`]) for its
/// tasks to stop and its memory to go to the host, and try again.
fn admit_past_suspensions(ctx: &Context, store: &Store, layout: &Layout, host: &HostGpus, request: &Request, job_suspended: &dyn Fn(u32) -> bool) -> Result<launch::Launched> {
    let follow = || -> Result<bool> {
        let _lock = store.lock()?;
        let (workloads, _) = store.workloads();
        let notes = follow_suspensions(store, &workloads);
        for note in &notes {
            tracing::info!("{}", note.text);
        }
        Ok(notes.iter().any(|n| !n.warning))
    };
    follow()?;
    let deadline = std::time::Instant::now() + SUSPENDING_WAIT;
    loop {
        let refused = match launch::admit(ctx, store, layout, host, request) {
            Ok(launched) => return Ok(launched),
            Err(e) => e,
        };
        let (workloads, _) = store.workloads();
        let stopping: Vec<&Workload> =
            workloads.iter().filter(|w| w.state == WorkloadState::Running && w.slurm.as_ref().is_some_and(|s| job_suspended(s.job))).collect();
        if stopping.is_empty() || std::time::Instant::now() > deadline {
            return Err(refused);
        }
        tracing::info!("waiting for {} of a suspended job to stop before admitting this step", stopping.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(", "));
        while !follow()? {
            if std::time::Instant::now() > deadline {
                return Err(refused);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Admit the step and make its vGPU; returns its record and the environment its tasks get.
/// `job_suspended` says whether slurmctld holds a job suspended (asked only when admission
/// is refused while steps of other jobs run on this node).
pub fn begin_step(ctx: &Context, store: &Store, layout: &Layout, host: &HostGpus, shim: &Path, ask: &StepAsk, job_suspended: &dyn Fn(u32) -> bool) -> Result<(Workload, Vec<EnvChange>)> {
    let user = vgpu_store::identity::resolve(Some(&ask.uid.to_string()), None, &[]).context("the step's user")?;
    if ask.gpus.is_empty() {
        vgpu_store::usage!("the step holds no GPU on node {}: ask Slurm for one (--gres=gpu:N or --gres=shard:N) with --vgpu-* options", ask.step.node);
    }
    let from_blocks = match ask.tflops_blocks {
        Some(blocks) if blocks > 0 => Some(tflops_pct(ctx, &host.gpus, &ask.gpus, blocks)?),
        _ => None,
    };
    let (mem, compute_pct) = match (ask.shards, from_blocks) {
        (Some(shards), _) if shards > 0 => {
            let pct = shard_pct(shards, ask.gpus.len(), ctx.config.slurm.shards_per_gpu);
            (ask.mem.or(Some(MemSpec::Percent(f64::from(pct)))), ask.compute_pct.unwrap_or(pct))
        }
        (_, Some(pct)) => (ask.mem.or(Some(MemSpec::Percent(f64::from(pct)))), ask.compute_pct.unwrap_or(pct)),
        _ => (ask.mem, ask.compute_pct.unwrap_or(100)),
    };
    let request = Request {
        name: Some(step_name(&ask.step)),
        argv: vec![format!("slurm job {} step {} on {}", ask.step.job, ask.step.step, ask.step.node)],
        user,
        env: Vec::new(),
        cwd: None,
        limits: Limits::default(),
        priority: Priority::default(),
        compute_policy: ask.compute_policy,
        turn_max_us: None,
        freq_sensitivity: ask.freq_sensitivity,
        mem,
        mem_cap: None,
        oversubscribe: false,
        placement: Placement::Gpus { wanted: ask.gpus.iter().map(u32::to_string).collect(), count: None, compute_pct },
        service: None,
    };
    let stepd = vgpu_abi::process::start_time(ask.stepd)
        .map(|start_time| ProcessId { pid: ask.stepd, start_time })
        .with_context(|| format!("slurmstepd (pid {}) is not running", ask.stepd))?;
    let launched = admit_past_suspensions(ctx, store, layout, host, &request, job_suspended)?;
    let mut w = launched.workload;
    {
        let _lock = store.lock()?;
        let mut record = Workload::read(&store.workload_path(&w.id)).unwrap_or_else(|_| w.clone());
        record.supervisor = stepd.into();
        record.slurm = Some(ask.step.clone());
        if record.state == WorkloadState::Starting {
            record.state = WorkloadState::Running;
        }
        store.write_workload(&record)?;
        w = record;
    }
    crate::carbon::follow::replan_now(ctx, store, &crate::carbon::follow::Change::started(&w.id)).log();
    let env = step_env(ctx, store, shim, &w)?;
    Ok((w, env))
}

/// The variables a step's tasks get: the GPUs by UUID, the workload, the shim and, when
/// simulating, the simulated driver (its directory first on the library path, and its
/// `FAKEGPU_*` settings from vgpu's own environment, that is slurmd's).
pub fn step_env(ctx: &Context, store: &Store, shim: &Path, w: &Workload) -> Result<Vec<EnvChange>> {
    let uuids: Vec<&str> = w.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let mut env = vec![
        EnvChange::Set("CUDA_VISIBLE_DEVICES".into(), uuids.join(",")),
        EnvChange::Set("VGPU_WORKLOAD_ID".into(), w.id.clone()),
        EnvChange::Set("VGPU_WORKLOAD_NAME".into(), w.name.clone()),
        EnvChange::Set("VGPU_NUM_GPUS".into(), w.gpus.len().to_string()),
        EnvChange::Set("VGPU_DIR".into(), lossy(store.vgpu_dir(&w.vgpu).into_os_string())),
        EnvChange::Prepend("LD_PRELOAD".into(), lossy(shim.as_os_str().to_owned())),
    ];
    if let Some(dir) = ctx.driver_library_dir()? {
        env.push(EnvChange::Prepend("LD_LIBRARY_PATH".into(), lossy(dir.into_os_string())));
        for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("FAKEGPU_")) {
            env.push(EnvChange::Set(k, v));
        }
    }
    Ok(env)
}

fn lossy(s: OsString) -> String {
    s.to_string_lossy().into_owned()
}

/// The Slurm steps among `workloads` as (supervisor, cgroup name): whose processes are the
/// descendants of their slurmstepd (`Snapshot::adopt_descendants`).
pub fn step_supervisors(workloads: &[Workload]) -> Vec<(ProcessId, String)> {
    workloads.iter().filter(|w| w.slurm.is_some()).map(|w| (ProcessId::from(w.supervisor), w.cgroup.clone())).collect()
}

/// The record of `step` on this node, if vgpu holds one.
pub fn find_step(store: &Store, step: &SlurmStep) -> Option<Workload> {
    let (workloads, _) = store.workloads();
    workloads.into_iter().find(|w| w.slurm.as_ref() == Some(step))
}

/// Tear the step's vGPU down (nothing to do when vgpu holds none: the plugin began none,
/// or a reconcile already cleaned up after a dead slurmstepd). Returns the record removed.
pub fn end_step(ctx: &Context, store: &Store, layout: &Layout, step: &SlurmStep) -> Result<Option<Workload>> {
    let Some(w) = find_step(store, step) else {
        return Ok(None);
    };
    launch::finish(ctx, store, layout, &w, None).0?;
    launch::record_end(ctx, &w, &Ok(0), None);
    Ok(Some(w))
}

/// The reason in the record of a step whose tasks Slurm stopped (`scontrol suspend`,
/// `PreemptMode=SUSPEND`).
pub const SUSPENDED_BY_SLURM: &str = "suspended by Slurm";

/// Follow Slurm's suspensions of this node's steps (call it under the store lock): a
/// running step whose tasks are all stopped (slurmstepd sends SIGTSTP, then SIGSTOP, to
/// each) has its device memory moved to host memory through the checkpoint API
/// (`suspension::stopped`: vgpu sends no signal and changes no cgroup) and is recorded
/// suspended; a step so recorded whose tasks run again (Slurm's SIGCONT) has its memory put
/// back and is recorded running. Until then its tasks' CUDA calls wait in the driver (they
/// are locked): they never run without their memory. Returns what it did (and, as
/// warnings, what it could not). `workloads`: the records, read under that lock.
pub fn follow_suspensions(store: &Store, workloads: &[Workload]) -> Vec<crate::recovery::Note> {
    use crate::recovery::Note;
    use crate::suspension::stopped;
    let mut notes = Vec::new();
    for w in workloads.iter().filter(|w| w.slurm.is_some()) {
        let pids = vgpu_gpu::ancestry::descendants_of(ProcessId::from(w.supervisor));
        let by_slurm = w.state == WorkloadState::Suspended && w.suspended_reason.as_deref() == Some(SUSPENDED_BY_SLURM);
        let mut record = w.clone();
        if w.state == WorkloadState::Running && stopped::all_stopped(&pids) {
            let (memory, count) = stopped::checkpoint(&pids);
            let said = match &memory {
                SuspendedMemory::Host if count == 0 => "it has no CUDA context".to_string(),
                SuspendedMemory::Host => format!("its device memory is in host memory ({count} CUDA process{})", if count == 1 { "" } else { "es" }),
                SuspendedMemory::Device { why } => format!("its device memory stays on the GPU: {why}"),
            };
            record.set_suspended(SUSPENDED_BY_SLURM.into(), memory);
            if let Err(e) = store.write_workload(&record) {
                notes.push(Note::warn(format!("cannot record {} suspended: {e}", w.name)));
                continue;
            }
            notes.push(Note::did(format!("{} ({}) suspended by Slurm: {said}", w.name, w.id)));
        } else if by_slurm && !pids.is_empty() && !stopped::any_stopped(&pids) {
            if w.suspended_memory == Some(SuspendedMemory::Host) {
                if let Err(why) = stopped::restore(&pids) {
                    notes.push(Note::warn(format!(
                        "{} ({}) was resumed by Slurm, but its memory cannot go back on the GPU yet ({why}): its CUDA calls wait until it does",
                        w.name, w.id
                    )));
                    continue;
                }
            }
            record.set_resumed();
            if let Err(e) = store.write_workload(&record) {
                notes.push(Note::warn(format!("cannot record {} resumed: {e}", w.name)));
                continue;
            }
            notes.push(Note::did(format!("{} ({}) resumed by Slurm: its memory is back on the GPU", w.name, w.id)));
        }
    }
    notes
}

/// `vgpu slurm conf`: the node's gres.conf lines and its `NodeName` line's `Gres=`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmConf {
    pub gres_conf: Vec<String>,
    pub gres: String,
}

/// The Slurm GRES type of a GPU model: the lower-case words of its name without the
/// vendor's (`NVIDIA A100-SXM4-40GB` → `a100_sxm4_40gb`).
pub fn gpu_type(name: &str) -> String {
    let words: Vec<String> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .filter(|w| !matches!(w.as_str(), "nvidia" | "geforce" | "tesla"))
        .collect();
    if words.is_empty() {
        "gpu".into()
    } else {
        words.join("_")
    }
}

/// gres.conf and `Gres=` for node `node`: each GPU with its device file (`DEV_DIR/nvidiaN`)
/// and type, `shards_per_gpu` shards of each, and the pool's blocks per device kind as a
/// count-only `tflops` GRES (`tflops:gpu:N`), from the same inventory (`[pool]` overrides,
/// else the TFLOPS table) `vgpu pool` uses.
pub fn conf(node: &str, gpus: &[GpuInfo], pool: &vgpu_pool::config::PoolConfig, dev_dir: &Path, shards_per_gpu: u32) -> Result<SlurmConf, vgpu_pool::PoolError> {
    let nvml: Vec<vgpu_pool::inventory::NvmlGpu> =
        gpus.iter().map(|g| vgpu_pool::inventory::NvmlGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone() }).collect();
    let inventory = vgpu_pool::inventory::Inventory::build(&nvml, pool)?;
    let mut sorted: Vec<&GpuInfo> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    let mut lines = Vec::new();
    let mut types: Vec<(String, usize)> = Vec::new();
    for g in &sorted {
        let ty = gpu_type(&g.name);
        let file = dev_dir.join(format!("nvidia{}", g.index));
        lines.push(format!("NodeName={node} Name=gpu Type={ty} File={}", file.display()));
        match types.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => types.push((ty, 1)),
        }
    }
    if !sorted.is_empty() {
        for g in &sorted {
            let file = dev_dir.join(format!("nvidia{}", g.index));
            lines.push(format!("NodeName={node} Name=shard Count={shards_per_gpu} File={}", file.display()));
        }
    }
    let mut gres: Vec<String> = types.iter().map(|(t, n)| format!("gpu:{t}:{n}")).collect();
    if !sorted.is_empty() {
        gres.push(format!("shard:{}", u64::from(shards_per_gpu) * sorted.len() as u64));
    }
    for kind in vgpu_pool::DeviceKind::ALL {
        let blocks: u64 = inventory.devices.iter().filter(|d| d.kind == kind).map(|d| d.blocks).sum();
        if blocks > 0 {
            lines.push(format!("NodeName={node} Name=tflops Type={} Count={blocks} Flags=CountOnly", kind.as_str()));
            gres.push(format!("tflops:{}:{blocks}", kind.as_str()));
        }
    }
    Ok(SlurmConf { gres_conf: lines, gres: gres.join(",") })
}

/// What differs between the `Gres=` vgpu declares and the one slurmctld has for the node
/// (`scontrol show node`'s `Gres=`, whose entries may carry a socket suffix such as
/// `(S:0)`): one line per difference; none when they agree.
pub fn gres_differences(declared: &str, running: &str) -> Vec<String> {
    let entries = |text: &str| -> Vec<String> {
        let mut v: Vec<String> = text
            .trim()
            .trim_start_matches("Gres=")
            .split(',')
            .map(|e| e.split('(').next().unwrap_or(e).trim().to_string())
            .filter(|e| !e.is_empty() && e != "(null)")
            .collect();
        v.sort();
        v
    };
    // A shard entry may be typed by slurmctld after its GPU (`shard:a100:8`): compare by
    // name and count.
    let key = |e: &str| -> String {
        let parts: Vec<&str> = e.split(':').collect();
        match parts.as_slice() {
            ["shard", _, count] => format!("shard:{count}"),
            _ => e.to_string(),
        }
    };
    let declared = entries(declared);
    let running = entries(running);
    let mut out = Vec::new();
    for d in &declared {
        if !running.iter().any(|r| key(r) == key(d)) {
            out.push(format!("vgpu declares {d}, slurmd does not have it"));
        }
    }
    for r in &running {
        if !declared.iter().any(|d| key(d) == key(r)) {
            out.push(format!("slurmd has {r}, which vgpu does not declare"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gres_are_compared_by_name_type_and_count() {
        let declared = "gpu:a100_sxm4_40gb:1,shard:8,tflops:gpu:312";
        assert!(gres_differences(declared, "gpu:a100_sxm4_40gb:1(S:0),shard:a100_sxm4_40gb:8(S:0),tflops:gpu:312").is_empty());
        assert_eq!(
            gres_differences(declared, "gpu:a100_sxm4_40gb:1,shard:a100_sxm4_40gb:4"),
            ["vgpu declares shard:8, slurmd does not have it", "vgpu declares tflops:gpu:312, slurmd does not have it", "slurmd has shard:a100_sxm4_40gb:4, which vgpu does not declare"]
        );
        assert_eq!(gres_differences("", "(null)"), Vec::<String>::new());
    }

    #[test]
    fn a_gpu_type_is_the_model_without_the_vendor() {
        assert_eq!(gpu_type("NVIDIA A100-SXM4-40GB"), "a100_sxm4_40gb");
        assert_eq!(gpu_type("NVIDIA GeForce RTX 3090"), "rtx_3090");
        assert_eq!(gpu_type("NVIDIA"), "gpu");
    }

    #[test]
    fn a_jobs_tflops_are_read_from_scontrol_and_sized_in_blocks() {
        assert_eq!(tflops_of("JobId=3 TresPerNode=gres:gpu:1,gres:tflops:156 Foo=bar"), Some(156));
        assert_eq!(tflops_of("JobId=3 TresPerNode=gres:tflops:gpu:78"), Some(78));
        assert_eq!(tflops_of("JobId=3 TresPerNode=gres:gpu:1"), None);
        assert_eq!(tflops_of("JobId=3"), None);
        assert_eq!(blocks_pct(156, 312), 50);
        assert_eq!(blocks_pct(1, 312), 1);
        assert_eq!(blocks_pct(157, 312), 51);
        assert_eq!(blocks_pct(1000, 312), 100);
    }

    #[test]
    fn shards_are_a_share_of_the_gpus() {
        assert_eq!(shard_pct(2, 1, 8), 25);
        assert_eq!(shard_pct(8, 1, 8), 100);
        assert_eq!(shard_pct(4, 2, 8), 25);
        assert_eq!(shard_pct(1, 1, 1000), 1);
        assert_eq!(shard_pct(20, 1, 8), 100);
    }
}
