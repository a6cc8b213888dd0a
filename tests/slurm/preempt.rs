//! Priority preemption is Slurm's (`preempt/partition_prio`): a job of a higher partition
//! takes a full node's GPU from a running fenced job, whose step Slurm ends and requeues
//! (`PreemptMode=REQUEUE`); the preempted step's vGPU is removed as the step ends, so the
//! preemptor's vGPU is admitted on the GPU it frees, and the requeued job runs again, fenced
//! again, on the other node. (Slurm 22.05's slurmd refuses, for a while, to launch a job id
//! it killed: "Job N already killed, do not launch batch job"; so the preemptor holds its
//! node until the requeued job runs elsewhere.)

use std::os::unix::fs::PermissionsExt;

use crate::slurm::cluster::Cluster;
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
