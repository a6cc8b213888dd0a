//! The node's view: `vgpu ps` lists a Slurm step as a workload, the node's `vgpu watch`
//! kills a task that bypasses the shim (the reason in the job's output), and a step whose
//! slurmstepd is killed leaves nothing once vgpu reconciles.

use std::os::unix::fs::PermissionsExt;

use crate::slurm::cluster::Cluster;
use crate::common::watch::Watch;
use crate::common::{wait_for, workload};

/// The watch every 200 ms, no metrics endpoint.
const FAST: &str = "[watch]\ninterval = \"200ms\"\ngrace = \"200ms\"\ncompute_window = \"1s\"\nlisten = \"\"\n";

fn two_nodes_fast() -> Cluster {
    Cluster::start(&[("n1", "NVIDIA A100-SXM4-40GB", "40GiB"), ("n2", "NVIDIA A100-SXM4-40GB", "40GiB")], FAST)
}

/// A directory the job's user may write its ready files in.
fn shared_dir(cluster: &Cluster) -> std::path::PathBuf {
    let dir = cluster.path("shared");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    dir
}

#[test]
fn ps_lists_the_step_and_the_watch_kills_a_task_that_bypasses_the_shim() {
    let cluster = two_nodes_fast();
    let n1 = cluster.node("n1");
    let mut watch = Watch::start(&n1.sim, &[]);
    let dir = shared_dir(&cluster);
    let bin = workload::workload_bin().display().to_string();
    let (fenced, bypass, go) = (dir.join("fenced"), dir.join("bypass"), dir.join("go"));
    // One fenced process holding 1 GiB; once the test has seen it in ps, one that unsets
    // LD_PRELOAD and takes 8 GiB of the 4 GiB vGPU's GPU. (The script ends the fenced one
    // once the other is gone: a process left behind holds the step's output open.)
    let script = format!(
        "{bin} idle 300 --alloc-mib 1024 --ready {f} & fenced=$!; while [ ! -e {g} ]; do sleep 0.05; done; env -u LD_PRELOAD {bin} idle 300 --alloc-mib 8192 --ready {b}; status=$?; kill $fenced; exit $status",
        f = fenced.display(),
        g = go.display(),
        b = bypass.display()
    );
    let mut srun = cluster.submit("srun", &["-w", "n1", "--gres=gpu:1", "--vgpu-mem=4G", "sh", "-c", &script]);
    srun.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let job = srun.spawn().expect("srun");
    wait_for("the fenced process to hold its memory", || fenced.exists());

    // ps on the node: the step, its job and user, its quota, its processes.
    let rows = n1.sim.ps();
    let row = rows.iter().find(|r| !r["slurm"].is_null()).unwrap_or_else(|| panic!("no Slurm step in ps: {rows:?}"));
    let job_id = row["slurm"]["job"].as_u64().expect("a job id");
    assert_eq!(row["slurm"]["step"], "0", "{row}");
    assert_eq!(row["slurm"]["node"], "n1", "{row}");
    assert_eq!(row["name"], format!("slurm-{job_id}.0"), "{row}");
    assert_eq!(row["user"], "nobody", "{row}");
    assert_eq!(row["gpus"][0]["memory_quota_bytes"], 4u64 << 30, "{row}");
    let pids: Vec<u64> = row["pids"].as_array().expect("pids").iter().filter_map(|p| p.as_u64()).collect();
    assert!(!pids.is_empty(), "the step's processes (below its slurmstepd): {row}");
    assert_eq!(cluster.field("job", &job_id.to_string(), "JobState").as_deref(), Some("RUNNING"));

    std::fs::write(&go, "").expect("go");
    wait_for("the bypassing process to hold its memory", || bypass.exists());
    watch.wait_line("the watch to kill the bypassing task", |l| l.contains("SIGKILL to pid") && l.contains(&format!("slurm-{job_id}.0")));
    let out = job.wait_with_output().expect("srun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the step's task was killed: {stderr}");
    let why: Vec<&str> = stderr.lines().filter(|l| l.contains("vgpu watch on n1: killed pid") && l.contains(&format!("of job {job_id} step 0: "))).collect();
    assert!(!why.is_empty(), "the job's output says why: {stderr}");
    assert!(why[0].contains("memory"), "{}", why[0]);
    for node in &cluster.nodes {
        wait_for(&format!("nothing of the job left on {}", node.name), || node.leftovers().is_empty());
    }
}

#[test]
fn a_step_whose_slurmstepd_is_killed_leaves_nothing_once_vgpu_reconciles() {
    let cluster = two_nodes_fast();
    let n2 = cluster.node("n2");
    let dir = shared_dir(&cluster);
    let ready = dir.join("ready");
    let bin = workload::workload_bin().display().to_string();
    let script = format!("{bin} idle 300 --alloc-mib 512 --ready {}", ready.display());
    let mut srun = cluster.submit("srun", &["-w", "n2", "--gres=gpu:1", "--vgpu-mem=2G", "--vgpu-freq-sensitivity=0.3", "sh", "-c", &script]);
    srun.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut job = srun.spawn().expect("srun");
    wait_for("the step's process to hold its memory", || ready.exists());
    let rows = n2.sim.ps();
    let row = rows.iter().find(|r| !r["slurm"].is_null()).unwrap_or_else(|| panic!("no Slurm step in ps: {rows:?}"));
    let id = row["id"].as_str().expect("id").to_string();
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(n2.sim.path(&format!("run/workloads/{id}.json"))).expect("record")).expect("json");
    // What the carbon planner plans with: the job's sensitivity to the clock.
    assert_eq!(record["freq_sensitivity"].as_f64(), Some(0.3), "{record}");
    let stepd = record["supervisor"]["pid"].as_u64().expect("supervisor") as i32;
    let comm = std::fs::read_to_string(format!("/proc/{stepd}/comm")).unwrap_or_default();
    assert!(comm.starts_with("slurmstepd"), "the supervisor is the step's slurmstepd: {comm}");
    // SAFETY: kill(2) with a pid and a signal number.
    assert_eq!(unsafe { libc::kill(stepd, libc::SIGKILL) }, 0);
    // Its exit callback never runs: the next vgpu command's reconcile removes the vGPU.
    wait_for("slurmstepd to be gone", || !std::path::Path::new(&format!("/proc/{stepd}")).exists() || std::fs::read_to_string(format!("/proc/{stepd}/stat")).is_ok_and(|s| s.contains(") Z ")));
    n2.sim.vgpu(&["ps"]).assert().success();
    assert_eq!(n2.leftovers(), Vec::<std::path::PathBuf>::new(), "nothing of the step left on n2");
    let _ = job.kill();
    let _ = job.wait();
}
