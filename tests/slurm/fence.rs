//! The fence: `--vgpu-mem`, shards, bad values, a node without vgpu, clean-up, `slurm conf`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::slurm::cluster::Cluster;
use crate::common::wait_for;

const GIB: u64 = 1 << 30;

/// The CUDA client of the shim's tests (`crates/vgpu-shim/tests/c/probe.c`: `info` prints the
/// driver's free and total memory, `alloc N` cuMemAlloc's result), built once against the
/// real cuda.h and linked to `libcuda.so.1`, in a directory the job's user may read.
fn probe(cluster: &Cluster) -> PathBuf {
    static HEADERS: OnceLock<Vec<String>> = OnceLock::new();
    let headers = HEADERS.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fetch-headers.sh");
        let out = Command::new(script).output().expect("tests/fetch-headers.sh");
        assert!(out.status.success(), "fetch-headers.sh: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    });
    let out = cluster.path("probe");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../vgpu-shim/tests/c/probe.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-o"]).arg(&out).arg(src);
    for dir in headers {
        cc.arg("-I").arg(dir);
    }
    cc.arg("-L").arg(cluster.nodes[0].sim.path("run/simulate")).args(["-l:libcuda.so.1", "-ldl"]);
    crate::common::process::run_ok(&mut cc);
    out
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The value of `key=` in the probe's output (the first).
fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
}

/// Every `alloc=RC` result, in order.
fn allocs(out: &str) -> Vec<u64> {
    out.split_whitespace().filter_map(|w| w.strip_prefix("alloc=")).filter_map(|v| v.parse().ok()).collect()
}

/// The simulated driver of `node` for a step the plugin leaves alone (the node's driver, as
/// a real node has it installed): srun's `--export`.
fn driver_of(cluster: &Cluster, node: &str) -> String {
    let sim = &cluster.node(node).sim;
    format!(
        "ALL,LD_LIBRARY_PATH={},FAKEGPU_CONFIG={},FAKEGPU_STATE={}",
        sim.path("run/simulate").display(),
        sim.path("fakegpu.toml").display(),
        sim.path("fakegpu-state").display()
    )
}

/// Until nothing of any job is left on any node (records, vGPUs, board slots): the plugin
/// removes a step's vGPU from slurmstepd after the step's tasks ended, which may be just
/// after srun returned.
fn wait_clean(cluster: &Cluster) {
    for node in &cluster.nodes {
        wait_for(&format!("nothing of the jobs left on {}", node.name), || node.leftovers().is_empty());
    }
}

const CUDA_OOM: u64 = 2;

#[test]
fn vgpu_mem_fences_a_step_and_outside_the_device_is_whole() {
    let cluster = Cluster::two_nodes();
    let probe = probe(&cluster);
    let p = probe.to_str().unwrap();
    // 3 GiB fits in 4; 2 GiB more does not.
    let out = cluster.run(cluster.submit("srun", &["-w", "n1", "--gres=gpu:1", "--vgpu-mem=4G", p, "info", "alloc", &(3 * GIB).to_string(), "alloc", &(2 * GIB).to_string()]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "srun failed: {stdout}\n{stderr}\n{}", cluster.logs());
    assert_eq!(field(&stdout, "total"), 4 * GIB, "{stdout}");
    assert_eq!(allocs(&stdout), [0, CUDA_OOM], "3 GiB fits the quota, 2 GiB more is a clean out-of-memory: {stdout}");
    wait_clean(&cluster);

    // The same client on the other node without --vgpu-*: the whole 40 GiB device.
    let export = driver_of(&cluster, "n2");
    let out = cluster.run(cluster.submit("srun", &["-w", "n2", "--gres=gpu:1", &format!("--export={export}"), p, "info", "alloc", &(5 * GIB).to_string()]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "srun failed: {stdout}\n{stderr}");
    assert_eq!(field(&stdout, "total"), 40 * GIB, "{stdout}");
    assert_eq!(allocs(&stdout), [0], "{stdout}");
    wait_clean(&cluster);
}

#[test]
fn shard_jobs_are_fenced_with_the_plugin_and_not_without() {
    let cluster = Cluster::two_nodes();
    let probe = probe(&cluster);
    let p = probe.to_str().unwrap();
    let big = (30 * GIB).to_string();

    // Slurm alone: a job holding 4 of the GPU's 8 shards takes 30 of its 40 GiB.
    cluster.set_plugin(false);
    let export = driver_of(&cluster, "n1");
    let out = cluster.run(cluster.submit("srun", &["-w", "n1", "--gres=shard:4", &format!("--export={export}"), p, "info", "alloc", &big]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(field(&stdout, "total"), 40 * GIB, "{stdout}");
    assert_eq!(allocs(&stdout), [0], "without the plugin a shard job takes what it likes: {stdout}");

    // With the plugin, two such jobs side by side on the one GPU: half each (4 of 8 shards),
    // and neither can take more.
    cluster.set_plugin(true);
    let half = (20 * GIB).to_string();
    let fits = (19 * GIB).to_string();
    let jobs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            let mut cmd = cluster.submit("srun", &["-w", "n1", "--gres=shard:4", p, "info", "alloc", &big, "alloc", &fits, "alloc", &(2 * GIB).to_string()]);
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            cmd.spawn().expect("srun")
        })
        .collect();
    for job in jobs {
        let out = job.wait_with_output().expect("srun");
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert_eq!(field(&stdout, "total"), 20 * GIB, "4 of 8 shards: half the GPU: {stdout}");
        assert_eq!(allocs(&stdout), [CUDA_OOM, 0, CUDA_OOM], "{stdout} (expected {half} at most)");
    }
    wait_clean(&cluster);
}

#[test]
fn bad_values_fail_the_submission_with_one_line_and_start_nothing() {
    let cluster = Cluster::two_nodes();
    let marker = cluster.path("ran");
    let touch = format!("touch {}", marker.display());
    for (program, option, said) in [
        ("srun", "--vgpu-mem=lots", "vgpu: --vgpu-mem=lots: invalid size"),
        ("srun", "--vgpu-compute=0", "vgpu: --vgpu-compute=0: a percentage of each GPU's compute, 1 to 100"),
        ("srun", "--vgpu-compute-policy=loose", "vgpu: --vgpu-compute-policy=loose: strict or fair"),
        ("sbatch", "--vgpu-mem=150%", "vgpu: --vgpu-mem=150%: a percentage must be above 0 and at most 100"),
    ] {
        let args: Vec<&str> = match program {
            "sbatch" => vec!["--gres=gpu:1", option, "--wrap", &touch],
            _ => vec!["--gres=gpu:1", option, "sh", "-c", &touch],
        };
        let out = cluster.run(cluster.submit(program, &args));
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{program} {option} was accepted: {stdout}{stderr}");
        let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("vgpu:")).collect();
        assert_eq!(ours.len(), 1, "one line of vgpu's: {stderr}");
        assert!(ours[0].contains(said), "{program} {option}: {stderr}");
    }
    let jobs = cluster.run({
        let mut c = cluster.client("squeue");
        c.args(["-h", "-t", "all"]);
        c
    });
    assert_eq!(String::from_utf8_lossy(&jobs.stdout).trim(), "", "no job was queued");
    assert!(!marker.exists(), "nothing ran");
}

#[test]
fn a_node_without_vgpu_fails_the_step_rather_than_run_it_unfenced() {
    let cluster = Cluster::two_nodes();
    cluster.set_plugin_without_vgpu();
    let marker = cluster.path("ran");
    let out = cluster.run(cluster.submit("srun", &["-w", "n2", "--gres=gpu:1", "--vgpu-mem=1G", "sh", "-c", &format!("touch {}", marker.display())]));
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "the step ran: {stdout}{stderr}");
    assert!(!marker.exists(), "the task ran unfenced");
    // The job's output says why, once (its one task), and slurmd's log too.
    let why: Vec<&str> = stderr.lines().filter(|l| l.contains("vgpu: node n2 cannot run")).collect();
    assert_eq!(why.len(), 1, "{stderr}");
    assert!(why[0].ends_with("vgpu is not installed there; the step is not run unfenced"), "{stderr}");
    let log = std::fs::read_to_string(cluster.path("log/slurmd.n2.log")).unwrap_or_default();
    assert!(
        log.contains("vgpu: node n2 cannot run") && log.contains("vgpu is not installed there; the step is not run unfenced"),
        "slurmd's log says why: {log}\nsrun: {stderr}"
    );
}

#[test]
fn slurm_conf_is_what_slurmd_runs_with() {
    let cluster = Cluster::two_nodes();
    for node in &cluster.nodes {
        let gres = cluster.field("node", &node.name, "Gres").unwrap_or_default();
        assert_eq!(gres, "gpu:a100_sxm4_40gb:1,shard:a100_sxm4_40gb:8,tflops:gpu:312", "node {}", node.name);
        // What slurmd itself read from gres.conf (slurmd -G prints its GRES configuration).
        let out = cluster.run({
            let mut c = cluster.client("slurmd");
            c.args(["-G", "-N", &node.name, "-f"]).arg(cluster.path("slurm.conf"));
            c
        });
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(said.contains("Name=tflops Type=gpu Count=312"), "{said}");
        assert!(said.contains("Name=shard Type=a100_sxm4_40gb Count=8"), "{said}");
        assert!(said.contains(&format!("File={}", cluster.path(&format!("dev/{}/nvidia0", node.name)).display())), "{said}");
    }
    // vgpu doctor on a node compares its running slurmd's GRES with the declaration.
    let doctor = |node: &crate::slurm::cluster::Node| -> serde_json::Value {
        let out = node.sim.vgpu(&["doctor", "--json"]).env("SLURM_CONF", cluster.path("slurm.conf")).output().expect("vgpu doctor");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
        let name = format!("Slurm GRES of {}", node.name);
        report["checks"].as_array().expect("checks").iter().find(|c| c["name"] == name.as_str()).cloned().unwrap_or_else(|| panic!("no {name} check: {report}"))
    };
    let n1 = cluster.node("n1");
    let check = doctor(n1);
    assert_eq!(check["status"], "ok", "{check}");
    // A declaration that no longer matches (4 shards a GPU now; slurmd still has 8).
    n1.sim.write_vgpu_config("[slurm]\nshards_per_gpu = 4\n");
    let check = doctor(n1);
    assert_eq!(check["status"], "warn", "{check}");
    let detail = check["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("vgpu declares shard:4, slurmd does not have it") && detail.contains("slurmd has shard:a100_sxm4_40gb:8"), "{check}");
}

/// The virtualenv of the real PyPI clients (tests/fetch-pyclients.sh; installs once).
fn pyclients_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fetch-pyclients.sh");
        let out = Command::new("bash").arg(script).output().expect("tests/fetch-pyclients.sh");
        assert!(out.status.success(), "fetch-pyclients.sh (no skipping): {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

#[test]
fn a_pypi_client_in_a_fenced_step_sees_the_quota_and_a_clean_out_of_memory() {
    let cluster = Cluster::two_nodes();
    let python = pyclients_venv().join("bin/python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/cuda_bindings_alloc.py");
    // NVIDIA's cuda-bindings, unmodified: cuMemGetInfo, then cuMemAlloc by 256 MiB until
    // refused. As root: the virtualenv's Python may be one only root can run (pyenv's).
    let out = cluster.run(cluster.submit_as_root("srun", &["-w", "n2", "--gres=gpu:1", "--vgpu-mem=4G", python.to_str().unwrap(), script]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(field(&stdout, "total"), 4 * GIB, "{stdout}");
    assert!(stdout.contains("stopped=CUDA_ERROR_OUT_OF_MEMORY"), "{stdout}");
    let allocated = field(&stdout, "allocated");
    assert!(allocated > 4 * GIB - (256 << 20) && allocated <= 4 * GIB, "allocation stops at the quota: {stdout}");
    wait_clean(&cluster);
}

#[test]
fn a_tflops_job_gets_its_blocks_share_of_the_gpu() {
    let cluster = Cluster::two_nodes();
    let probe = probe(&cluster);
    let p = probe.to_str().unwrap();
    // The node's A100 is worth 312 one-TFLOPS blocks (vgpu slurm conf: tflops:gpu:312); 156
    // of them are half of it: half its memory and compute.
    let out = cluster.run(cluster.submit("srun", &["-w", "n1", "--gres=gpu:1,tflops:156", "sh", "-c", &format!("echo name=$VGPU_WORKLOAD_NAME; {p} info alloc {}", 21 * GIB)]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", cluster.logs());
    assert!(stdout.contains("name=slurm-"), "the step runs in a vGPU: {stdout}");
    assert_eq!(field(&stdout, "total"), 20 * GIB, "{stdout}");
    assert_eq!(allocs(&stdout), [CUDA_OOM], "{stdout}");
    // The same GPU asked without tflops: no vGPU (whole device, through the node's driver).
    let export = driver_of(&cluster, "n1");
    let out = cluster.run(cluster.submit("srun", &["-w", "n1", "--gres=gpu:1", &format!("--export={export}"), "sh", "-c", &format!("echo name=$VGPU_WORKLOAD_NAME; {p} info")]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("name=\n") || stdout.lines().any(|l| l == "name="), "no vGPU: {stdout}");
    assert_eq!(field(&stdout, "total"), 40 * GIB, "{stdout}");
    wait_clean(&cluster);
}
