//! Priority preemption is Slurm's (`preempt/partition_prio`): a job of a higher partition
//! takes a full node's GPU from a running fenced job, whose step Slurm ends and requeues
//! (`PreemptMode=REQUEUE`); the preempted step's vGPU is removed as the step ends, so the
//! preemptor's vGPU is admitted on the GPU it frees, and the requeued job runs again, fenced
//! again, on the other node. (Slurm 22.05's slurmd refuses, for a while, to launch a job id
//! it killed: "Job N already killed, do not launch batch job"; so the preemptor holds its
//! node until the requeued job runs elsewhere.)

use std::os::unix::fs::PermissionsExt;

use crate::slurm::cluster::Cluster;
use crate::common::watch::Watch;
use crate::common::{wait_for, workload};

const PREEMPTION: &str = "PreemptType=preempt/partition_prio\n\
PreemptMode=REQUEUE\n\
PartitionName=low Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE\n\
PartitionName=high Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF\n";

#[test]
fn a_high_priority_job_preempts_a_fenced_one_which_runs_again_after() {
    let cluster = Cluster::start_with(&[("n1", "NVIDIA A100-SXM4-40GB", "40GiB"), ("n2", "NVIDIA A100-SXM4-40GB", "40GiB")], "", PREEMPTION);
    let dir = cluster.path("shared");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let ready = dir.join("low-ready");
    let bin = workload::workload_bin().display().to_string();
    // The low job: its batch step fenced at 30 GiB, holding 1 GiB until cancelled.
    let script = format!("{bin} idle 300 --alloc-mib 1024 --ready {}", ready.display());
    let out = cluster.run(cluster.submit(
        "sbatch",
        &["--parsable", "-p", "low", "--gres=gpu:1", "--vgpu-mem=30G", "-o", &dir.join("low-%j.out").display().to_string(), "--requeue", "--wrap", &script],
    ));
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let low = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for("the low job to hold its memory", || ready.exists());
    let first = cluster.field("job", &low, "NodeList").expect("the low job's node");
    let node = cluster.node(&first);
    let rows = node.sim.ps();
    assert!(rows.iter().any(|r| r["slurm"]["job"].as_u64().map(|j| j.to_string()) == Some(low.clone()) && r["slurm"]["step"] == "batch"), "{rows:?}");
    std::fs::remove_file(&ready).expect("rm");

    // The high job needs 30 GiB of the same GPU: only once the low job's vGPU is gone. It
    // holds the node until the low job runs again.
    let high_script = format!("echo \"$VGPU_WORKLOAD_NAME\"; while [ ! -e {} ]; do sleep 0.05; done", ready.display());
    let mut high = cluster.submit("srun", &["-p", "high", "-w", &first, "--gres=gpu:1", "--vgpu-mem=30G", "sh", "-c", &high_script]);
    high.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let high = high.spawn().expect("srun");

    // The low job was requeued: Slurm holds a requeued job back for two minutes (its
    // BeginTime); an admin's `scontrol update StartTime=now` lets it go at once.
    wait_for("the low job to be requeued", || cluster.field("job", &low, "JobState").as_deref() == Some("PENDING"));
    let out = cluster.run({
        let mut c = cluster.client("scontrol");
        c.args(["update", &format!("JobId={low}"), "StartTime=now"]);
        c
    });
    assert!(out.status.success(), "scontrol update: {}", String::from_utf8_lossy(&out.stderr));
    // It runs again, fenced again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ready.exists() {
        if std::time::Instant::now() > deadline {
            let output = std::fs::read_to_string(dir.join(format!("low-{low}.out"))).unwrap_or_default();
            panic!("the low job did not run again: {:?}\n{output}\n{}", cluster.show("job", &low), cluster.logs());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(cluster.field("job", &low, "JobState").as_deref(), Some("RUNNING"));
    let out = high.wait_with_output().expect("srun");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the high job ran fenced: {stdout}{stderr}\n{}", cluster.logs());
    assert!(stdout.trim().starts_with("slurm-") && !stdout.contains(&format!("slurm-{low}.")), "{stdout}");
    let second = cluster.field("job", &low, "NodeList").expect("the low job's node");
    assert_ne!(second, first, "requeued elsewhere");
    let restarts = cluster.field("job", &low, "Restarts").unwrap_or_default();
    assert_eq!(restarts, "1", "requeued once");
    let rows = cluster.node(&second).sim.ps();
    assert!(rows.iter().any(|r| r["slurm"]["job"].as_u64().map(|j| j.to_string()) == Some(low.clone())), "fenced again: {rows:?}");
    let out = cluster.run({
        let mut c = cluster.client("scancel");
        c.arg(&low);
        c
    });
    assert!(out.status.success());
    for node in &cluster.nodes {
        wait_for(&format!("nothing of the jobs left on {}", node.name), || node.leftovers().is_empty());
    }
}

/// Partition priority with suspension: Slurm stops a preempted job's tasks (slurmstepd:
/// SIGTSTP, SIGSTOP two seconds later; proctrack/linuxproc signals every process below it)
/// and continues them (SIGCONT) once the preemptor is done. The GPU's shards are the
/// GRES the jobs share (a suspended job keeps its GRES: preemption by suspension frees CPUs,
/// not GPUs), the preemptor takes both CPUs of the node.
const SUSPENSION: &str = "PreemptType=preempt/partition_prio\n\
PreemptMode=SUSPEND,GANG\n\
PartitionName=low Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=SUSPEND OverSubscribe=FORCE:1\n\
PartitionName=high Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF OverSubscribe=FORCE:1\n";

/// The watch every 200 ms, no metrics endpoint.
const FAST: &str = "[watch]\ninterval = \"200ms\"\ngrace = \"200ms\"\ncompute_window = \"1s\"\nlisten = \"\"\n";

const GIB: u64 = 1 << 30;

/// Device memory in use on the node's GPU, as the simulated NVML says.
fn used(node: &crate::slurm::cluster::Node) -> u64 {
    node.sim.json(&["devices", "--json"])["gpus"][0]["memory_used_bytes"].as_u64().expect("memory_used_bytes")
}

#[test]
fn a_suspended_jobs_memory_goes_to_the_host_for_the_preemptor_and_comes_back() {
    // The driver copies at 400 GB/s (not PCIe's 25): the moves take 0.1 s, not 1.3 s each.
    let cluster = Cluster::start_with_driver(&[("n1", &[("NVIDIA A100-SXM4-40GB", "40GiB")])], "checkpoint_gbps = 400\n", FAST, SUSPENSION);
    let n1 = cluster.node("n1");
    let mut watch = Watch::start(&n1.sim, &[]);
    let dir = cluster.path("shared");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let file = |name: &str| dir.join(name).display().to_string();
    let bin = workload::workload_bin().display().to_string();
    // The low job: half the GPU's shards, fenced at 30 GiB, holding 30 GiB of the 40 until
    // told to stop; then it frees them (a lost allocation fails it).
    let script = format!("{bin} idle 600 --alloc-mib 30720 --ready {} --stop {}", file("low-ready"), file("low-stop"));
    let out = cluster.run(cluster.submit("sbatch", &["--parsable", "-p", "low", "--gres=shard:4", "--vgpu-mem=30G", "-o", &file("low.out"), "--wrap", &script]));
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let low = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for("the low job to hold its memory", || dir.join("low-ready").exists());
    assert_eq!(used(n1), 30 * GIB);

    // The high job: the other half of the shards and both CPUs (so Slurm suspends the low
    // one), fenced at 30 GiB too, which only fits once the low job's memory left the GPU.
    let high_cmd = format!("{bin} idle 600 --alloc-mib 30720 --ready {} --stop {}", file("high-ready"), file("high-stop"));
    let mut high = cluster.submit("srun", &["-p", "high", "-c", "2", "--gres=shard:4", "--vgpu-mem=30G", "sh", "-c", &high_cmd]);
    high.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut high = high.spawn().expect("srun");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join("high-ready").exists() {
        if let Ok(Some(_)) = high.try_wait() {
            let out = high.wait_with_output().expect("srun");
            panic!("the high job ended before it held its memory: {}{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr), watch.drain().join("\n"));
        }
        assert!(std::time::Instant::now() < deadline, "the high job did not start: {:?}\n{}", cluster.show("job", &low), cluster.logs());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(cluster.field("job", &low, "JobState").as_deref(), Some("SUSPENDED"));
    let rows = n1.sim.ps();
    let low_row = rows.iter().find(|r| r["slurm"]["job"].as_u64().map(|j| j.to_string()) == Some(low.clone())).unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(
        (low_row["state"].as_str(), low_row["suspended_reason"].as_str(), low_row["suspended_memory"].as_str()),
        (Some("suspended"), Some("slurm"), Some("host")),
        "{low_row}"
    );
    assert_eq!(used(n1), 30 * GIB, "only the high job's memory is on the GPU");
    // Its tasks are as Slurm left them: stopped (vgpu let the driver's thread in them run
    // for the checkpoint, and stopped it again).
    let pids: Vec<u64> = low_row["pids"].as_array().expect("pids").iter().filter_map(|p| p.as_u64()).collect();
    assert!(!pids.is_empty(), "{low_row}");
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert_eq!(stat.rsplit(')').next().map(|r| r.trim_start().chars().next()), Some(Some('T')), "pid {pid} stopped: {stat}");
    }

    // The high job ends; Slurm resumes the low one, whose memory comes back before it runs
    // CUDA again, and which then frees its allocation, intact.
    std::fs::write(dir.join("high-stop"), "").expect("stop high");
    let out = high.wait_with_output().expect("srun");
    assert!(out.status.success(), "the high job: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let name = format!("slurm-{low}.batch (");
    watch.wait_line("the watch to put the low job's memory back", |l| l.contains(&name) && l.contains("resumed by Slurm"));
    assert_eq!(cluster.field("job", &low, "JobState").as_deref(), Some("RUNNING"));
    let row = n1.sim.ps().into_iter().find(|r| r["slurm"]["job"].as_u64().map(|j| j.to_string()) == Some(low.clone())).expect("the low step");
    assert_eq!((row["state"].as_str(), row["suspended_memory"].as_str()), (Some("running"), None), "{row}");
    assert_eq!(used(n1), 30 * GIB, "the low job's memory is back on the GPU");
    std::fs::write(dir.join("low-stop"), "").expect("stop low");
    wait_for("the low job to complete", || cluster.field("job", &low, "JobState").as_deref() == Some("COMPLETED"));
    let output = std::fs::read_to_string(dir.join("low.out")).unwrap_or_default();
    assert_eq!(cluster.field("job", &low, "ExitCode").as_deref(), Some("0:0"), "its allocation came back intact: {output}");
    wait_for("nothing of the jobs left on n1", || n1.leftovers().is_empty());
}
